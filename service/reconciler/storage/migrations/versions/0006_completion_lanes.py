"""completion lanes: the share a completion's next step runs in (hooks, or a callback host)

The worker's claim leaves out callback hosts whose share of delivery slots is
full, so one hanging receiver holds only its own slots. Existing rows have no
lane: they are claimed as hooks, and the completion handler moves each to its
callback host's lane before it delivers.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("operations") as batch:
        batch.add_column(sa.Column("completion_lane", sa.String(length=300), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("operations") as batch:
        batch.drop_column("completion_lane")
