"""When a running operation is "at risk": its deadline, budget or transport failures nearly
spent, or the trouble that stopped it before back again.

Pure: an operation, the reason of its last escalation and the time in, the risks
out. The thresholds are fractions declared once here, and so are the counters that
say a trouble is back (``AGAIN``); ``storage.inbox`` builds its SQL filter from the
same numbers and names, so the inbox's list and the labels it shows cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from fractions import Fraction

from reconciler.core.records import OperationRecord
from reconciler.core.states import END_STATES, State
from reconciler.core.vocabulary import EscalationReason

# At risk when at most this share of the deadline window is left ...
DEADLINE_LEFT = Fraction(1, 5)
# ... or at least this share of the status-request budget is used ...
BUDGET_USED = Fraction(4, 5)
# ... or at least this share of the transport-failure budget (and at least one failure).
TRANSPORT_USED = Fraction(2, 3)

# An operation an operator let go on after an escalation of one of these reasons is at
# risk as soon as the counter that stopped it counts again (a 429 after a rate-limited
# extension): it is failing the same way, and will stop the same way.
AGAIN: dict[EscalationReason, str] = {
    EscalationReason.RATE_LIMITED: "rate_limited_count",
    EscalationReason.PROVIDER_FAILURE: "transport_failures_used",
}
_AGAIN_WORDS = {
    EscalationReason.RATE_LIMITED: "429 again ({count} in a row) after the rate_limited decision",
    EscalationReason.PROVIDER_FAILURE: (
        "failing again ({count} transport failures) after the provider_failure decision"
    ),
}

# Running states: an escalated operation is already in the inbox's first list.
WATCHED: frozenset[State] = frozenset(State) - END_STATES - {State.ESCALATED}


@dataclass(frozen=True)
class Risk:
    kind: str  # "deadline" | "budget" | "transport" | "again"
    text: str


def risks(op: OperationRecord, now: datetime, last_reason: str | None = None) -> list[Risk]:
    """What is nearly spent on a running operation, or failing again the way its last
    escalation (of ``last_reason``) stopped it; empty when nothing is, or it is not running."""
    if State(op.state) not in WATCHED:
        return []
    found: list[Risk] = _again(op, last_reason)
    window = (op.deadline_at - op.created_at).total_seconds()
    left = (op.deadline_at - now).total_seconds()
    if window > 0 and left <= window * DEADLINE_LEFT:
        text = "deadline passed" if left <= 0 else f"{_percent(left / window)} of the time left"
        found.append(Risk("deadline", text))
    budget = op.max_status_requests
    if budget > 0 and op.status_requests_used >= budget * BUDGET_USED:
        found.append(
            Risk(
                "budget",
                f"{op.status_requests_used} of {op.max_status_requests} status requests used",
            )
        )
    if (
        op.transport_failures_used > 0
        and op.transport_failures_used >= op.max_transport_failures * TRANSPORT_USED
    ):
        found.append(
            Risk(
                "transport",
                f"{op.transport_failures_used} of {op.max_transport_failures} transport failures",
            )
        )
    return found


def _again(op: OperationRecord, last_reason: str | None) -> list[Risk]:
    if last_reason is None or op.escalation_open:
        return []
    try:
        reason = EscalationReason(last_reason)
    except ValueError:
        return []
    column = AGAIN.get(reason)
    count = int(getattr(op, column)) if column is not None else 0
    if count <= 0:
        return []
    return [Risk("again", _AGAIN_WORDS[reason].format(count=count))]


def _percent(share: float) -> str:
    return f"{max(0, round(share * 100))}%"
