"""Planning an operator's decision on an escalation: only what was offered, once.

Guarantee: an escalation asks for a bounded decision (docs/design.md#decisions). An extension
is a new authorization with a new deadline and extra status requests (delay
source ``manual_extension``), at most what the escalation offered: the offer
states the cost, and an amount beyond it would be an authorization nobody was
shown (a 400 naming the field, before any arithmetic could overflow). The
failure and rate-limit counters start again because the operator accepted the
risk anew. Pure: the operation, its open
escalation and the request in, a plan out (or ``DecisionNotAllowed``, decided
before anything is written); ``commands.decide`` writes the plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from reconciler.core import escalation
from reconciler.core.errors import DecisionNotAllowed, InvalidRequest
from reconciler.core.records import EscalationRecord, OperationRecord
from reconciler.core.states import END_STATES, REOPENABLE, State, allowed
from reconciler.core.vocabulary import DecisionAction, DelaySource, EscalationReason


@dataclass(frozen=True)
class DecisionRequest:
    """What an operator asked for; amounts only for ``extend``; ``note``: why, in their words."""

    action: DecisionAction
    extra_seconds: float | None = None
    extra_status_requests: int | None = None
    note: str | None = None


@dataclass(frozen=True)
class DecisionPlan:
    """Everything the decision writes, in one transaction."""

    action: DecisionAction
    escalation_id: int
    target: State | None  # None: the state stays (an end state keeps its outcome)
    changes: dict[str, Any]
    record: dict[str, Any]  # stored on the escalation as the decision
    detail: dict[str, Any]  # the history entries' detail
    reopen_given_up_steps: bool = False
    delay_source: DelaySource | None = field(default=None)


def _offered(esc: EscalationRecord) -> dict[str, dict[str, Any]]:
    return {str(o["action"]): o for o in esc.options}


def _amount(asked: float | None, offered: float, name: str) -> float:
    """The operator's amount, or the offered one; never more than was offered."""
    if asked is None:
        return offered
    if not asked > 0:  # also refuses NaN
        raise InvalidRequest(f"'{name}' must be greater than 0")
    if asked > offered:
        raise InvalidRequest(
            f"'{name}' may be at most {offered:g}, what the escalation offered; "
            "a larger extension is not one of the options"
        )
    return asked


def extension_amounts(option: dict[str, Any], request: DecisionRequest) -> tuple[float, int]:
    """(extra_seconds, extra_status_requests) for an ``extend``: the offer's, or less."""
    seconds = float(option.get("extra_seconds", escalation.DEFAULT_EXTRA_SECONDS))
    checks = int(option.get("extra_status_requests", escalation.DEFAULT_EXTRA_STATUS_REQUESTS))
    extra_seconds = _amount(request.extra_seconds, seconds, "extra_seconds")
    extra_requests = _amount(request.extra_status_requests, checks, "extra_status_requests")
    return extra_seconds, int(extra_requests)


def _extend_changes(
    op: OperationRecord,
    esc: EscalationRecord,
    now: datetime,
    extra_seconds: float,
    extra_requests: int,
) -> dict[str, Any]:
    """A new authorization: a later deadline, more status requests, fresh failure counts."""
    extra = timedelta(seconds=extra_seconds)
    changes: dict[str, Any] = {
        "deadline_at": max(op.deadline_at, now) + extra,
        "max_status_requests": op.max_status_requests + extra_requests,
        "transport_failures_used": 0,
        "rate_limited_count": 0,
        "next_poll_at": now,
        "delay_source": DelaySource.MANUAL_EXTENSION.value,
    }
    if op.remote_job_id is None:
        changes["create_deadline_at"] = now + extra
    if State(op.state) in (State.CANCELLATION_UNCONFIRMED, State.CANCELLING) or (
        esc.resume_state == State.CANCELLING.value
    ):
        changes["cancel_deadline_at"] = now + extra
    return changes


def _cancel_changes(
    op: OperationRecord,
    offered: dict[str, dict[str, Any]],
    reason: EscalationReason,
    who: str,
    now: datetime,
    cancel_deadline_seconds: float,
) -> dict[str, Any]:
    """Cancelling authorizes the cancel call and the few reads that confirm it (the budget
    may be spent, which is often why we are here), with fresh failure counts."""
    confirm = int(
        offered.get(DecisionAction.EXTEND.value, {}).get(
            "extra_status_requests", escalation.DEFAULT_EXTRA_STATUS_REQUESTS
        )
    )
    return {
        "max_status_requests": max(op.max_status_requests, op.status_requests_used + confirm),
        "transport_failures_used": 0,
        "rate_limited_count": 0,
        "cancel_requested_at": now,
        "cancel_requested_by": who,
        "cancel_reason": f"operator decision on {reason.value}",
        "cancel_deadline_at": now + timedelta(seconds=cancel_deadline_seconds),
        "cancel_sent_at": None,
        "next_poll_at": now,
        "delay_source": None,
    }


