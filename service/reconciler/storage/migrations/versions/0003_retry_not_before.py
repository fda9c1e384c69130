"""remember the provider's Retry-After as a moment on the operation

A Retry-After is a minimum for every follow-up status request, including the
ones a webhook hint or a cancel brings forward; those paths only see the row.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from reconciler.storage.types import UTCDateTime

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("operations") as batch:
        batch.add_column(sa.Column("retry_not_before", UTCDateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("operations") as batch:
        batch.drop_column("retry_not_before")
