"""bounded webhook events: each keeps its type, its size and at most 4 KiB of its body

A provider whose webhooks cover a whole account sends events no operation waits for
(orphans, and types the provider file does not list) in normal operation; kept
whole, they grew the database without bound. An event now keeps its id, type, job
id, body digest, the size of its body and at most 4 KiB of it
(``storage.webhook_events``). An ignored event keeps its job id too, flagged so that
it neither hints nor attaches when the job is learned. Existing rows keep their
bodies; they are not ignored.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("webhook_events") as batch:
        batch.add_column(sa.Column("event_type", sa.String(length=200), nullable=True))
        batch.add_column(sa.Column("body_size", sa.Integer(), nullable=True))
        batch.add_column(
            sa.Column("ignored", sa.Boolean(), nullable=False, server_default=sa.false())
        )


def downgrade() -> None:
    with op.batch_alter_table("webhook_events") as batch:
        batch.drop_column("ignored")
        batch.drop_column("body_size")
        batch.drop_column("event_type")
