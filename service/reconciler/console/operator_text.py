"""The console's words for the operator: what stopped and why, what a decision did, what
was tried before.

Pure: records in, plain sentences out (the templates escape them). The agent is told
about the same facts in its own words (``core.operation_view``: what to report, which
URL to wait on); a person deciding at night needs other ones: what happened, what each
option does, and whether this operation has been here before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import jinja2

from reconciler.console.formatting import when
from reconciler.core.escalation import format_duration
from reconciler.core.records import EscalationRecord
from reconciler.core.states import State
from reconciler.core.vocabulary import DecisionAction, EscalationReason

R = EscalationReason

# What stopped, for each reason: the first thing an operator reads.
REASONS: dict[EscalationReason, str] = {
    R.DEADLINE_EXCEEDED: "The deadline passed and the provider has not reported an end.",
    R.REQUEST_BUDGET_EXHAUSTED: "Every allowed status read was spent and the job has not ended.",
    R.RATE_LIMITED: "The provider kept answering 429: too many requests.",
    R.UNKNOWN_STATE: "The provider reported a state its provider file does not name.",
    R.AUTHORIZATION_DENIED: "The provider refused this service's credentials.",
    R.PROVIDER_FAILURE: "The provider kept failing: errors or no answer at all.",
    R.CONTRACT_VIOLATION: "The provider answered in a way its provider file does not allow.",
    R.CONTRADICTORY_STATUS: "The provider's answers contradict each other.",
    R.CANCELLATION_UNCONFIRMED: "A cancel was sent; the provider did not confirm it in time.",
    R.CALLBACK_UNDELIVERABLE: "The job is finished, but the agent's callback was not delivered.",
    R.CREATE_UNKNOWN: "The answer to the create call was lost: a job may or may not exist.",
    R.INTERNAL_ERROR: "A step kept failing in a way nothing foresaw.",
}

# Where an operation stands, for every state but a pending decision (``summary``).
STATES: dict[State, str] = {
    State.CREATE_PENDING: "Starting: the job is being created at the provider.",
    State.CREATE_UNKNOWN: "Starting: the create call's answer was lost; finding out whether "
    "the job exists.",
    State.ACCEPTED: "Started: the provider accepted the job; its first status read is due.",
    State.OBSERVING: "Running at the provider; its status is read until it ends.",
    State.CANCEL_REQUESTED: "A cancel was asked for; it is being sent to the provider.",
    State.CANCELLING: "The cancel was sent; waiting for the provider to confirm it.",
    State.RESULT_COLLECTING: "The job ended at the provider; its result is being collected.",
    State.SUCCEEDED: "Finished: the job succeeded and its result was collected and checked.",
    State.COMPLETED_WITH_ERRORS: "Finished with errors: the job ran and some items failed.",
    State.FAILED: "Finished: the job failed; the error is below.",
    State.CANCELLED: "Finished: the job was cancelled at the provider.",
    State.RESULT_TIMED_OUT: "Stopped at the deadline: the job may still run at the provider.",
    State.RESULT_UNAVAILABLE: "Finished: the job ended but its result could not be fetched.",
    State.RESULT_VALIDATION_FAILED: "Finished: the job ended but its result failed the checks.",
    State.CANCELLATION_UNCONFIRMED: "Stopped: the provider never confirmed the cancel; the job "
    "may still run.",
    State.ESCALATED: "Stopped: an operator's decision is needed.",
}


def person(actor: str | None) -> str:
    """``operator:ana`` as the operator knows the name: ``ana``."""
    return (actor or "someone").removeprefix("operator:")


def _count(number: Any, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def what_was_decided(reason: str, record: Any) -> str:
    """A stored decision record as the deed: ``extended by 15 minutes and 4 status reads``."""
    if not isinstance(record, dict):
        return "decided"
    action = record.get("action")
    if action == DecisionAction.EXTEND.value:
        span = format_duration(float(record.get("extra_seconds") or 0))
        more = record.get("extra_status_requests") or 0
        if reason == R.CALLBACK_UNDELIVERABLE.value:
            return f"delivery extended by {span} and {_count(more, 'attempt')}"
        return f"extended by {span} and {_count(more, 'status read')}"
    deeds = {
        DecisionAction.CANCEL.value: "asked the provider to cancel",
        DecisionAction.ABANDON.value: "abandoned",
        DecisionAction.RESEND.value: "sent the create again, once",
        DecisionAction.RETRY.value: "ran the failed step again",
    }
    return deeds.get(str(action), f"decided {action}")


@dataclass(frozen=True)
class Decided:
    """One decision, as the console says it."""

    action: str
    what: str  # "extended by 15 minutes and 4 status reads"
    who: str  # "ana"
    at: datetime
    note: str | None

    @property
    def sentence(self) -> str:
        """``extended by 15 minutes and 4 status reads — ana, 2026-12-01 05:38:12 UTC``."""
        return f"{self.what} — {self.who}, {when(self.at)}"


def decided(esc: EscalationRecord) -> Decided | None:
    """The decision on ``esc``; None while it is open."""
    if esc.decided_at is None:
        return None
    record = esc.decision if isinstance(esc.decision, dict) else {}
    note = record.get("note")
    return Decided(
        action=str(record.get("action", "")),
        what=what_was_decided(esc.reason, record),
        who=person(esc.decided_by),
        at=esc.decided_at,
        note=note if isinstance(note, str) else None,
    )


@dataclass(frozen=True)
class Repeat:
    """An open escalation of an operation that was escalated and let go on before."""

    count: int  # escalations so far, the open one included
    last: Decided  # the latest decision
    tried: dict[str, list[Decided]]  # each action decided before, oldest first
    same_reason: bool  # the open escalation's reason is the last decided one's

    @property
    def sentence(self) -> str:
        last = self.last
        return (
            f"escalated again ({self.count} times; last decision: {last.what} at "
            f"{when(last.at)} by {last.who})"
        )

    def tried_text(self, action: str) -> str:
        """What an option already did here, or nothing."""
        before = self.tried.get(action, [])
        if not before:
            return ""
        times = "once" if len(before) == 1 else f"{len(before)} times"
        again = " and it stopped again the same way" if self.same_reason else ""
        return f"Tried {times} before: {before[-1].sentence}{again}."


def repeat_of(escalations: Sequence[EscalationRecord]) -> Repeat | None:
    """How the open escalation (the last of ``escalations``) repeats the earlier ones."""
    if not escalations or escalations[-1].decided_at is not None:
        return None
    pairs = [(e, d) for e in escalations[:-1] if (d := decided(e)) is not None]
    if not pairs:
        return None
    tried: dict[str, list[Decided]] = {}
    for _, found in pairs:
        tried.setdefault(found.action, []).append(found)
    last_esc, last = pairs[-1]
    return Repeat(
        count=len(escalations),
        last=last,
        tried=tried,
        same_reason=last_esc.reason == escalations[-1].reason,
    )


def why(esc: EscalationRecord) -> str:
    """The detail behind the reason, from the message's "Stopped because" line."""
    for line in esc.message.splitlines():
        if line.startswith("Stopped because:"):
            said = line.removeprefix("Stopped because:").strip()
            return said.removeprefix(esc.reason).removeprefix(" — ").strip()
    return ""


def stopped(esc: EscalationRecord) -> str:
    """What stopped, in words (the reason's code when it is one this console does not know)."""
    try:
        return REASONS[EscalationReason(esc.reason)]
    except ValueError:
        return f"Stopped: {esc.reason}."


def summary(state: str, awaiting_decision: bool) -> str:
    """Where the operation stands, in one sentence for the operator."""
    try:
        text = STATES[State(state)]
    except ValueError:
        return f"State: {state}."
    if awaiting_decision and state != State.ESCALATED.value:
        text += " An operator's decision is needed."
    return text


def install(env: jinja2.Environment) -> None:
    env.filters.update(stopped=stopped, why=why, decided=decided)
