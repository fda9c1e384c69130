"""Database tables (SQLModel). Created and evolved only by Alembic migrations.

Design notes that the rest of the code relies on:

* ``operations.version`` is bumped by every write to the row; writers pass
  the version they read and the UPDATE matches only that version, so two
  racing writers cannot both succeed.
* ``lease_owner``/``lease_expires_at`` give one worker at a time the right
  to act on an operation; worker writes also match on the lease.
* ``next_poll_at`` is "when a worker should next look", whatever the work
  is (create, status read, cancel, result, completion step); it is NULL when
  nothing is due, and the due index leaves NULLs out, which keeps it small.
* ``history_seq``/``history_head`` anchor the per-operation hash chain, so
  deleting the newest history entries is detectable.
* The big parts of an operation (the create request, metadata, the confirming
  status answer, the result) live in ``operation_payloads``, written once each:
  on SQLite an UPDATE rewrites the whole row, overflow pages included, and the
  operations row is written by every claim, charge and status read.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from reconciler.core import records
from reconciler.storage.types import UTCDateTime


def _ts(nullable: bool = True, index: bool = False) -> Any:
    return Field(default=None, sa_type=UTCDateTime, nullable=nullable, index=index)


def _json() -> Any:
    return Field(default=None, sa_type=sa.JSON, nullable=True)


class Operation(SQLModel, table=True):
    __tablename__ = "operations"
    __table_args__ = (
        sa.UniqueConstraint("caller", "idempotency_key", name="uq_operations_caller_key"),
        sa.UniqueConstraint("idempotency_token", name="uq_operations_idempotency_token"),
        sa.Index("ix_operations_remote_job", "provider", "remote_job_id"),
        # Only what is due: a finished row's next_poll_at is NULL, and every claim compares it.
        sa.Index(
            "ix_operations_due",
            "next_poll_at",
            sqlite_where=sa.text("next_poll_at IS NOT NULL"),
            postgresql_where=sa.text("next_poll_at IS NOT NULL"),
        ),
        sa.Index("ix_operations_state_id", "state", "id"),
        sa.Index("ix_operations_caller_id", "caller", "id"),
        # Operations in flight per agent are counted from here (quotas), end states skipped.
        sa.Index("ix_operations_caller_state", "caller", "state"),
        # Operations waiting on a stretched (webhook-trust) schedule: the few rows a
        # withdrawal of trust must bring back, found without scanning the table.
        # The retention sweep's walk: finished rows oldest first, nothing in flight indexed.
        sa.Index(
            "ix_operations_finished",
            "done_at",
            sqlite_where=sa.text("done_at IS NOT NULL"),
            postgresql_where=sa.text("done_at IS NOT NULL"),
        ),
        sa.Index(
            "ix_operations_stretched",
            "provider",
            sqlite_where=sa.text("delay_source = 'webhook_trust'"),
            postgresql_where=sa.text("delay_source = 'webhook_trust'"),
        ),
    )

    id: str = Field(primary_key=True, max_length=40)
    provider: str = Field(max_length=100)
    caller: str = Field(max_length=100)
    request_fingerprint: str = Field(max_length=80)
    idempotency_key: str | None = Field(default=None, max_length=200)
    idempotency_token: str = Field(max_length=80)
    trace_id: str = Field(max_length=80)
    callback_url: str | None = Field(default=None, max_length=2048)
    # What creation granted, compared on an idempotent retry (an extension moves the limits).
    requested_deadline_seconds: float | None = None
    requested_max_status_requests: int | None = None

    state: str = Field(max_length=40)
    remote_job_id: str | None = Field(default=None, max_length=300)
    remote_state: str | None = Field(default=None, max_length=200)

    created_at: datetime = Field(sa_type=UTCDateTime, nullable=False)
    updated_at: datetime = Field(sa_type=UTCDateTime, nullable=False)
    accepted_at: datetime | None = _ts()
    create_deadline_at: datetime = Field(sa_type=UTCDateTime, nullable=False)
    deadline_at: datetime = Field(sa_type=UTCDateTime, nullable=False)
    done_at: datetime | None = _ts()

    create_attempts: int = 0
    create_lookups: int = 0  # idempotency-key lookups made while establishing the job id
    max_status_requests: int
    status_requests_used: int = 0
    max_transport_failures: int
    transport_failures_used: int = 0
    rate_limited_count: int = 0
    poll_attempt: int = 0

    next_poll_at: datetime | None = _ts()
    delay_source: str | None = Field(default=None, max_length=40)
    hinted_at: datetime | None = _ts()
    lease_owner: str | None = Field(default=None, max_length=120)
    lease_expires_at: datetime | None = _ts()

    last_http_status: int | None = None
    last_http_at: datetime | None = _ts()
    last_provider_request_id: str | None = Field(default=None, max_length=200)
    poll_after_seconds: float | None = None
    # The last status answer's Retry-After as a moment: no status read goes out before it,
    # not even one that a webhook hint or a cancel brings forward.
    retry_not_before: datetime | None = _ts()
    # The moment a valid provider hint named for the next read, kept while a stretched
    # (webhook-trust) wait runs, so a schedule brought back from it still honours it.
    hint_not_before: datetime | None = _ts()
    provider_expires_at: datetime | None = _ts()
    progress: Any = _json()
    result_attempts: int = 0
    error: Any = _json()

    cancel_requested_at: datetime | None = _ts()
    cancel_requested_by: str | None = Field(default=None, max_length=100)
    cancel_reason: str | None = Field(default=None, max_length=500)
    cancel_sent_at: datetime | None = _ts()
    cancel_deadline_at: datetime | None = _ts()

    escalation_id: int | None = None
    completion_round: int = 0
    completion_pending: bool = False
    # The share the completion's next step runs in (hooks, or a callback host): the claim
    # leaves out hosts whose share is full (``core.completion_lanes``).
    completion_lane: str | None = Field(default=None, max_length=300)

    version: int = 1
    history_seq: int = 0
    history_head: str = Field(default="", max_length=128)
    # The W3C trace context of the agent's request that made the operation: every span about
    # it, on any replica and after any restart, joins that trace (``reconciler.tracing``).
    traceparent: str | None = Field(default=None, max_length=64)
    # Failures in a row of one step that nothing foresaw, and which step (``core.step_retry``).
    step_failures: int = 0
    failed_step: str | None = Field(default=None, max_length=40)
    # Whether the escalation ``escalation_id`` names still awaits its decision: written with
    # the escalation and with the decision, so whether an operation is done (an end state
    # that decision may reopen is not) is a column's value to the list's filter and a wait.
    escalation_open: bool = False
    # The provider's refusal of the last cancel sent (its HTTP status, words and time): the
    # job kept running, and the answer says so (``core.cancel.refusal_record``).
    cancel_refusal: Any = _json()


class HistoryEntry(SQLModel, table=True):
    __tablename__ = "history"
    __table_args__ = (sa.UniqueConstraint("operation_id", "seq", name="uq_history_operation_seq"),)

    id: int | None = Field(default=None, primary_key=True)
    operation_id: str = Field(foreign_key="operations.id", max_length=40)
    seq: int
    at: datetime = Field(sa_type=UTCDateTime, nullable=False)
    kind: str = Field(max_length=20)
    actor: str = Field(max_length=120)
    from_state: str | None = Field(default=None, max_length=40)
    to_state: str | None = Field(default=None, max_length=40)
    cause: str = Field(max_length=500)
    delay_source: str | None = Field(default=None, max_length=40)
    detail: Any = _json()
    prev_hash: str = Field(max_length=128)
    hash: str = Field(max_length=128)


class ApiToken(SQLModel, table=True):
    __tablename__ = "api_tokens"

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(max_length=100, unique=True)
    scope: str = Field(max_length=20)
    token_hash: str = Field(max_length=64, unique=True)
    created_at: datetime = Field(sa_type=UTCDateTime, nullable=False)
    revoked_at: datetime | None = _ts()
    expires_at: datetime | None = _ts()
    # The agent's callback secret is derived from the service's signing key and this salt
    # (never stored); a rotation keeps the previous salt valid until the window closes.
    callback_salt: str | None = Field(default=None, max_length=64)
    previous_callback_salt: str | None = Field(default=None, max_length=64)
    previous_callback_until: datetime | None = _ts()


class OperationPayload(SQLModel, table=True):
    __tablename__ = "operation_payloads"

    operation_id: str = Field(foreign_key="operations.id", primary_key=True, max_length=40)
    name: str = Field(primary_key=True, max_length=20)
    value: Any = Field(sa_type=sa.JSON, nullable=False)


class WebhookEvent(SQLModel, table=True):
    __tablename__ = "webhook_events"
    __table_args__ = (
        sa.UniqueConstraint("provider", "event_id", name="uq_webhook_events_provider_event"),
        sa.Index("ix_webhook_events_orphans", "provider", "remote_job_id"),
        sa.Index("ix_webhook_events_provider_received", "provider", "received_at"),
    )

    id: int | None = Field(default=None, primary_key=True)
    provider: str = Field(max_length=100)
    event_id: str = Field(max_length=300)
    received_at: datetime = Field(sa_type=UTCDateTime, nullable=False)
    remote_job_id: str | None = Field(default=None, max_length=300)
    operation_id: str | None = Field(default=None, max_length=40)
    body_sha256: str = Field(max_length=64)  # of the whole body
    body: str | None = None  # its first 4 KiB at most (storage.webhook_events)
    duplicates: int = 0
    conflicts: int = 0
    event_type: str | None = Field(default=None, max_length=200)
    body_size: int | None = None  # bytes, when the event was stored after 0009
    # A verified event of a type [webhook] types does not list: it keeps its job id but
    # neither hints nor attaches.
    ignored: bool = Field(default=False, sa_column_kwargs={"server_default": sa.false()})


class Escalation(SQLModel, table=True):
    __tablename__ = "escalations"

    id: int | None = Field(default=None, primary_key=True)
    operation_id: str = Field(foreign_key="operations.id", max_length=40, index=True)
    reason: str = Field(max_length=40)
    message: str
    options: Any = Field(sa_type=sa.JSON, nullable=False)
    resume_state: str | None = Field(default=None, max_length=40)
    created_at: datetime = Field(sa_type=UTCDateTime, nullable=False)
    decided_at: datetime | None = _ts()
    decided_by: str | None = Field(default=None, max_length=100)
    decision: Any = _json()


class CompletionStep(SQLModel, table=True):
    __tablename__ = "completion_steps"
    __table_args__ = (
        sa.UniqueConstraint("operation_id", "round", "step", name="uq_completion_steps"),
    )

    id: int | None = Field(default=None, primary_key=True)
    operation_id: str = Field(foreign_key="operations.id", max_length=40)
    round: int
    step: str = Field(max_length=300)
    status: str = Field(max_length=20)
    idempotency_key: str = Field(max_length=120)
    attempts: int = 0
    started_at: datetime | None = _ts()
    finished_at: datetime | None = _ts()
    next_attempt_at: datetime | None = _ts()
    last_error: str | None = None


class ProviderHealth(SQLModel, table=True):
    """One provider's webhook health (``core.trust.Health``), shared by every replica.

    Changed only by a conditional UPDATE on ``version`` in the transaction that records
    the completion deciding it (``storage.trust``).
    """

    __tablename__ = "provider_health"

    provider: str = Field(primary_key=True, max_length=100)
    state: str = Field(max_length=20)
    streak: int = 0
    misses: int = 0
    webhook_first: int = 0
    late: int = 0
    missed: int = 0
    changed_at: datetime | None = _ts()
    updated_at: datetime = Field(sa_type=UTCDateTime, nullable=False)
    last_miss_operation: str | None = Field(default=None, max_length=40)
    version: int = 1


class WebhookVerdict(SQLModel, table=True):
    """The evidence behind the health: how each completion was first learned of.

    ``asked_at`` is when the status read that confirmed the end was sent, ``seen_at``
    when its answer was in hand, ``hinted_at`` when the verified webhook was stored (the
    one before the read, or the late one after it). A ``pending`` row waits for
    ``settle_after`` (the grace) before it is judged ``late`` or ``miss``.
    """

    __tablename__ = "webhook_verdicts"
    __table_args__ = (
        sa.Index("ix_webhook_verdicts_due", "verdict", "settle_after"),
        # Pruning an operation deletes its verdicts (and PostgreSQL checks the foreign key).
        sa.Index("ix_webhook_verdicts_operation", "operation_id"),
    )

    id: int | None = Field(default=None, primary_key=True)
    operation_id: str = Field(foreign_key="operations.id", max_length=40)
    provider: str = Field(max_length=100)
    remote_job_id: str | None = Field(default=None, max_length=300)
    verdict: str = Field(max_length=20)
    asked_at: datetime = Field(sa_type=UTCDateTime, nullable=False)
    seen_at: datetime = Field(sa_type=UTCDateTime, nullable=False)
    hinted_at: datetime | None = _ts()
    settle_after: datetime | None = _ts()
    judged_at: datetime | None = _ts()


class Tombstone(SQLModel, table=True):
    """What retention leaves of a pruned operation, for the tombstone window: enough to
    answer a late retry of its key and request, and a read of its id, with ``410``.

    The idempotency key is kept as its SHA-256 only (``core.retention.key_digest``)."""

    __tablename__ = "tombstones"
    __table_args__ = (
        sa.Index("ix_tombstones_caller_key", "caller", "key_digest"),
        sa.Index("ix_tombstones_pruned", "pruned_at"),
        sa.Index("ix_tombstones_record", "record_seq"),
    )

    operation_id: str = Field(primary_key=True, max_length=40)
    caller: str = Field(max_length=100)
    key_digest: str | None = Field(default=None, max_length=64)
    request_fingerprint: str = Field(max_length=80)
    provider: str = Field(max_length=100)
    state: str = Field(max_length=40)
    done_at: datetime = Field(sa_type=UTCDateTime, nullable=False)
    pruned_at: datetime = Field(sa_type=UTCDateTime, nullable=False)
    # The retention record that left it, whose count and digest cover it (None: left
    # before records covered tombstones).
    record_seq: int | None = None


class RetentionRecord(SQLModel, table=True):
    """One prune's account, chained like the history (``core.retention``): what went, up to
    when, and a digest of the removed operations' chain heads. ``audit verify`` checks the
    chain and reports from it; nothing deletes these rows."""

    __tablename__ = "retention_log"

    # 1, 2, ...: two prunes that read the same head cannot both append.
    seq: int = Field(primary_key=True, sa_column_kwargs={"autoincrement": False})
    at: datetime = Field(sa_type=UTCDateTime, nullable=False)
    actor: str = Field(max_length=120)
    cutoff: datetime = Field(sa_type=UTCDateTime, nullable=False)
    operations: int
    history_entries: int
    done_from: datetime = Field(sa_type=UTCDateTime, nullable=False)
    done_until: datetime = Field(sa_type=UTCDateTime, nullable=False)
    digest: str = Field(max_length=64)
    prev_hash: str = Field(max_length=128)
    hash: str = Field(max_length=128)
    # The tombstones a prune left (or an expiry removed) and their digest, a sum that an
    # expiry's subtracts from (``core.retention.tombstones_digest``); None before these
    # were kept.
    tombstones: int | None = None
    tombstones_digest: str | None = Field(default=None, max_length=64)
    # An expiry's record: the prune record whose tombstones it removed (None: a prune).
    expired_of: int | None = None


class RetentionHead(SQLModel, table=True):
    """The retention log's last record (its number and hash), kept apart from the log as
    an operation's row keeps its history's head: deleting the newest records breaks the
    link. One row, ``name = 'retention'``."""

    __tablename__ = "retention_head"

    name: str = Field(primary_key=True, max_length=40)
    seq: int
    hash: str = Field(max_length=128)


class MaintenanceLease(SQLModel, table=True):
    """Who runs a periodic chore (the retention sweep) now, across replicas: the row is
    taken by a conditional upsert and lapses at ``expires_at`` if its owner dies."""

    __tablename__ = "maintenance_leases"

    name: str = Field(primary_key=True, max_length=40)
    owner: str = Field(max_length=120)
    expires_at: datetime = Field(sa_type=UTCDateTime, nullable=False)


TABLES = SQLModel.metadata

# Reading rows into SQLModel instances runs SQLAlchemy's attribute instrumentation for
# every field (about half a millisecond per row); reads produce the plain frozen records
# of ``core.records`` instead, which is what the rest of the service is typed with.
operation_record = records.operation_of
record_of_values = records.build_operation