def plan_resend(
    op: OperationRecord, now: datetime, record: dict[str, Any], changes: dict[str, Any]
) -> None:
    """A resend of a create_unknown's create: authorized for the next attempt only.

    The record keeps the attempt count it was given at; the create step resends only
    while no attempt has been counted since, so one decision sends at most one create,
    also across a crash. The create window (and the operation's deadline, when it has
    passed) is opened again for that one call and what follows it.
    """
    if op.remote_job_id is not None:
        raise DecisionNotAllowed(f"operation {op.id} already has a job; nothing to resend")
    window = timedelta(seconds=escalation.DEFAULT_EXTRA_SECONDS)
    record["create_attempts"] = op.create_attempts
    changes.update(
        create_deadline_at=max(op.create_deadline_at, now + window),
        deadline_at=max(op.deadline_at, now + window),
        transport_failures_used=0,
        rate_limited_count=0,
        next_poll_at=now,
        delay_source=None,
    )


def plan_retry(
    op: OperationRecord, esc: EscalationRecord, now: datetime, changes: dict[str, Any]
) -> State | None:
    """An ``internal_error``'s step run again, with its failure count started afresh.

    Not an extension: the deadline and the budgets stay as they are (a retry past the
    deadline stops at it, as any step would). The operation goes back to the state whose
    step failed (``resume_state``); a completion that failed in an end state runs again.
    """
    changes.update(step_failures=0, failed_step=None, next_poll_at=now, delay_source=None)
    if State(op.state) in END_STATES:
        changes["completion_pending"] = True
        return None
    return State(esc.resume_state or State.OBSERVING.value)


def _plan_abandon(state: State, reason: EscalationReason, changes: dict[str, Any]) -> State | None:
    """Where ``abandon`` leads; an end state stands (a completion that kept failing stops)."""
    if state not in END_STATES:
        return escalation.abandon_state(reason)
    if reason is EscalationReason.INTERNAL_ERROR:
        changes.update(completion_pending=False, next_poll_at=None)
    return None


def plan_decision(
    op: OperationRecord,
    esc: EscalationRecord | None,
    request: DecisionRequest,
    who: str,
    now: datetime,
    cancel_deadline_seconds: float,
) -> DecisionPlan:
    if esc is None:
        raise DecisionNotAllowed(
            f"operation {op.id} has no open escalation to decide"
            + (" (it was already decided)" if op.escalation_id is not None else "")
        )
    offered = _offered(esc)
    action = request.action
    if action.value not in offered:
        raise DecisionNotAllowed(
            f"'{action.value}' was not offered for this escalation ({esc.reason}); "
            f"offered: {', '.join(offered)}"
        )
    reason = EscalationReason(esc.reason)
    state = State(op.state)
    record: dict[str, Any] = {"action": action.value}
    changes: dict[str, Any] = {}
    target: State | None = None
    reopen = False
    if action is DecisionAction.EXTEND:
        extra_seconds, extra_requests = extension_amounts(offered[action.value], request)
        record.update(extra_seconds=extra_seconds, extra_status_requests=extra_requests)
        if reason is EscalationReason.CALLBACK_UNDELIVERABLE:
            changes.update(completion_pending=True, next_poll_at=now)
            reopen = True
        else:
            changes.update(_extend_changes(op, esc, now, extra_seconds, extra_requests))
            target = State(esc.resume_state or State.OBSERVING.value)
    elif action is DecisionAction.RESEND:
        plan_resend(op, now, record, changes)
        target = State.CREATE_UNKNOWN
    elif action is DecisionAction.RETRY:
        target = plan_retry(op, esc, now, changes)
    elif action is DecisionAction.CANCEL:
        changes.update(_cancel_changes(op, offered, reason, who, now, cancel_deadline_seconds))
        target = State.CANCEL_REQUESTED
    else:
        target = _plan_abandon(state, reason, changes)
    if request.note is not None:
        # Stored in the escalation's record and the history entry: the audit chain covers it.
        record["note"] = request.note
    if target is state:
        target = None
    if target is not None and not allowed(state, target):
        raise DecisionNotAllowed(
            f"'{action.value}' cannot be applied while the operation is {state.value}"
        )
    # Abandoning ends the operation: an end state that a decision could reopen says why too.
    ending = target in END_STATES or (
        action is DecisionAction.ABANDON
        and state in REOPENABLE
        and reason is not EscalationReason.CALLBACK_UNDELIVERABLE
    )
    if ending and op.error is None:
        changes["error"] = {
            "code": f"abandoned_{reason.value}",
            "message": f"an operator abandoned the operation after {reason.value}",
        }
    return DecisionPlan(
        action=action,
        escalation_id=esc.id or 0,
        target=target,
        changes=changes,
        record=record,
        detail={"escalation_id": esc.id, "reason": reason.value},
        reopen_given_up_steps=reopen,
        delay_source=DelaySource.MANUAL_EXTENSION if action is DecisionAction.EXTEND else None,
    )
