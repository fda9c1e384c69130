"""Operator decisions on an escalation: extend, cancel or abandon — only what was offered.

An extension is a new authorization (seed 003): a new deadline and extra
status requests, recorded with delay source ``manual_extension``; the
failure and rate-limit counters start again because the operator accepted
the risk anew.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from reconciler.api.validation import Decision
from reconciler.core import escalation as escalations
from reconciler.core.states import END_STATES, State
from reconciler.core.vocabulary import DecisionAction, DelaySource, EscalationReason, HistoryKind
from reconciler.errors import DecisionNotAllowed
from reconciler.storage.escalations import ESCALATIONS, open_escalation
from reconciler.storage.journal import Entry, Journal
from reconciler.storage.models import CompletionStep, Escalation, Operation

STEPS = CompletionStep.__table__  # type: ignore[attr-defined]


def _offered(esc: Escalation) -> dict[str, dict[str, Any]]:
    return {str(o["action"]): o for o in esc.options}


def apply_decision(
    conn: Connection,
    journal: Journal,
    op: Operation,
    decision: Decision,
    who: str,
    now: datetime,
    cancel_deadline_seconds: float,
) -> Operation:
    esc = open_escalation(conn, op)
    if esc is None:
        raise DecisionNotAllowed(
            f"operation {op.id} has no open escalation to decide"
            + (" (it was already decided)" if op.escalation_id is not None else "")
        )
    offered = _offered(esc)
    action = decision.action
    if action.value not in offered:
        raise DecisionNotAllowed(
            f"'{action.value}' was not offered for this escalation ({esc.reason}); "
            f"offered: {', '.join(offered)}"
        )
    reason = EscalationReason(esc.reason)
    record: dict[str, Any] = {"action": action.value}
    entry_detail: dict[str, Any] = {"escalation_id": esc.id, "reason": reason.value}
    changes: dict[str, Any] = {}
    target: State | None = None
    state = State(op.state)
    if action is DecisionAction.EXTEND:
        option = offered[action.value]
        extra_seconds = decision.extra_seconds or float(option.get("extra_seconds", 900))
        extra_requests = decision.extra_status_requests or int(
            option.get("extra_status_requests", 4)
        )
        record.update(extra_seconds=extra_seconds, extra_status_requests=extra_requests)
        if reason is EscalationReason.CALLBACK_UNDELIVERABLE:
            changes.update(completion_pending=True, next_poll_at=now)
            conn.execute(
                sa.update(STEPS)
                .where(
                    STEPS.c.operation_id == op.id,
                    STEPS.c.round == op.completion_round,
                    STEPS.c.status == "gave_up",
                )
                .values(status="pending", attempts=0, next_attempt_at=None)
            )
        else:
            base = max(op.deadline_at, now)
            changes.update(
                deadline_at=base + timedelta(seconds=extra_seconds),
                max_status_requests=op.max_status_requests + extra_requests,
                transport_failures_used=0,
                rate_limited_count=0,
                next_poll_at=now,
                delay_source=DelaySource.MANUAL_EXTENSION.value,
            )
            if op.remote_job_id is None:
                changes["create_deadline_at"] = now + timedelta(seconds=extra_seconds)
            if state in (State.CANCELLATION_UNCONFIRMED, State.CANCELLING) or (
                esc.resume_state == State.CANCELLING.value
            ):
                changes["cancel_deadline_at"] = now + timedelta(seconds=extra_seconds)
            target = State(esc.resume_state or State.OBSERVING.value)
    elif action is DecisionAction.CANCEL:
        # Cancelling authorizes the cancel call and the few reads that confirm it (the
        # budget may be spent, which is often why we are here), with fresh failure counts.
        confirm = int(
            offered.get(DecisionAction.EXTEND.value, {}).get(
                "extra_status_requests", escalations.DEFAULT_EXTRA_STATUS_REQUESTS
            )
        )
        changes.update(
            max_status_requests=max(op.max_status_requests, op.status_requests_used + confirm),
            transport_failures_used=0,
            rate_limited_count=0,
            cancel_requested_at=now,
            cancel_requested_by=who,
            cancel_reason=f"operator decision on {reason.value}",
            cancel_deadline_at=now + timedelta(seconds=cancel_deadline_seconds),
            cancel_sent_at=None,
            next_poll_at=now,
            delay_source=None,
        )
        target = State.CANCEL_REQUESTED
    else:  # abandon
        if state not in END_STATES:
            target = escalations.abandon_state(reason)
    conn.execute(
        sa.update(ESCALATIONS)
        .where(ESCALATIONS.c.id == esc.id, ESCALATIONS.c.decided_at.is_(None))
        .values(decided_at=now, decided_by=who, decision=record)
    )
    entry = Entry(
        kind=HistoryKind.DECISION,
        actor=who,
        cause=f"decision:{action.value}",
        detail={**entry_detail, **record},
        delay_source=DelaySource.MANUAL_EXTENSION if action is DecisionAction.EXTEND else None,
    )
    if target is None or target is state:
        return journal.write(conn, op, now=now, changes=changes, entries=[entry])
    if target in END_STATES and op.error is None:
        changes["error"] = {
            "code": f"abandoned_{reason.value}",
            "message": f"an operator abandoned the operation after {reason.value}",
        }
    return journal.transition(
        conn,
        op,
        target,
        actor=who,
        cause=f"decision:{action.value}",
        now=now,
        detail=entry_detail,
        changes=changes,
        before=[entry],
    )
