"""The next status read: when, and why then (docs/design.md#next-read). Pure.

Delay precedence after a pending answer: ``Retry-After`` is a minimum on any response >
a validated provider hint > capped exponential backoff with jitter. A ``Wait`` is never
before ``now`` and never after the deadline; when ``Retry-After`` itself reaches past
the deadline no legal request is left, so the wait ends at the deadline and that wake
stops with ``deadline_exceeded`` before sending anything (``core.poll.before_request``).

Webhook trust (docs/design.md#webhook-trust) changes two things, both values of the
policy and of the decision:

* while the provider's webhooks are trusted (``trusted=True``) a pending read waits a
  jittered ``trusted_max_delay_seconds`` instead of the backoff (source
  ``webhook_trust``), from the first read after the create on; ``Retry-After`` and
  valid provider hints stay minimums; the deadline and budgets are unchanged;
* with ``final_look_seconds`` set, a read that would fall in the last
  ``final_look_seconds`` before the deadline, or past it, is made at the start of that
  window instead (never before a minimum, never at or after the deadline): one last
  look, so a job that finished in time is not timed out because its webhook was lost.

``restore`` is the way back: the wait a stretched operation gets on its normal
schedule when trust is withdrawn. ``after_answer`` is the read as the row then holds
it: a cancel window's close, a hint that came while we asked, a cancel to send.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from reconciler.core.backoff import parse_retry_after
from reconciler.core.cancel import cancel_window_read
from reconciler.core.clock import isoformat, utc
from reconciler.core.poll_values import (
    Counters,
    Decision,
    Observation,
    PollPolicy,
    PollRecord,
    Stop,
    Wait,
    describe,
    show,
)
from reconciler.core.records import OperationRecord
from reconciler.core.states import State
from reconciler.core.vocabulary import DelaySource, EscalationReason

_RFC3339 = re.compile(
    r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})$"
)


@dataclass(frozen=True)
class Restored:
    """A stretched wait brought back to the normal schedule (trust withdrawn)."""

    at: datetime
    source: DelaySource
    final_look: bool = False


@dataclass(frozen=True)
class NextRead:
    """The read after a pending answer, as the row is written: when, why, and the
    provider hint's moment, kept only for a stretched wait (trust may be withdrawn)."""

    at: datetime
    source: DelaySource
    hint_not_before: datetime | None = None


def first_poll_at(
    now: datetime, deadline_at: datetime, rng: random.Random, policy: PollPolicy
) -> datetime:
    """First status read after acceptance: backoff at attempt 0 (local_backoff), capped."""
    return first_poll(now, deadline_at, rng, policy)[0]


def first_poll(
    now: datetime,
    deadline_at: datetime,
    rng: random.Random,
    policy: PollPolicy,
    *,
    trusted: bool = False,
) -> tuple[datetime, DelaySource]:
    """First status read after acceptance, and why then.

    The create answer is the first observation: while webhooks are trusted the first
    fallback read is already stretched (a failure is announced by a webhook like a
    success). Otherwise backoff at attempt 0. Never past the deadline; the final look
    applies as to every read.
    """
    stretched = policy.stretched_delay(rng) if trusted else None
    if stretched is not None:
        at, source = now + timedelta(seconds=stretched), DelaySource.WEBHOOK_TRUST
    else:
        at = now + timedelta(seconds=policy.backoff.delay(0, rng))
        source = DelaySource.LOCAL_BACKOFF
    at, _ = final_look(at, now, deadline_at, None, policy)
    return max(now, min(at, deadline_at)), source


def final_look(
    at: datetime,
    now: datetime,
    deadline_at: datetime,
    floor: datetime | None,
    policy: PollPolicy,
) -> tuple[datetime, bool]:
    """Pull a read that falls in the last ``final_look_seconds`` (or later) to their start.

    Returns the moment and whether it is the final look. Nothing changes when there is
    no final look in the policy, when we are already inside that window (the read just
    made was the last look), or when a minimum (``floor``) leaves no moment before the
    deadline.
    """
    lead = policy.final_look_seconds
    if lead is None:
        return at, False
    look = deadline_at - timedelta(seconds=lead)
    if now >= look or at <= look:
        return at, False
    target = look if floor is None else max(look, floor)
    if target >= deadline_at:
        return at, False
    return max(target, now), True


