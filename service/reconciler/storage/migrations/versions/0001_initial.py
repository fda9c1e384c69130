"""operations, history, tokens, webhook events, escalations, completion steps

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from reconciler.storage.types import UTCDateTime

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("scope", sa.String(length=20), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("revoked_at", UTCDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name"),
        sa.UniqueConstraint("token_hash"),
    )
    op.create_table(
        "operations",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("provider", sa.String(length=100), nullable=False),
        sa.Column("caller", sa.String(length=100), nullable=False),
        sa.Column("request", sa.JSON(), nullable=False),
        sa.Column("request_fingerprint", sa.String(length=80), nullable=False),
        sa.Column("idempotency_key", sa.String(length=200), nullable=True),
        sa.Column("idempotency_token", sa.String(length=80), nullable=False),
        sa.Column("trace_id", sa.String(length=80), nullable=False),
        sa.Column("callback_url", sa.String(length=2048), nullable=True),
        sa.Column("meta", sa.JSON(), nullable=True),
        sa.Column("state", sa.String(length=40), nullable=False),
        sa.Column("remote_job_id", sa.String(length=300), nullable=True),
        sa.Column("remote_state", sa.String(length=200), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.Column("accepted_at", UTCDateTime(), nullable=True),
        sa.Column("create_deadline_at", UTCDateTime(), nullable=False),
        sa.Column("deadline_at", UTCDateTime(), nullable=False),
        sa.Column("done_at", UTCDateTime(), nullable=True),
        sa.Column("create_attempts", sa.Integer(), nullable=False),
        sa.Column("max_status_requests", sa.Integer(), nullable=False),
        sa.Column("status_requests_used", sa.Integer(), nullable=False),
        sa.Column("max_transport_failures", sa.Integer(), nullable=False),
        sa.Column("transport_failures_used", sa.Integer(), nullable=False),
        sa.Column("rate_limited_count", sa.Integer(), nullable=False),
        sa.Column("poll_attempt", sa.Integer(), nullable=False),
        sa.Column("next_poll_at", UTCDateTime(), nullable=True),
        sa.Column("delay_source", sa.String(length=40), nullable=True),
        sa.Column("hinted_at", UTCDateTime(), nullable=True),
        sa.Column("lease_owner", sa.String(length=120), nullable=True),
        sa.Column("lease_expires_at", UTCDateTime(), nullable=True),
        sa.Column("last_http_status", sa.Integer(), nullable=True),
        sa.Column("last_http_at", UTCDateTime(), nullable=True),
        sa.Column("last_provider_request_id", sa.String(length=200), nullable=True),
        sa.Column("poll_after_seconds", sa.Float(), nullable=True),
        sa.Column("provider_expires_at", UTCDateTime(), nullable=True),
        sa.Column("progress", sa.JSON(), nullable=True),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("error", sa.JSON(), nullable=True),
        sa.Column("cancel_requested_at", UTCDateTime(), nullable=True),
        sa.Column("cancel_requested_by", sa.String(length=100), nullable=True),
        sa.Column("cancel_reason", sa.String(length=500), nullable=True),
        sa.Column("cancel_sent_at", UTCDateTime(), nullable=True),
        sa.Column("cancel_deadline_at", UTCDateTime(), nullable=True),
        sa.Column("escalation_id", sa.Integer(), nullable=True),
        sa.Column("completion_round", sa.Integer(), nullable=False),
        sa.Column("completion_pending", sa.Boolean(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("history_seq", sa.Integer(), nullable=False),
        sa.Column("history_head", sa.String(length=128), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("caller", "idempotency_key", name="uq_operations_caller_key"),
        sa.UniqueConstraint("idempotency_token", name="uq_operations_idempotency_token"),
    )
    with op.batch_alter_table("operations", schema=None) as batch_op:
        batch_op.create_index("ix_operations_caller_id", ["caller", "id"], unique=False)
        batch_op.create_index("ix_operations_due", ["next_poll_at"], unique=False)
        batch_op.create_index(
            "ix_operations_remote_job", ["provider", "remote_job_id"], unique=False
        )
        batch_op.create_index("ix_operations_state_id", ["state", "id"], unique=False)

    op.create_table(
        "webhook_events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("provider", sa.String(length=100), nullable=False),
        sa.Column("event_id", sa.String(length=300), nullable=False),
        sa.Column("received_at", UTCDateTime(), nullable=False),
        sa.Column("remote_job_id", sa.String(length=300), nullable=True),
        sa.Column("operation_id", sa.String(length=40), nullable=True),
        sa.Column("body_sha256", sa.String(length=64), nullable=False),
        sa.Column("body", sa.String(), nullable=True),
        sa.Column("duplicates", sa.Integer(), nullable=False),
        sa.Column("conflicts", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("provider", "event_id", name="uq_webhook_events_provider_event"),
    )
    with op.batch_alter_table("webhook_events", schema=None) as batch_op:
        batch_op.create_index(
            "ix_webhook_events_orphans", ["provider", "remote_job_id"], unique=False
        )

    op.create_table(
        "completion_steps",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("operation_id", sa.String(length=40), nullable=False),
        sa.Column("round", sa.Integer(), nullable=False),
        sa.Column("step", sa.String(length=300), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("idempotency_key", sa.String(length=120), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("started_at", UTCDateTime(), nullable=True),
        sa.Column("finished_at", UTCDateTime(), nullable=True),
        sa.Column("next_attempt_at", UTCDateTime(), nullable=True),
        sa.Column("last_error", sa.String(), nullable=True),
        sa.ForeignKeyConstraint(
            ["operation_id"],
            ["operations.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("operation_id", "round", "step", name="uq_completion_steps"),
    )
    op.create_table(
        "escalations",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("operation_id", sa.String(length=40), nullable=False),
        sa.Column("reason", sa.String(length=40), nullable=False),
        sa.Column("message", sa.String(), nullable=False),
        sa.Column("options", sa.JSON(), nullable=False),
        sa.Column("resume_state", sa.String(length=40), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("decided_at", UTCDateTime(), nullable=True),
        sa.Column("decided_by", sa.String(length=100), nullable=True),
        sa.Column("decision", sa.JSON(), nullable=True),
        sa.ForeignKeyConstraint(
            ["operation_id"],
            ["operations.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("escalations", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_escalations_operation_id"), ["operation_id"], unique=False
        )

    op.create_table(
        "history",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("operation_id", sa.String(length=40), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("at", UTCDateTime(), nullable=False),
        sa.Column("kind", sa.String(length=20), nullable=False),
        sa.Column("actor", sa.String(length=120), nullable=False),
        sa.Column("from_state", sa.String(length=40), nullable=True),
        sa.Column("to_state", sa.String(length=40), nullable=True),
        sa.Column("cause", sa.String(length=500), nullable=False),
        sa.Column("delay_source", sa.String(length=40), nullable=True),
        sa.Column("detail", sa.JSON(), nullable=True),
        sa.Column("prev_hash", sa.String(length=128), nullable=False),
        sa.Column("hash", sa.String(length=128), nullable=False),
        sa.ForeignKeyConstraint(
            ["operation_id"],
            ["operations.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("operation_id", "seq", name="uq_history_operation_seq"),
    )


def downgrade() -> None:

    op.drop_table("history")
    with op.batch_alter_table("escalations", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_escalations_operation_id"))

    op.drop_table("escalations")
    op.drop_table("completion_steps")
    with op.batch_alter_table("webhook_events", schema=None) as batch_op:
        batch_op.drop_index("ix_webhook_events_orphans")

    op.drop_table("webhook_events")
    with op.batch_alter_table("operations", schema=None) as batch_op:
        batch_op.drop_index("ix_operations_state_id")
        batch_op.drop_index("ix_operations_remote_job")
        batch_op.drop_index("ix_operations_due")
        batch_op.drop_index("ix_operations_caller_id")

    op.drop_table("operations")
    op.drop_table("api_tokens")
