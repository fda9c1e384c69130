"""Escalations: bounded options, the operator's message, and where stopping and resuming lead.

An escalation asks for a decision, not "continue?": every option is bounded
and states its cost (docs/design.md#escalation).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from reconciler.core.backoff import BackoffPolicy
from reconciler.core.clock import utc
from reconciler.core.outcome_parts import one_line
from reconciler.core.records import OperationRecord
from reconciler.core.states import END_STATES, State
from reconciler.core.vocabulary import DecisionAction, EscalationReason, TransportError

A = DecisionAction
R = EscalationReason


@dataclass(frozen=True, slots=True)
class ProviderTerms:
    """What an escalation needs of the operation's provider: how its waits grow (for the
    extension it proposes) and whether it can be asked to cancel."""

    backoff: BackoffPolicy
    can_cancel: bool


# An operation whose provider is no longer configured: default waits, no cancel call.
UNKNOWN_PROVIDER = ProviderTerms(backoff=BackoffPolicy(), can_cancel=False)

_ALL = (A.EXTEND, A.CANCEL, A.ABANDON)

# Why each row offers what it offers:
# - Waiting-related stops (deadline, budget, rate limit) and provider trouble
#   are cured by time, so a bounded extension makes sense next to ending it.
# - unknown_state: a person may allow a bounded pause while someone checks
#   what the provider's new state means.
# - contradictory_status: the next read may resolve the contradiction, but
#   only under a new, explicit limit.
# - authorization_denied: an identical request would be denied again, so the
#   extension is meant for after the credential or access has been fixed; a
#   cancel call would go out with the same refused credential, so none.
# - contract_violation: the integration no longer matches the provider;
#   more waiting cannot repair that, so only stopping (and cancelling the
#   remote work, when there is a job to cancel).
# - cancellation_unconfirmed: a cancel was already sent; another one is not an
#   option, waiting for its confirmation is.
# - callback_undeliverable: the result exists; only delivery is stuck.
# - create_unknown: a create that may have made a job, at a provider that takes no
#   idempotency key and cannot be asked: waiting finds nothing out, and a resend may
#   make a second job, so the person chooses between that risk and stopping.
# - internal_error: a step kept failing in a way nothing foresaw (core.step_retry). More
#   time cures nothing, but a fix (a new release, a provider back to its contract) may:
#   the person may run the step again with a fresh count, stop, or cancel the job.
OPTIONS: dict[EscalationReason, tuple[DecisionAction, ...]] = {
    R.DEADLINE_EXCEEDED: _ALL,
    R.REQUEST_BUDGET_EXHAUSTED: _ALL,
    R.RATE_LIMITED: _ALL,
    R.UNKNOWN_STATE: _ALL,
    R.AUTHORIZATION_DENIED: (A.EXTEND, A.ABANDON),
    R.PROVIDER_FAILURE: _ALL,
    R.CONTRACT_VIOLATION: (A.CANCEL, A.ABANDON),
    R.CONTRADICTORY_STATUS: _ALL,
    R.CANCELLATION_UNCONFIRMED: (A.EXTEND, A.ABANDON),
    R.CALLBACK_UNDELIVERABLE: (A.EXTEND, A.ABANDON),
    R.CREATE_UNKNOWN: (A.ABANDON, A.RESEND),
    R.INTERNAL_ERROR: (A.RETRY, A.CANCEL, A.ABANDON),
}

_TIMED_OUT = frozenset({R.DEADLINE_EXCEEDED, R.REQUEST_BUDGET_EXHAUSTED, R.RATE_LIMITED})

DEFAULT_EXTRA_SECONDS = 15 * 60
DEFAULT_EXTRA_STATUS_REQUESTS = 4
_DETAIL_LIMIT = 300
_FIELD_LIMIT = 120


def options_for(
    reason: EscalationReason,
    *,
    provider_can_cancel: bool,
    job_id_known: bool,
    job_may_run: bool = True,
) -> tuple[DecisionAction, ...]:
    """The bounded options for ``reason``; ``cancel`` needs a cancel action, a job id, and a
    job that may still run (not one the provider reported finished)."""
    cancellable = provider_can_cancel and job_id_known and job_may_run
    return tuple(a for a in OPTIONS[reason] if a is not A.CANCEL or cancellable)


def job_may_run(state: State) -> bool:
    """Whether the remote job may still be running: not once the provider reported its end
    (``result_collecting``, an end state), when cancelling it would be moot."""
    return state is not State.RESULT_COLLECTING and state not in END_STATES


def abandon_state(reason: EscalationReason) -> State:
    """Where ``abandon`` leads for an escalation of ``reason``."""
    if reason in _TIMED_OUT:
        return State.RESULT_TIMED_OUT
    if reason is R.CANCELLATION_UNCONFIRMED:
        return State.CANCELLATION_UNCONFIRMED
    return State.FAILED


def proposed_extension(backoff: BackoffPolicy) -> tuple[float, int]:
    """Default extension (extra_seconds, extra_status_requests) scaled to the provider's polling.

    Fifteen minutes with four checks (docs/design.md#decisions), widened so that four checks
    at the provider's capped cadence fit into the extra time.
    """
    checks = DEFAULT_EXTRA_STATUS_REQUESTS
    return max(float(DEFAULT_EXTRA_SECONDS), checks * backoff.max_seconds), checks


@dataclass(frozen=True)
class EscalationFacts:
    """Everything the message shows. Holds no secrets by construction."""

    operation_id: str
    provider: str
    reason: EscalationReason
    detail: str
    started_at: datetime
    now: datetime
    status_requests_used: int
    max_status_requests: int
    provider_job_id: str | None = None
    last_remote_state: str | None = None
    last_http_status: int | None = None
    last_http_at: datetime | None = None
    last_transport_error: TransportError | None = None  # set when the last call got no response
    extra_seconds: float = DEFAULT_EXTRA_SECONDS
    extra_status_requests: int = DEFAULT_EXTRA_STATUS_REQUESTS


def format_duration(seconds: float) -> str:
    """Two units at most: '45 seconds', '40 minutes', '2 hours 5 minutes', '3 days 4 hours'."""
    total = max(0, int(seconds))
    units = (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1))
    # Days only from two days on: "30 hours" reads better than "1 day 6 hours".
    start = 0 if total >= 2 * 86400 else 1
    for index in range(start, len(units)):
        name, size = units[index]
        if total >= size or size == 1:
            first = _plural(total // size, name)
            if index + 1 == len(units):
                return first
            sub_name, sub_size = units[index + 1]
            rest = (total % size) // sub_size
            return f"{first} {_plural(rest, sub_name)}" if rest else first
    return _plural(total, "second")  # pragma: no cover - the loop always returns


def describe_option(facts: EscalationFacts, action: DecisionAction) -> str:
    """One option with its cost, as the operator reads it."""
    if action is A.CANCEL:
        return "cancel at provider (stops future work; finished work is not undone)"
    if action is A.RETRY:
        return (
            "retry the step that failed, with its failure count started afresh (if it keeps "
            "failing the same way it stops and asks again)"
        )
    if action is A.RESEND:
        return (
            "resend the create once with the same request (the provider takes no "
            "idempotency key: if the lost create made a job, a duplicate job may result)"
        )
    if action is A.ABANDON:
        verb = "stop delivering" if facts.reason is R.CALLBACK_UNDELIVERABLE else "stop waiting"
        return f"abandon ({verb}; the operation ends as {abandon_state(facts.reason).value})"
    span = format_duration(facts.extra_seconds)
    count = facts.extra_status_requests
    if facts.reason is R.CALLBACK_UNDELIVERABLE:
        return f"extend delivery once by {span} with {_plural(count, 'additional attempt')}"
    text = f"extend waiting once by {span} with {_plural(count, 'additional check')}"
    if facts.reason is R.AUTHORIZATION_DENIED:
        text += (
            " (only after the credential or access has been fixed; "
            "an identical request will be denied again)"
        )
    elif facts.reason is R.CANCELLATION_UNCONFIRMED:
        text += " for the cancellation to be confirmed"
    return text


def options_payload(
    facts: EscalationFacts, options: tuple[DecisionAction, ...]
) -> list[dict[str, Any]]:
    """The options as JSON for the escalation record and the Operation's ``escalation``."""
    payload: list[dict[str, Any]] = []
    for action in options:
        entry: dict[str, Any] = {
            "action": action.value,
            "description": describe_option(facts, action),
        }
        if action is A.EXTEND:
            entry["extra_seconds"] = facts.extra_seconds
            entry["extra_status_requests"] = facts.extra_status_requests
        payload.append(entry)
    return payload


def render_message(facts: EscalationFacts, options: tuple[DecisionAction, ...]) -> str:
    """The escalation message (docs/design.md#escalation-message): one fact per line."""
    job = one_line(facts.provider_job_id or "", _FIELD_LIMIT) or "not known yet"
    state = one_line(facts.last_remote_state or "", _FIELD_LIMIT) or "not observed"
    detail = one_line(facts.detail or "", _DETAIL_LIMIT)
    because = f"{facts.reason.value} — {detail}" if detail else facts.reason.value
    safe = "; ".join(describe_option(facts, a) for a in options) or "none"
    lines = [
        "External job needs a decision",
        f"Operation: {one_line(facts.operation_id, _FIELD_LIMIT)}",
        f"Provider job: {job} (provider {one_line(facts.provider, _FIELD_LIMIT)})",
        f"Last state: {state}",
        f"Elapsed time: {format_duration((facts.now - facts.started_at).total_seconds())}",
        f"Status requests: {facts.status_requests_used} of {facts.max_status_requests}",
        f"Last HTTP result: {_last_result(facts)}",
        f"Stopped because: {because}",
        f"Safe options: {safe}",
    ]
    return "\n".join(lines)


def _last_result(facts: EscalationFacts) -> str:
    if facts.last_transport_error is not None:
        what = f"no response ({facts.last_transport_error.value})"
    elif facts.last_http_status is not None:
        what = str(facts.last_http_status)
    else:
        return "none"
    if facts.last_http_at is None:
        return what
    return f"{what} at {_clock_time(facts.last_http_at, facts.now)}"


def _clock_time(when: datetime, now: datetime) -> str:
    at = utc(when)
    if at.date() == utc(now).date():
        return at.strftime("%H:%M UTC")
    return at.strftime("%Y-%m-%d %H:%M UTC")


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


# Where an escalation leaves the operation, when it is not simply `escalated`.
_STOP_STATES = {
    EscalationReason.DEADLINE_EXCEEDED: State.RESULT_TIMED_OUT,
    EscalationReason.CANCELLATION_UNCONFIRMED: State.CANCELLATION_UNCONFIRMED,
}


def resume_state(op: OperationRecord, reason: EscalationReason) -> State:
    """Where an operator's ``extend`` (or an ``internal_error``'s ``retry``) takes the
    operation back to."""
    state = State(op.state)
    if op.remote_job_id is None:
        return State.CREATE_UNKNOWN
    again = (EscalationReason.INTERNAL_ERROR, EscalationReason.AUTHORIZATION_DENIED)
    if reason in again and state is State.RESULT_COLLECTING:
        return State.RESULT_COLLECTING  # the collection runs again, not a status read
    if reason is EscalationReason.CANCELLATION_UNCONFIRMED or state in (
        State.CANCELLING,
        State.CANCELLATION_UNCONFIRMED,
    ):
        return State.CANCELLING
    if state is State.CANCEL_REQUESTED:
        return State.CANCEL_REQUESTED
    return State.OBSERVING


def facts_for(
    op: OperationRecord,
    backoff: BackoffPolicy,
    reason: EscalationReason,
    detail: str,
    now: datetime,
    transport_error: TransportError | None = None,
) -> EscalationFacts:
    extra_seconds, extra_requests = proposed_extension(backoff)
    return EscalationFacts(
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


def stop_state(reason: EscalationReason) -> State:
    """Where an escalation leaves an operation that is not yet in an end state."""
    return _STOP_STATES.get(reason, State.ESCALATED)