def restore(
    record: PollRecord,
    last_read_at: datetime,
    stretched_at: datetime,
    hint_at: datetime | None,
    retry_not_before: datetime | None,
    slot_at: datetime,
    now: datetime,
    rng: random.Random,
    policy: PollPolicy,
) -> Restored:
    """The next read of an operation whose stretched wait trust no longer justifies.

    Its normal schedule: the backoff for the polls it has made, from its last read; but
    not before its ``slot_at`` in the spread (so many operations coming back at once are
    no burst), never later than the stretched read it had, never before the provider's
    guidance (a valid hint's moment ``hint_at``, the ``Retry-After`` moment), and with the
    final look before the deadline.
    """
    normal = last_read_at + timedelta(seconds=policy.backoff.delay(record.poll_attempt, rng))
    at = min(max(normal, slot_at, now), stretched_at)
    source = DelaySource.LOCAL_BACKOFF
    if hint_at is not None and hint_at > at:
        at, source = hint_at, DelaySource.PROVIDER_POLL_HINT
    if retry_not_before is not None and retry_not_before > at:
        at, source = retry_not_before, DelaySource.PROVIDER_RETRY_AFTER
    floors = [f for f in (hint_at, retry_not_before) if f is not None]
    at, look = final_look(at, now, record.deadline_at, max(floors) if floors else None, policy)
    return Restored(min(at, record.deadline_at), source, look)


def schedule(
    record: PollRecord,
    obs: Observation,
    now: datetime,
    counters: Counters,
    delay_seconds: float,
    notes: list[str],
    policy: PollPolicy,
    *,
    hints: bool,
    stretched: float | None = None,
) -> Decision:
    """The wait after an answer, ``delay_seconds`` of our own unless the provider's guidance
    says otherwise (``hints``: a pending answer's hints count); or the stop at the
    deadline or the spent budget."""
    # Stop now rather than schedule a read that before_request would refuse:
    # the history then shows the response that ended the run.
    if now >= record.deadline_at:
        return Stop(
            EscalationReason.DEADLINE_EXCEEDED,
            f"deadline {isoformat(record.deadline_at)} passed; last response: {describe(obs)}",
            counters,
        )
    if record.status_requests_used >= record.max_status_requests:
        return Stop(
            EscalationReason.REQUEST_BUDGET_EXHAUSTED,
            f"{record.status_requests_used} of {record.max_status_requests} status requests "
            f"used; last response: {describe(obs)}",
            counters,
        )
    room = record.deadline_at - now
    delay = _delay(obs, now, room, delay_seconds, stretched, notes, hints=hints)
    offset, source = delay.offset, delay.source
    if source is DelaySource.WEBHOOK_TRUST:
        notes.append(
            f"wait stretched to {offset.total_seconds():.0f} s: the provider's webhooks are "
            "trusted, so this read is only a fallback"
        )
    at = now + max(offset, timedelta(0)) if offset <= room else record.deadline_at
    looked, final = final_look(at, now, record.deadline_at, delay.floor_at, policy)
    if final:
        notes.append(
            f"final look at {isoformat(looked)}, before the deadline "
            f"{isoformat(record.deadline_at)}"
        )
        return Wait(looked, source, tuple(notes), counters, final_look=True, hint_at=delay.hint_at)
    if offset > room and source is not DelaySource.PROVIDER_RETRY_AFTER:
        notes.append(f"next read capped at the deadline {isoformat(record.deadline_at)}")
    return Wait(at, source, tuple(notes), counters, hint_at=delay.hint_at)


@dataclass(frozen=True)
class _Delay:
    offset: timedelta
    source: DelaySource
    hint_at: datetime | None  # a valid provider hint's moment
    floor_at: datetime | None  # the latest minimum (hint, Retry-After) before the deadline


def _delay(
    obs: Observation,
    now: datetime,
    room: timedelta,
    delay_seconds: float,
    stretched: float | None,
    notes: list[str],
    *,
    hints: bool,
) -> _Delay:
    """How long to wait and why: Retry-After > valid hint > stretched wait or backoff."""
    # Anything beyond the deadline is capped by the caller; bounding first keeps timedelta
    # in range. While webhooks are trusted the read is only a fallback: the backoff gives way.
    wanted = stretched if stretched is not None else delay_seconds
    offset = timedelta(seconds=min(wanted, room.total_seconds() + 1.0))
    source = DelaySource.WEBHOOK_TRUST if stretched is not None else DelaySource.LOCAL_BACKOFF
    floor: timedelta | None = None
    hint_at: datetime | None = None
    hint = _provider_hint(obs, now, room, notes) if hints else None
    if hint is not None:
        floor, hint_at = hint, now + hint
        # Without trust a valid hint replaces the backoff; with it, it is a minimum.
        if stretched is None or hint >= offset:
            offset, source = hint, DelaySource.PROVIDER_POLL_HINT
    minimum = _retry_after(obs.retry_after, now, notes)
    if minimum is not None:
        floor = minimum if floor is None else max(floor, minimum)
        if minimum >= offset:
            offset, source = minimum, DelaySource.PROVIDER_RETRY_AFTER
            if minimum > room:
                notes.append(
                    f"Retry-After {show(obs.retry_after)} reaches past the deadline: waiting "
                    "until the deadline, which then stops without a request"
                )
    floor_at = now + floor if floor is not None and floor <= room else None
    if floor is not None and floor > room:
        floor_at = now + room  # no moment before the deadline is left: no final look
    return _Delay(offset, source, hint_at, floor_at)


