"""The rows the pure decisions read, as plain frozen values: operations, escalations, history.

Storage reads rows into these (``storage.models`` keeps the table declarations
Alembic migrates; a unit test holds the operation record's fields to the
operations table's columns plus the payload names). Nothing here is changed in
place: a write returns a new record (``with_changes``).

The worker, the claims and the webhook batch read many operation rows, and a
frozen dataclass's generated ``__init__`` sets each of its 60 fields through
``object.__setattr__`` (about ten times the cost of a plain slotted one). Records
read from the database are therefore built by a mutable twin with the same
slots and then given the frozen class (``build_operation``): the same object
layout, so the result is an ordinary frozen record.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True, slots=True)
class OperationRecord:
    """One operation: its row's columns in table order, then its payloads.

    The payloads (``PAYLOADS``) live in their own table, written once each; a record
    read with its row carries all but ``request``, which only the create step reads (from
    the record when the claim read it along, as PostgreSQL's does for a create not sent).
    """

    id: str
    provider: str
    caller: str
    request_fingerprint: str
    idempotency_key: str | None
    idempotency_token: str
    trace_id: str
    callback_url: str | None
    requested_deadline_seconds: float | None
    requested_max_status_requests: int | None
    state: str
    remote_job_id: str | None
    remote_state: str | None
    created_at: datetime
    updated_at: datetime
    accepted_at: datetime | None
    create_deadline_at: datetime
    deadline_at: datetime
    done_at: datetime | None
    create_attempts: int
    create_lookups: int
    max_status_requests: int
    status_requests_used: int
    max_transport_failures: int
    transport_failures_used: int
    rate_limited_count: int
    poll_attempt: int
    next_poll_at: datetime | None
    delay_source: str | None
    hinted_at: datetime | None
    lease_owner: str | None
    lease_expires_at: datetime | None
    last_http_status: int | None
    last_http_at: datetime | None
    last_provider_request_id: str | None
    poll_after_seconds: float | None
    retry_not_before: datetime | None
    hint_not_before: datetime | None
    provider_expires_at: datetime | None
    progress: Any
    result_attempts: int
    error: Any
    cancel_requested_at: datetime | None
    cancel_requested_by: str | None
    cancel_reason: str | None
    cancel_sent_at: datetime | None
    cancel_deadline_at: datetime | None
    escalation_id: int | None
    completion_round: int
    completion_pending: bool
    completion_lane: str | None
    version: int
    history_seq: int
    history_head: str
    traceparent: str | None
    step_failures: int
    failed_step: str | None
    escalation_open: bool
    cancel_refusal: Any
    request: Any = None
    meta: Any = None
    status_body: Any = None  # the status answer that confirmed success, for collection
    result: Any = None


@dataclass(frozen=True, slots=True)
class EscalationRecord:
    id: int
    operation_id: str
    reason: str
    message: str
    options: Any
    resume_state: str | None
    created_at: datetime
    decided_at: datetime | None
    decided_by: str | None
    decision: Any


@dataclass(frozen=True, slots=True)
class HistoryRecord:
    id: int | None  # None only for an entry not read from the database
    operation_id: str
    seq: int
    at: datetime
    kind: str
    actor: str
    from_state: str | None
    to_state: str | None
    cause: str
    delay_source: str | None
    detail: Any
    prev_hash: str
    hash: str


# The payload names (``operation_payloads.name``), the record's last fields.
PAYLOADS = ("request", "meta", "status_body", "result")
FIELDS = tuple(f.name for f in dataclasses.fields(OperationRecord))
COLUMNS = FIELDS[: -len(PAYLOADS)]

# What a new operation starts with, for every column that has a starting value.
DEFAULTS: Mapping[str, Any] = {
    "idempotency_key": None,
    "callback_url": None,
    "requested_deadline_seconds": None,
    "requested_max_status_requests": None,
    "remote_job_id": None,
    "remote_state": None,
    "accepted_at": None,
    "done_at": None,
    "create_attempts": 0,
    "create_lookups": 0,
    "status_requests_used": 0,
    "transport_failures_used": 0,
    "rate_limited_count": 0,
    "poll_attempt": 0,
    "next_poll_at": None,
    "delay_source": None,
    "hinted_at": None,
    "lease_owner": None,
    "lease_expires_at": None,
    "last_http_status": None,
    "last_http_at": None,
    "last_provider_request_id": None,
    "poll_after_seconds": None,
    "retry_not_before": None,
    "hint_not_before": None,
    "provider_expires_at": None,
    "progress": None,
    "result_attempts": 0,
    "error": None,
    "cancel_requested_at": None,
    "cancel_requested_by": None,
    "cancel_reason": None,
    "cancel_sent_at": None,
    "cancel_deadline_at": None,
    "escalation_id": None,
    "completion_round": 0,
    "completion_pending": False,
    "completion_lane": None,
    "version": 1,
    "history_seq": 0,
    "history_head": "",
    "traceparent": None,
    "step_failures": 0,
    "failed_step": None,
    "escalation_open": False,
    "cancel_refusal": None,
}

_Builder: Any = dataclasses.make_dataclass(
    "_OperationBuilder",
    [(name, Any) for name in COLUMNS]
    + [(name, Any, dataclasses.field(default=None)) for name in PAYLOADS],
    slots=True,
)
_INDEX = {name: i for i, name in enumerate(FIELDS)}
_values_of = operator.attrgetter(*FIELDS)


def build_operation(values: Sequence[Any]) -> OperationRecord:
    """A record from its values in ``FIELDS`` order (the columns, then any payloads)."""
    record = _Builder(*values)
    record.__class__ = OperationRecord
    built: OperationRecord = record
    return built


def operation_of(
    row: Mapping[Any, Any], payloads: Mapping[str, Any] | None = None
) -> OperationRecord:
    """A record from a row by column name, with the payloads given (the rest None)."""
    record = _Builder(**row, **(payloads or {}))
    record.__class__ = OperationRecord
    built: OperationRecord = record
    return built


def with_changes(op: OperationRecord, changes: Mapping[str, Any]) -> OperationRecord:
    """``op`` with ``changes`` applied (names are fields; a ``KeyError`` names one that is not)."""
    values = list(_values_of(op))
    for name, value in changes.items():
        values[_INDEX[name]] = value
    return build_operation(values)


def new_operation(**values: Any) -> OperationRecord:
    """A new operation: ``DEFAULTS``, then ``values`` (payloads included)."""
    return operation_of({**DEFAULTS, **values})
