"""Starting an operation (API, MCP): stored durably, idempotently, before any provider call.

Guarantee: no duplicate submissions, and no silently dropped fields. The same
idempotency key with the same request and the same terms (callback URL,
deadline, status budget, metadata) returns the stored operation; with any of
them different it is a conflict that names the field, because answering with
the original would drop what the retry asked for (a callback that never comes).
Requests compare as values (``core.canonical``: ``1`` and ``1.0`` are one).
The agent's quotas are checked in the same transaction as the insert. One
transaction; the caller runs it off the event loop.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.engine import Connection

from reconciler.core import ids
from reconciler.core.canonical import request_fingerprint, same_json
from reconciler.core.errors import Gone, IdempotencyConflict, InvalidRequest, QuotaExceeded
from reconciler.core.limits import ProviderLimits
from reconciler.core.principal import Principal
from reconciler.core.quotas import RATE_WINDOW, Quota, check_quota
from reconciler.core.records import OperationRecord, new_operation, with_changes
from reconciler.core.retention import key_digest
from reconciler.core.states import State
from reconciler.storage import operations as store
from reconciler.storage import retention
from reconciler.storage.journal import Journal
from reconciler.storage.notify import WAKE_CHANNEL
from reconciler.tracing import StoredTrace
from reconciler.wire import CreateOperation


def _within(limits: ProviderLimits, req: CreateOperation) -> tuple[float, int]:
    deadline = limits.deadline_seconds
    if req.deadline_seconds is not None:
        if req.deadline_seconds > limits.deadline_seconds:
            raise InvalidRequest(
                f"'deadline_seconds' may be at most {limits.deadline_seconds:g} for provider "
                f"'{req.provider}'; a longer wait needs an operator's extension"
            )
        if req.deadline_seconds < limits.min_deadline_seconds:
            raise InvalidRequest(
                f"'deadline_seconds' must be at least {limits.min_deadline_seconds:g}; a "
                "shorter deadline could only end in an escalation"
            )
        deadline = req.deadline_seconds
    budget = limits.max_status_requests
    if req.max_status_requests is not None:
        if req.max_status_requests > limits.max_status_requests:
            raise InvalidRequest(
                f"'max_status_requests' may be at most {limits.max_status_requests} for "
                f"provider '{req.provider}'"
            )
        budget = req.max_status_requests
    return deadline, budget


def _same_operation(
    existing: OperationRecord, req: CreateOperation, fingerprint: str, deadline: float, budget: int
) -> OperationRecord:
    """The stored operation if the retry asks for exactly it; else a conflict naming the field."""
    key = req.idempotency_key
    if existing.request_fingerprint != fingerprint:
        raise IdempotencyConflict(
            f"idempotency_key '{key}' was already used for a different request (operation "
            f"{existing.id}); use a new key for a new request, or resend the original request "
            "unchanged to get that operation back"
        )
    differs = []
    if existing.callback_url != req.callback_url:
        differs.append("callback_url")
    granted = existing.requested_deadline_seconds
    if granted is not None and granted != deadline:
        differs.append("deadline_seconds")
    granted_budget = existing.requested_max_status_requests
    if granted_budget is not None and granted_budget != budget:
        differs.append("max_status_requests")
    if not same_json(existing.meta, req.metadata):
        differs.append("metadata")
    if differs:
        fields = ", ".join(f"'{name}'" for name in differs)
        raise IdempotencyConflict(
            f"idempotency_key '{key}' was already used for the same request with a different "
            f"{fields} (operation {existing.id}); the stored operation keeps what it was "
            "created with: resend the original values to get it back, or use a new key"
        )
    return existing


def _refuse_pruned(stone: retention.Tombstone, key: str, fingerprint: str) -> None:
    """A key whose operation retention pruned starts nothing while its tombstone lasts."""
    if stone.request_fingerprint == fingerprint:
        raise Gone(stone.replayed(key))
    raise IdempotencyConflict(
        f"idempotency_key '{key}' was already used for a different request (operation "
        f"{stone.operation_id}, since removed by retention); use a new key for a new request"
    )


def _stored(
    conn: Connection,
    principal: Principal,
    req: CreateOperation,
    fingerprint: str,
    deadline: float,
    budget: int,
) -> OperationRecord | None:
    """The operation the request's key already started, if the retry asks for exactly it
    (else a conflict, or ``Gone`` for a pruned one); None for a free key or none."""
    key = req.idempotency_key
    if key is None:
        return None
    existing, stone = store.find_key(conn, principal.name, key)
    if existing is not None:
        return _same_operation(existing, req, fingerprint, deadline, budget)
    if stone is not None:
        _refuse_pruned(stone, key, fingerprint)
    return None


def _check_quota(conn: Connection, principal: Principal, quota: Quota, now: datetime) -> None:
    if not (quota.max_in_flight or quota.max_per_minute):
        return
    store.lock_caller(conn, principal.name)
    in_flight = store.count_in_flight(conn, principal.name) if quota.max_in_flight else 0
    recent = (
        store.created_since(conn, principal.name, now - RATE_WINDOW, quota.max_per_minute)
        if quota.max_per_minute
        else []
    )
    check_quota(quota, principal.name, in_flight, recent, now)


def create_operation(
    conn: Connection,
    journal: Journal,
    principal: Principal,
    req: CreateOperation,
    limits: ProviderLimits,
    now: datetime,
    trace: StoredTrace | None = None,
    start: Callable[[OperationRecord], Mapping[str, Any]] | None = None,
) -> tuple[OperationRecord, bool]:
    """Store the operation durably (``create_pending``) before any provider call, in the
    caller's write transaction (``Database.run_joined``, ``key=NEW_OPERATION``).

    Returns the operation and whether it is new. The same key with the same request and
    terms returns the stored operation; with anything else it is a conflict. A request
    that loses a race with another carrying its key raises ``Conflict`` from the unique
    key: run again, it finds the winner. ``trace``: the agent's request's span, whose
    trace the operation's story joins (tracing on). ``start``: the values a new operation
    is inserted with when this replica starts it at once (``engine.create_start``: its
    lease, its first create counted); its insert then wakes no claim.
    """
    deadline, budget = _within(limits, req)
    fingerprint = request_fingerprint(req.provider, req.request)
    key = req.idempotency_key
    op = new_operation(
        id=ids.operation_id(now),
        provider=req.provider,
        caller=principal.name,
        request=req.request,
        request_fingerprint=fingerprint,
        idempotency_key=key,
        idempotency_token=ids.idempotency_token(),
        trace_id=trace.trace_id if trace is not None else ids.trace_id(),
        traceparent=trace.traceparent if trace is not None else None,
        callback_url=req.callback_url,
        meta=req.metadata,
        requested_deadline_seconds=deadline,
        requested_max_status_requests=budget,
        state=State.CREATE_PENDING.value,
        created_at=now,
        updated_at=now,
        create_deadline_at=now + timedelta(seconds=limits.create_deadline_seconds),
        deadline_at=now + timedelta(seconds=deadline),
        max_status_requests=budget,
        max_transport_failures=limits.max_transport_failures,
        next_poll_at=now,
    )
    wake = [(WAKE_CHANNEL, "")]
    if start is not None:
        op, wake = with_changes(op, start(op)), []
    actor, cause = f"agent:{principal.name}", "agent_request:create"
    detail = {
        "request_fingerprint": fingerprint,
        "idempotency_key": key,
        "deadline_at": op.deadline_at.isoformat(),
        "max_status_requests": budget,
        "trace_id": op.trace_id,
    }
    insert_first = key is not None and conn.dialect.name == "postgresql"
    if insert_first:
        # The insert first, in one statement that checks the key is free: a retry, which
        # finds it taken, looks it up after. The quota is counted before the insert; a
        # retry refused by it still gets its operation back, as when the key came first.
        try:
            _check_quota(conn, principal, limits.quota, now)
        except QuotaExceeded:
            stored = _stored(conn, principal, req, fingerprint, deadline, budget)
            if stored is None:
                raise
            return stored, False
        made = journal.insert_if_key_free(
            conn,
            op,
            str(key_digest(key)),
            actor=actor,
            cause=cause,
            now=now,
            detail=detail,
            notify=wake,
        )
        if made is not None:
            return made, True
    stored = _stored(conn, principal, req, fingerprint, deadline, budget)
    if stored is not None:
        return stored, False
    if not insert_first:  # counted above already
        _check_quota(conn, principal, limits.quota, now)
    inserted = journal.insert(
        conn, op, actor=actor, cause=cause, now=now, detail=detail, notify=wake
    )
    return inserted, True
