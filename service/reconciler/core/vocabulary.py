"""Names declared once: delay sources, escalation reasons, decisions, scopes, history kinds."""

from __future__ import annotations

from enum import StrEnum

# 4xx answers that say "not now" rather than "never": a later attempt may succeed.
RETRYABLE_4XX = frozenset({408, 425, 429})


class DelaySource(StrEnum):
    PROVIDER_RETRY_AFTER = "provider_retry_after"
    PROVIDER_POLL_HINT = "provider_poll_hint"
    LOCAL_BACKOFF = "local_backoff"
    MANUAL_EXTENSION = "manual_extension"
    WEBHOOK_HINT = "webhook_hint"
    WEBHOOK_TRUST = "webhook_trust"
    CATCH_UP = "catch_up"  # overdue after a restart or pause: spread out, not burst
    STEP_RETRY = "step_retry"  # a step failed in a way nothing foresaw: tried again later


class EscalationReason(StrEnum):
    DEADLINE_EXCEEDED = "deadline_exceeded"
    REQUEST_BUDGET_EXHAUSTED = "request_budget_exhausted"
    RATE_LIMITED = "rate_limited"
    UNKNOWN_STATE = "unknown_state"
    AUTHORIZATION_DENIED = "authorization_denied"
    PROVIDER_FAILURE = "provider_failure"
    CONTRACT_VIOLATION = "contract_violation"
    CONTRADICTORY_STATUS = "contradictory_status"
    CANCELLATION_UNCONFIRMED = "cancellation_unconfirmed"
    CALLBACK_UNDELIVERABLE = "callback_undeliverable"
    # A create that may have made a job at a provider that takes no idempotency key and
    # offers no lookup: only a person may resend it.
    CREATE_UNKNOWN = "create_unknown"
    # A step kept failing in a way nothing foresaw (a defect, a library's error): its
    # bounded retries are spent (``core.step_retry``).
    INTERNAL_ERROR = "internal_error"


class DecisionAction(StrEnum):
    EXTEND = "extend"
    CANCEL = "cancel"
    ABANDON = "abandon"
    RESEND = "resend"  # a create_unknown's create sent once more, with the same request
    RETRY = "retry"  # an internal_error's step run again, its failure count started afresh


class StepName(StrEnum):
    """The steps a worker runs on an operation, as its failures are counted and named."""

    CREATE = "create"
    STATUS_READ = "status_read"
    CANCEL = "cancel"
    COLLECT = "result_collection"
    COMPLETE = "completion"


class Scope(StrEnum):
    AGENT = "agent"
    OPERATOR = "operator"


class HistoryKind(StrEnum):
    TRANSITION = "transition"
    OBSERVATION = "observation"
    HINT = "hint"
    ESCALATION = "escalation"
    DECISION = "decision"
    NOTE = "note"
    STEP = "step"


class RemoteCategory(StrEnum):
    """What a provider's state word means for us, per the provider file's state table."""

    PENDING = "pending"
    SUCCESS = "success"
    PARTIAL = "partial"
    FAILURE = "failure"
    CANCELLED = "cancelled"
    EXPIRED = "expired"
    UNKNOWN = "unknown"


class TransportError(StrEnum):
    """Why a call produced no HTTP response at all."""

    TIMEOUT = "timeout"
    CONNECTION_REFUSED = "connection_refused"
    CONNECTION_RESET = "connection_reset"
    DNS = "dns"
    TLS = "tls"
    PROTOCOL = "protocol"
    CREDENTIAL = "credential"  # the credential could not be obtained now: nothing was sent
    OTHER = "other"
