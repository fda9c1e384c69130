"""cancel_refusal: the provider's refusal of the last cancel sent

A cancel the provider refused (a definitive 4xx, or the answer ``[cancel] refused``
names) is not a sent cancel: the operation goes on running and its answer says the
provider refused the cancel and why. The refusal (HTTP status, the provider's words,
when) is kept on the row for that answer. Existing rows have none.

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("operations") as batch:
        batch.add_column(sa.Column("cancel_refusal", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("operations") as batch:
        batch.drop_column("cancel_refusal")
