"""What an operator decided, told to the agent whose job it is.

Pure. Once an escalation is decided, the Operation's message opens with the decision and
what the service does because of it, so that an agent whose wait ended on the decision
does not have to read ``escalation.decision`` to learn why the job moved
(docs/design.md#operation-view).
"""

from __future__ import annotations

from typing import Any

from reconciler.core.escalation import format_duration
from reconciler.core.records import EscalationRecord
from reconciler.core.vocabulary import DecisionAction, EscalationReason

_WHAT_NOW = {
    DecisionAction.CANCEL: (
        "An operator decided to cancel the job: the service asks the provider to cancel it."
    ),
    DecisionAction.ABANDON: (
        "An operator decided to stop waiting for the job (abandon): the service no longer "
        "watches it."
    ),
    DecisionAction.RESEND: (
        "An operator decided to send the job's create call again, with the same idempotency "
        "key, so no second job is made."
    ),
    DecisionAction.RETRY: "An operator decided to run the step that kept failing again.",
}


def _extension(decision: dict[str, Any], reason: str) -> str:
    if reason == EscalationReason.CALLBACK_UNDELIVERABLE:
        return "An operator decided to deliver the callback again; the job's outcome stands."
    seconds, checks = decision.get("extra_seconds"), decision.get("extra_status_requests")
    amounts = []
    if isinstance(seconds, int | float) and not isinstance(seconds, bool):
        amounts.append(f"by {format_duration(seconds)}")
    if isinstance(checks, int) and not isinstance(checks, bool):
        amounts.append(f"with {checks} more status requests")
    return (
        f"An operator decided to extend the waiting{' ' if amounts else ''}{' '.join(amounts)}: "
        "the service watches the job again."
    )


def decision_note(escalation: EscalationRecord | None) -> str:
    """The sentence that opens the message after ``escalation`` was decided ('' before)."""
    if escalation is None or escalation.decided_at is None:
        return ""
    decision = escalation.decision if isinstance(escalation.decision, dict) else {}
    try:
        action = DecisionAction(str(decision.get("action")))
    except ValueError:
        return "An operator decided what happens to the job (see `escalation.decision`)."
    if action is DecisionAction.EXTEND:
        return _extension(decision, escalation.reason)
    return _WHAT_NOW[action]
