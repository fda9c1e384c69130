"""traceparent: the W3C trace context each operation's spans descend from

The agent's request starts the operation's trace; its context is kept with the
operation so that spans made later, by any replica and after restarts, join the
same trace. Existing rows have none: their spans share a trace derived from
their trace id.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("operations") as batch:
        batch.add_column(sa.Column("traceparent", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("operations") as batch:
        batch.drop_column("traceparent")
