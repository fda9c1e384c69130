"""retention: tombstones, the retention log, maintenance leases and the finished index

Finished operations are pruned after a window (``[retention]``). A pruned operation
leaves a tombstone (caller, digest of its idempotency key, request fingerprint) so a
late retry is answered ``410`` instead of starting a second job; each prune appends a
keyed, chained record to ``retention_log`` that ``audit verify`` checks; the sweep runs
on one replica at a time under a row of ``maintenance_leases``. The sweep walks
finished rows oldest first through a partial index on ``done_at``, and deletes
verdicts by operation through an index of their own.

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from reconciler.storage.types import UTCDateTime

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tombstones",
        sa.Column("operation_id", sa.String(length=40), primary_key=True),
        sa.Column("caller", sa.String(length=100), nullable=False),
        sa.Column("key_digest", sa.String(length=64), nullable=True),
        sa.Column("request_fingerprint", sa.String(length=80), nullable=False),
        sa.Column("provider", sa.String(length=100), nullable=False),
        sa.Column("state", sa.String(length=40), nullable=False),
        sa.Column("done_at", UTCDateTime(), nullable=False),
        sa.Column("pruned_at", UTCDateTime(), nullable=False),
    )
    op.create_index("ix_tombstones_caller_key", "tombstones", ["caller", "key_digest"])
    op.create_index("ix_tombstones_pruned", "tombstones", ["pruned_at"])
    op.create_table(
        "retention_log",
        sa.Column("seq", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("at", UTCDateTime(), nullable=False),
        sa.Column("actor", sa.String(length=120), nullable=False),
        sa.Column("cutoff", UTCDateTime(), nullable=False),
        sa.Column("operations", sa.Integer(), nullable=False),
        sa.Column("history_entries", sa.Integer(), nullable=False),
        sa.Column("done_from", UTCDateTime(), nullable=False),
        sa.Column("done_until", UTCDateTime(), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("prev_hash", sa.String(length=128), nullable=False),
        sa.Column("hash", sa.String(length=128), nullable=False),
    )
    op.create_table(
        "maintenance_leases",
        sa.Column("name", sa.String(length=40), primary_key=True),
        sa.Column("owner", sa.String(length=120), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
    )
    op.create_index("ix_webhook_verdicts_operation", "webhook_verdicts", ["operation_id"])
    op.create_index(
        "ix_operations_finished",
        "operations",
        ["done_at"],
        sqlite_where=sa.text("done_at IS NOT NULL"),
        postgresql_where=sa.text("done_at IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_operations_finished", table_name="operations")
    op.drop_index("ix_webhook_verdicts_operation", table_name="webhook_verdicts")
    op.drop_table("maintenance_leases")
    op.drop_table("retention_log")
    op.drop_index("ix_tombstones_pruned", table_name="tombstones")
    op.drop_index("ix_tombstones_caller_key", table_name="tombstones")
    op.drop_table("tombstones")
