"""step_failures: the unforeseen failures of an operation's step, counted durably

A step that fails in a way nothing foresaw is retried with backoff a few times, then
escalates ``internal_error``; the count survives restarts (``core.step_retry``).
``failed_step`` names the step the count is for: a failure of another step starts it
again. Existing rows start at 0.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("operations") as batch:
        batch.add_column(
            sa.Column("step_failures", sa.Integer(), nullable=False, server_default="0")
        )
        batch.add_column(sa.Column("failed_step", sa.String(length=40), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("operations") as batch:
        batch.drop_column("failed_step")
        batch.drop_column("step_failures")
