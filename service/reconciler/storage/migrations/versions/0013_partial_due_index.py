"""partial due index: ix_operations_due holds only operations with something due

``next_poll_at`` is NULL once nothing is due (a finished operation, one waiting on a
decision), but a plain index keeps an entry for every row, NULL or not: at the
retention window's end nearly all of its entries were finished operations no claim
reads. Every query on ``next_poll_at`` compares it (``<=``, ``<``, ``>``), which
implies ``IS NOT NULL``, so SQLite and PostgreSQL both use the partial index for
them.

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_operations_due", table_name="operations")
    op.create_index(
        "ix_operations_due",
        "operations",
        ["next_poll_at"],
        sqlite_where=sa.text("next_poll_at IS NOT NULL"),
        postgresql_where=sa.text("next_poll_at IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_operations_due", table_name="operations")
    op.create_index("ix_operations_due", "operations", ["next_poll_at"])
