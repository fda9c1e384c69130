"""webhook trust: per-provider health, the verdict of every completion, stretched waits

Health is durable and shared by replicas; each completion's verdict (webhook-first,
pending within the grace, late, miss) is the evidence it is computed from. The
partial index finds the operations on a stretched schedule when trust is withdrawn;
the webhook index answers "last verified webhook" per provider.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from reconciler.storage.types import UTCDateTime

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

STRETCHED = "delay_source = 'webhook_trust'"


def upgrade() -> None:
    op.create_table(
        "provider_health",
        sa.Column("provider", sa.String(length=100), primary_key=True),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("streak", sa.Integer(), nullable=False),
        sa.Column("misses", sa.Integer(), nullable=False),
        sa.Column("webhook_first", sa.Integer(), nullable=False),
        sa.Column("late", sa.Integer(), nullable=False),
        sa.Column("missed", sa.Integer(), nullable=False),
        sa.Column("changed_at", UTCDateTime(), nullable=True),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.Column("last_miss_operation", sa.String(length=40), nullable=True),
        sa.Column("version", sa.Integer(), nullable=False),
    )
    op.create_table(
        "webhook_verdicts",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "operation_id", sa.String(length=40), sa.ForeignKey("operations.id"), nullable=False
        ),
        sa.Column("provider", sa.String(length=100), nullable=False),
        sa.Column("remote_job_id", sa.String(length=300), nullable=True),
        sa.Column("verdict", sa.String(length=20), nullable=False),
        sa.Column("asked_at", UTCDateTime(), nullable=False),
        sa.Column("seen_at", UTCDateTime(), nullable=False),
        sa.Column("hinted_at", UTCDateTime(), nullable=True),
        sa.Column("settle_after", UTCDateTime(), nullable=True),
        sa.Column("judged_at", UTCDateTime(), nullable=True),
    )
    op.create_index("ix_webhook_verdicts_due", "webhook_verdicts", ["verdict", "settle_after"])
    with op.batch_alter_table("operations") as batch:
        batch.add_column(sa.Column("hint_not_before", UTCDateTime(), nullable=True))
    op.create_index(
        "ix_operations_stretched",
        "operations",
        ["provider"],
        sqlite_where=sa.text(STRETCHED),
        postgresql_where=sa.text(STRETCHED),
    )
    op.create_index(
        "ix_webhook_events_provider_received", "webhook_events", ["provider", "received_at"]
    )


def downgrade() -> None:
    op.drop_index("ix_webhook_events_provider_received", table_name="webhook_events")
    op.drop_index("ix_operations_stretched", table_name="operations")
    with op.batch_alter_table("operations") as batch:
        batch.drop_column("hint_not_before")
    op.drop_index("ix_webhook_verdicts_due", table_name="webhook_verdicts")
    op.drop_table("webhook_verdicts")
    op.drop_table("provider_health")