def _provider_hint(
    obs: Observation, now: datetime, room: timedelta, notes: list[str]
) -> timedelta | None:
    """The later of the valid provider hints (both are guidance to wait at least that long)."""
    found = [
        h
        for h in (
            _poll_after(obs.poll_after_seconds, room, notes),
            _next_check(obs.next_check_at, now, room, notes),
        )
        if h is not None
    ]
    return max(found) if found else None


def _poll_after(value: Any, room: timedelta, notes: list[str]) -> timedelta | None:
    if value is None:
        return None
    problem = None
    if isinstance(value, bool) or not isinstance(value, int | float):
        problem = "not a number"
    elif isinstance(value, float) and not math.isfinite(value):
        problem = "not a finite number"
    elif value < 0:
        problem = "negative"
    elif value > room.total_seconds():
        problem = "past the deadline"
    if problem is not None:
        notes.append(f"poll_after_seconds {show(value)} ignored: {problem}")
        return None
    return timedelta(seconds=value)


def _next_check(value: Any, now: datetime, room: timedelta, notes: list[str]) -> timedelta | None:
    if value is None:
        return None
    when = parse_rfc3339(value)
    problem = None
    if when is None:
        problem = "not an RFC 3339 timestamp"
    elif when <= now:
        problem = "in the past"
    elif when - now > room:
        problem = "past the deadline"
    if problem is not None or when is None:
        notes.append(f"next_check_at {show(value)} ignored: {problem}")
        return None
    return when - now


def _retry_after(value: str | None, now: datetime, notes: list[str]) -> timedelta | None:
    if value is None:
        return None
    parsed = parse_retry_after(value, now)
    if parsed is None:
        notes.append(f"Retry-After {show(value)} ignored: unparsable")
    return parsed


def parse_rfc3339(value: Any) -> datetime | None:
    """An RFC 3339 date-time with an explicit offset, as aware UTC; None when invalid."""
    if not isinstance(value, str) or not _RFC3339.match(value):
        return None
    text = value.upper().replace(" ", "T")
    # fromisoformat takes at most microseconds; finer digits carry no meaning here.
    text = re.sub(r"(\.\d{6})\d+", r"\1", text)
    try:
        return utc(datetime.fromisoformat(text))
    except ValueError:
        return None


def retry_floor(retry_after: str | None, now: datetime) -> datetime | None:
    """An answer's Retry-After as a moment, counted from when the answer was in hand."""
    wait = parse_retry_after(retry_after, now)
    return now + wait if wait is not None else None


def hinted_since(op: OperationRecord, sent_at: datetime) -> bool:
    """A webhook hint arrived after this status request was sent: our answer may predate it."""
    return op.hinted_at is not None and op.hinted_at > sent_at


def hinted_wait(
    at: datetime, source: DelaySource, floor: datetime | None, now: datetime
) -> tuple[datetime, DelaySource]:
    """A hint came after our question: look again now, but not before the Retry-After."""
    if floor is None or floor <= now:
        return now, DelaySource.WEBHOOK_HINT
    if floor < at:
        return floor, DelaySource.PROVIDER_RETRY_AFTER
    return at, source


def after_answer(
    op: OperationRecord, wait: Wait, obs: Observation, now: datetime, policy: PollPolicy
) -> NextRead:
    """The read after a pending answer ``obs`` as the row ``op`` is now, which may have
    moved while we asked: a cancellation reads by its window's close, a hint that came
    after our question is looked at now (never before the Retry-After), and a cancel
    that came meanwhile is sent now."""
    floor = retry_floor(obs.retry_after, now)
    at, source = wait.at, wait.source
    state = State(op.state)
    if op.cancel_deadline_at is not None and state is State.CANCELLING:
        # A Retry-After already run out (``Retry-After: 0``) holds nothing back.
        held = floor if floor is not None and floor > now else None
        at, source = cancel_window_read(at, source, op.cancel_deadline_at, held, policy)
        at = max(at, now)  # a window that closed while we asked is settled now, not before
    if hinted_since(op, obs.at):
        at, source = hinted_wait(at, source, floor, now)
    elif state is State.CANCEL_REQUESTED and op.cancel_sent_at is None:
        at = now  # a cancel arrived while we asked: send it now
    # Only a stretched wait needs the hint's moment kept: trust may be withdrawn.
    return NextRead(at, source, wait.hint_at if source is DelaySource.WEBHOOK_TRUST else None)
