"""Starting an operation (API, MCP): stored durably, idempotently, before any provider call.

Guarantee: no duplicate submissions. The same idempotency key with the same
request returns the stored operation; with another request it is a conflict.
One transaction; the caller runs it off the event loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from reconciler.api.validation import CreateRequest
from reconciler.core import ids
from reconciler.core.canonical import request_fingerprint
from reconciler.core.states import State
from reconciler.errors import Conflict, IdempotencyConflict, InvalidRequest
from reconciler.storage import operations as store
from reconciler.storage.database import Database
from reconciler.storage.journal import Journal
from reconciler.storage.models import Operation, new_record
from reconciler.storage.notify import WAKE_CHANNEL, notify_in_transaction
from reconciler.storage.tokens import Principal


@dataclass(frozen=True)
class ProviderLimits:
    """What the provider file authorises; an agent may ask for less, never for more."""

    deadline_seconds: float
    max_status_requests: int
    max_transport_failures: int
    create_deadline_seconds: float


def _within(limits: ProviderLimits, req: CreateRequest) -> tuple[float, int]:
    deadline = limits.deadline_seconds
    if req.deadline_seconds is not None:
        if req.deadline_seconds > limits.deadline_seconds:
            raise InvalidRequest(
                f"'deadline_seconds' may be at most {limits.deadline_seconds:g} for provider "
                f"'{req.provider}'; a longer wait needs an operator's extension"
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


def _same_request(existing: Operation, fingerprint: str, key: str) -> Operation:
    if existing.request_fingerprint != fingerprint:
        raise IdempotencyConflict(
            f"idempotency_key '{key}' was already used for a different request (operation "
            f"{existing.id}); use a new key for a new request, or resend the original request "
            "unchanged to get that operation back"
        )
    return existing


def create_operation(
    db: Database,
    journal: Journal,
    principal: Principal,
    req: CreateRequest,
    limits: ProviderLimits,
    now: datetime,
) -> tuple[Operation, bool]:
    """Store the operation durably (``create_pending``) before any provider call.

    Returns the operation and whether it is new. The same key with the same request
    fingerprint returns the stored operation; with another request it is a conflict.
    """
    deadline, budget = _within(limits, req)
    fingerprint = request_fingerprint(req.provider, req.request)
    key = req.idempotency_key
    if key is not None:
        with db.read() as conn:
            existing = store.find_by_key(conn, principal.name, key)
        if existing is not None:
            return _same_request(existing, fingerprint, key), False
    op = new_record(
        id=ids.operation_id(now),
        provider=req.provider,
        caller=principal.name,
        request=req.request,
        request_fingerprint=fingerprint,
        idempotency_key=key,
        idempotency_token=ids.idempotency_token(),
        trace_id=ids.trace_id(),
        callback_url=req.callback_url,
        meta=req.metadata,
        state=State.CREATE_PENDING.value,
        created_at=now,
        updated_at=now,
        create_deadline_at=now + timedelta(seconds=limits.create_deadline_seconds),
        deadline_at=now + timedelta(seconds=deadline),
        max_status_requests=budget,
        max_transport_failures=limits.max_transport_failures,
        create_attempts=0,
        status_requests_used=0,
        transport_failures_used=0,
        rate_limited_count=0,
        poll_attempt=0,
        next_poll_at=now,
        completion_round=0,
        completion_pending=False,
        version=1,
        history_seq=0,
        history_head="",
    )
    try:
        with db.write() as conn:
            journal.insert(
                conn,
                op,
                actor=f"agent:{principal.name}",
                cause="agent_request:create",
                now=now,
                detail={
                    "request_fingerprint": fingerprint,
                    "idempotency_key": key,
                    "deadline_at": op.deadline_at.isoformat(),
                    "max_status_requests": budget,
                    "trace_id": op.trace_id,
                },
            )
            notify_in_transaction(conn, WAKE_CHANNEL)
    except Conflict:
        # Lost a race with a concurrent request carrying the same key: that one is stored.
        if key is None:
            raise
        with db.read() as conn:
            existing = store.find_by_key(conn, principal.name, key)
        if existing is None:
            raise
        return _same_request(existing, fingerprint, key), False
    return op, True
