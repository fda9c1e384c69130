"""The provider's cancel call and the window that watches it (docs/design.md#cancel): pure.

The cancel step sends the call once (``send_or_watch``), reads what the answer means
(``cancel_answer``) and sets the first status read that may confirm it (``first_read``,
``answer_floor``); the status reads then watch the cancellation until its window closes
(``window_closed``, ``cancel_window_read``), where the window that ran out is the cancel
window, not the job's deadline (``stop_reason``). Sending a cancel is not "cancelled":
only the provider's own terminal state decides. A refused cancel is not a sent cancel
either: the job goes on, and the refusal is kept (``refusal_record``) for the answer.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from reconciler.core.backoff import parse_retry_after
from reconciler.core.clock import isoformat
from reconciler.core.create import body_text
from reconciler.core.outcome_parts import provider_message
from reconciler.core.poll_values import Observation, PollPolicy, Stop, Wait
from reconciler.core.provider_calls import CallResult
from reconciler.core.records import OperationRecord
from reconciler.core.states import State
from reconciler.core.vocabulary import RETRYABLE_4XX, DelaySource, EscalationReason

ALREADY_SENT = "cancel call already sent earlier"
NO_CANCEL_ACTION = "the provider has no cancel action; watching for its own outcome"


def send_or_watch(op: OperationRecord, can_cancel: bool) -> str | None:
    """None when the cancel step sends the provider's cancel call; otherwise why it only
    watches: sent already by an earlier owner (at most once), or nothing we can send."""
    if op.cancel_sent_at is not None:
        return ALREADY_SENT
    if not can_cancel or op.remote_job_id is None:
        return NO_CANCEL_ACTION
    return None


class CancelAnswer(StrEnum):
    """What the provider's answer to a cancel call means."""

    ACCEPTED = "accepted"  # taken: watch for the provider's cancelled state
    REFUSED = "refused"  # a definitive no: the job goes on, and the agent is told why
    DENIED = "denied"  # 401/403: this service's credential was refused, not the cancel
    NOT_TAKEN = "not_taken"  # never delivered, or "not now" (408, 425, 429): send it again
    UNCLEAR = "unclear"  # it may have landed (a 5xx, no answer after sending): watch


def cancel_answer(call: CallResult, refused_by_file: bool = False) -> CancelAnswer:
    """What ``call`` (the cancel) came to; ``refused_by_file``: the answer is the one the
    provider file's ``[cancel] refused`` names, whatever its status."""
    if call.denied:
        return CancelAnswer.DENIED
    if refused_by_file or call.refused:
        # An adapter that would not send (a job id no path can carry) refuses every time.
        return CancelAnswer.REFUSED
    if not call.maybe_delivered or call.rate_limited:
        return CancelAnswer.NOT_TAKEN
    status = call.http_status
    if status is None:
        return CancelAnswer.UNCLEAR
    if 200 <= status < 300:
        return CancelAnswer.ACCEPTED
    if status in RETRYABLE_4XX:
        return CancelAnswer.NOT_TAKEN
    if 400 <= status < 500:
        return CancelAnswer.REFUSED
    return CancelAnswer.UNCLEAR


def refusal_record(call: CallResult, now: datetime) -> dict[str, Any]:
    """What the operation keeps of a refused cancel: the status and the provider's words."""
    said = None
    if call.refused:
        said = f"not sent: {call.refused}"
    elif call.body is not None:
        said = provider_message(call.body)
    else:
        said = body_text(call.body_bytes)
    return {"http_status": call.http_status, "provider_message": said, "at": isoformat(now)}


def resend_at(op: OperationRecord, now: datetime, base_delay_seconds: float) -> datetime:
    """When a cancel the provider did not take is sent again: as long again as it has been
    asked for (so the tries thin out without a counter), at least one backoff base."""
    asked = op.cancel_requested_at or now
    wait = max(timedelta(seconds=base_delay_seconds), now - asked)
    return now + wait


def first_read(
    now: datetime, base_delay_seconds: float, retry_not_before: datetime | None
) -> tuple[datetime, DelaySource]:
    """The status read that may confirm a cancel: one backoff base away, but not before
    the last status answer's Retry-After, which still holds for the next status read."""
    first = now + timedelta(seconds=base_delay_seconds)
    if retry_not_before is not None and retry_not_before > first:
        return retry_not_before, DelaySource.PROVIDER_RETRY_AFTER
    return first, DelaySource.LOCAL_BACKOFF


def answer_floor(read_at: datetime, now: datetime, retry_after: str | None) -> datetime | None:
    """The moment the cancel answer asked to wait until (Retry-After, retry-after-ms, a
    rate-limit reset), when it is later than the read set: that read waits for it."""
    wait = parse_retry_after(retry_after, now)
    if wait is not None and now + wait > read_at:
        return now + wait
    return None


def window_closed(op: OperationRecord, now: datetime) -> bool:
    """A cancellation whose window has run out: the next read is its last look."""
    return (
        State(op.state) is State.CANCELLING
        and op.cancel_deadline_at is not None
        and now >= op.cancel_deadline_at
    )


def stop_reason(reason: EscalationReason, state: State) -> EscalationReason:
    """The reason an operation in ``state`` escalates with for ``reason``."""
    if reason is EscalationReason.DEADLINE_EXCEEDED and state is State.CANCELLING:
        # In a cancellation watch the window that ran out is the cancel window.
        return EscalationReason.CANCELLATION_UNCONFIRMED
    return reason


def closed_stop(op: OperationRecord, held: str | None) -> Stop:
    """The escalation of a cancel window that closed without a look (``held``: the
    provider's Retry-After still runs)."""
    return Stop(
        EscalationReason.CANCELLATION_UNCONFIRMED,
        f"no cancelled state by {isoformat(op.cancel_deadline_at)}" + (held or ""),
    )


def unconfirmed(op: OperationRecord, obs: Observation, wait: Wait) -> Stop:
    """The last look after the cancel window showed no end state: the cancel is unconfirmed."""
    return Stop(
        EscalationReason.CANCELLATION_UNCONFIRMED,
        f"no cancelled state by {isoformat(op.cancel_deadline_at)}; a last status "
        f"read after the window still said {obs.remote_state or 'no state'}",
        wait.counters,
    )


def cancel_window_read(
    at: datetime,
    source: DelaySource,
    close: datetime,
    floor: datetime | None,
    policy: PollPolicy,
) -> tuple[datetime, DelaySource]:
    """When a cancelling operation reads next: by its cancel window's ``close`` at the
    latest, where the last look settles it.

    That look is a status request like any other, so a Retry-After ``floor`` past the
    close holds it back (the decision for the answer capped it at the close), for at most
    the longest wait of our own between two reads (the backoff's cap, the wait after a
    429): further off, the read stays at the close, and the step escalates there
    without a request.
    """
    bound = max(policy.backoff.max_seconds, policy.rate_limit_delay_seconds)
    if floor is not None and close < floor <= close + timedelta(seconds=bound):
        return floor, DelaySource.PROVIDER_RETRY_AFTER
    return min(at, close), source
