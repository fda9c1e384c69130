"""Writing an escalation: the record, the operation's move, the history entry, one transaction.

The wording and the options come from the pure ``escalations`` module; this
module only gathers the facts from the operation and writes.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from reconciler.core import escalation as escalations
from reconciler.core.backoff import BackoffPolicy
from reconciler.core.states import END_STATES, State
from reconciler.core.vocabulary import EscalationReason, HistoryKind, TransportError
from reconciler.providers.spec import ProviderSpec
from reconciler.storage.journal import Entry, Journal, Lease
from reconciler.storage.models import Escalation, Operation

log = logging.getLogger("reconciler.storage.escalations")

ESCALATIONS = Escalation.__table__  # type: ignore[attr-defined]

# Where an escalation leaves the operation, when it is not simply `escalated`.
_STOP_STATE = {
    EscalationReason.DEADLINE_EXCEEDED: State.RESULT_TIMED_OUT,
    EscalationReason.CANCELLATION_UNCONFIRMED: State.CANCELLATION_UNCONFIRMED,
}


def resume_state(op: Operation, reason: EscalationReason) -> State:
    """Where an operator's ``extend`` takes the operation back to."""
    state = State(op.state)
    if op.remote_job_id is None:
        return State.CREATE_UNKNOWN
    if reason is EscalationReason.CANCELLATION_UNCONFIRMED or state in (
        State.CANCELLING,
        State.CANCELLATION_UNCONFIRMED,
    ):
        return State.CANCELLING
    if state is State.CANCEL_REQUESTED:
        return State.CANCEL_REQUESTED
    return State.OBSERVING


def facts_for(
    op: Operation,
    spec: ProviderSpec | None,
    reason: EscalationReason,
    detail: str,
    now: datetime,
    transport_error: TransportError | None = None,
) -> escalations.EscalationFacts:
    backoff = (
        BackoffPolicy(
            spec.polling.base_delay_seconds,
            spec.polling.max_delay_seconds,
            spec.polling.jitter_floor,
        )
        if spec is not None
        else BackoffPolicy()
    )
    extra_seconds, extra_requests = escalations.proposed_extension(backoff)
    return escalations.EscalationFacts(
        operation_id=op.id,
        provider=op.provider,
        reason=reason,
        detail=detail,
        started_at=op.created_at,
        now=now,
        status_requests_used=op.status_requests_used,
        max_status_requests=op.max_status_requests,
        provider_job_id=op.remote_job_id,
        last_remote_state=op.remote_state,
        last_http_status=op.last_http_status,
        last_http_at=op.last_http_at,
        last_transport_error=transport_error,
        extra_seconds=extra_seconds,
        extra_status_requests=extra_requests,
    )


def escalate(
    conn: Connection,
    journal: Journal,
    op: Operation,
    spec: ProviderSpec | None,
    reason: EscalationReason,
    detail: str,
    *,
    now: datetime,
    actor: str,
    lease: Lease | None = None,
    changes: Mapping[str, Any] | None = None,
    before: Sequence[Entry] = (),
    transport_error: TransportError | None = None,
) -> Operation:
    """Stop automatic work on ``op`` and ask a person, with bounded options."""
    seen = copy.copy(op)  # the facts include what this very write records
    for name, value in (changes or {}).items():
        setattr(seen, name, value)
    facts = facts_for(seen, spec, reason, detail, now, transport_error)
    options = escalations.options_for(
        reason,
        provider_can_cancel=spec is not None and spec.cancel is not None,
        job_id_known=op.remote_job_id is not None,
    )
    message = escalations.render_message(facts, options)
    log.warning(
        "operation %s escalated: %s",
        op.id,
        reason.value,
        extra={
            "operation_id": op.id,
            "reason": reason.value,
            "detail": detail,
            "options": [o.value for o in options],
        },
    )
    escalation_id = conn.execute(
        sa.insert(ESCALATIONS)
        .values(
            operation_id=op.id,
            reason=reason.value,
            message=message,
            options=escalations.options_payload(facts, options),
            resume_state=resume_state(op, reason).value,
            created_at=now,
        )
        .returning(ESCALATIONS.c.id)
    ).scalar_one()
    entry = Entry(
        kind=HistoryKind.ESCALATION,
        actor=actor,
        cause=f"escalation:{reason.value}",
        detail={
            "reason": reason.value,
            "detail": detail,
            "options": [o.value for o in options],
            "escalation_id": escalation_id,
        },
    )
    all_changes: dict[str, Any] = {"escalation_id": escalation_id, **(changes or {})}
    state = State(op.state)
    if state in END_STATES:
        # The outcome stands (e.g. a callback that cannot be delivered); only a person is asked.
        return journal.write(
            conn, op, now=now, changes=all_changes, entries=[*before, entry], lease=lease
        )
    target = _STOP_STATE.get(reason, State.ESCALATED)
    if target is State.ESCALATED:
        all_changes.setdefault("next_poll_at", None)
    return journal.transition(
        conn,
        op,
        target,
        actor=actor,
        cause=f"escalation:{reason.value}",
        now=now,
        detail={"reason": reason.value, "detail": detail},
        changes=all_changes,
        before=before,
        entries=[entry],
        lease=lease,
    )


def open_escalation(conn: Connection, op: Operation) -> Escalation | None:
    if op.escalation_id is None:
        return None
    row = (
        conn.execute(sa.select(ESCALATIONS).where(ESCALATIONS.c.id == op.escalation_id))
        .mappings()
        .first()
    )
    if row is None or row["decided_at"] is not None:
        return None
    return Escalation(**dict(row))
