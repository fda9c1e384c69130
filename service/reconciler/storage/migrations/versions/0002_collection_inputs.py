"""keep the confirming status body and count result fetch attempts

Result collection is its own recorded action: it needs the status answer
that confirmed success (result reference, checksum, size, summary) and its
own attempt counter, separate from the status-request budget.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("operations") as batch:
        batch.add_column(sa.Column("status_body", sa.JSON(), nullable=True))
        batch.add_column(
            sa.Column("result_attempts", sa.Integer(), nullable=False, server_default="0")
        )


def downgrade() -> None:
    with op.batch_alter_table("operations") as batch:
        batch.drop_column("result_attempts")
        batch.drop_column("status_body")
