"""The fallback poller's pure decision core: stop, collect, finish, or when to read next.

Values in, a decision out: no I/O, no clock, no hidden randomness. The shell
follows this order around it (docs/design.md#read-order):

1. ``before_request(record, now)``; a ``Stop`` means no request is sent.
2. charge the request (``status_requests_used += 1``) and persist it;
3. send exactly one status request and persist the response metadata;
4. ``decide(record, observation, now, rng, policy)`` with the charged record;
   persist ``decision.counters`` as they are and act on the decision.

A late wake (the process slept or restarted past ``next_poll_at``) is not
special: it runs the same steps, so it sends at most one request and never a
burst to "catch up" on missed intervals.

Delay precedence for the next read (docs/design.md#next-read): ``Retry-After`` is a
minimum on any response > a validated provider hint > capped exponential
backoff with jitter. A ``Wait`` is never before ``now`` and never after the
deadline; when ``Retry-After`` itself reaches past the deadline no legal
request is left, so the wait ends at the deadline and that wake stops with
``deadline_exceeded`` in ``before_request`` without sending anything.

Webhook trust (docs/design.md#webhook-trust) changes two things, both
values of the policy and of the decision:

* while the provider's webhooks are trusted (``trusted=True``) a pending read waits a
  jittered ``trusted_max_delay_seconds`` instead of the backoff (source
  ``webhook_trust``), from the first read after the create on; ``Retry-After`` and
  valid provider hints stay minimums; the deadline and budgets are unchanged;
* with ``final_look_seconds`` set, a read that would fall in the last
  ``final_look_seconds`` before the deadline, or past it, is made at the start of that
  window instead (never before a minimum, never at or after the deadline): one last
  look, so a job that finished in time is not timed out because its webhook was lost.

``restore`` is the way back: the wait a stretched operation gets on its normal
schedule when trust is withdrawn.

Our own outages (``deadline_lapse``): a deadline that passed while this service could
not look (its storage down, or the service not running) is not the provider's doing.
Such an operation gets one status read after recovery, the recovery look, before
anything is decided; only then does it time out, with the outage on record.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from reconciler.core.backoff import BackoffPolicy, parse_retry_after
from reconciler.core.clock import isoformat, utc
from reconciler.core.errors import InvalidObservation
from reconciler.core.vocabulary import DelaySource, EscalationReason, RemoteCategory, TransportError

# A 429 or 503 without Retry-After means the provider is under pressure: the
# next read waits at least four normal backoff steps or the policy's floor,
# whichever is longer.
SHARP_BACKOFF_FACTOR = 4.0

_RFC3339 = re.compile(
    r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})$"
)
_TERMINAL = frozenset({RemoteCategory.FAILURE, RemoteCategory.CANCELLED, RemoteCategory.EXPIRED})
_COLLECTABLE = frozenset({RemoteCategory.SUCCESS, RemoteCategory.PARTIAL})
_CLIP = 120


@dataclass(frozen=True)
class PollPolicy:
    backoff: BackoffPolicy = field(default_factory=BackoffPolicy)
    max_rate_limited: int = 3  # consecutive 429s; the last one escalates rate_limited
    rate_limit_delay_seconds: float = 60.0
    not_found_grace_seconds: float = 30.0
    # Webhook trust: None for both is the schedule without trust (webhook_trust = "off").
    trusted_max_delay_seconds: float | None = None
    final_look_seconds: float | None = None

    def stretched_delay(self, rng: random.Random) -> float | None:
        """The wait while webhooks are trusted: jittered like the backoff, never above the cap."""
        cap = self.trusted_max_delay_seconds
        if cap is None:
            return None
        return rng.uniform(self.backoff.jitter_floor * cap, cap)

    def sharp_delay(self, attempt: int, rng: random.Random) -> float:
        """Delay after a 429/503 without usable Retry-After.

        The floor is max(rate_limit_delay, 4 x backoff.raw(attempt)), so it is
        bounded by max(rate_limit_delay, 4 x backoff.max). Jitter goes *above*
        the floor, never below it, and spreads a fleet that was throttled at
        the same moment: the delay is drawn from [floor, floor x (2 - jitter_floor)].
        """
        floor = max(self.rate_limit_delay_seconds, SHARP_BACKOFF_FACTOR * self.backoff.raw(attempt))
        return rng.uniform(floor, floor * (2.0 - self.backoff.jitter_floor))


@dataclass(frozen=True)
class PollRecord:
    """What the shell loads from the operation row before deciding."""

    deadline_at: datetime
    accepted_at: datetime | None
    max_status_requests: int
    status_requests_used: int  # already charged for the request being decided
    max_transport_failures: int
    transport_failures_used: int = 0
    rate_limited_count: int = 0  # consecutive 429s before this observation
    poll_attempt: int = 0  # polls completed before this observation
    hinted: bool = False  # a webhook hint is pending


@dataclass(frozen=True)
class Observation:
    """One status request's outcome as the shell parsed it; hint fields are raw values."""

    at: datetime
    http_status: int | None = None
    transport_error: TransportError | None = None
    retry_after: str | None = None
    category: RemoteCategory | None = None
    remote_state: str | None = None
    poll_after_seconds: Any = None
    next_check_at: Any = None
    expires_at: Any = None
    required_fields_ok: bool = False
    parse_error: str | None = None
    rate_limited: bool = False  # a 403 that says the rate limit is spent (GitHub)


@dataclass(frozen=True)
class Counters:
    """Absolute counter values after this observation; the shell persists them as given.

    ``poll_attempt`` includes the poll just decided and is the backoff
    exponent of the following wait (the backoff counts completed polls,
    docs/design.md#next-read). ``hint_consumed`` is true when a pending webhook hint has now been
    answered by a parsable status read and should be cleared.
    """

    transport_failures_used: int
    rate_limited_count: int
    poll_attempt: int
    hint_consumed: bool


@dataclass(frozen=True)
class Collect:
    """Success (or partial success) with the required fields valid: go collect the result."""

    counters: Counters


@dataclass(frozen=True)
class Finish:
    """The provider reports failure, cancellation or expiry: an end, not an escalation."""

    category: RemoteCategory
    counters: Counters


@dataclass(frozen=True)
class Stop:
    """Stop waiting and escalate; ``counters`` is None when nothing was observed."""

    reason: EscalationReason
    detail: str
    counters: Counters | None = None


@dataclass(frozen=True)
class Wait:
    """Read the status again at ``at``; ``notes`` records hints that were ignored and why.

    ``final_look`` marks the read pulled before the deadline; ``hint_at`` is the moment a
    valid provider hint named, kept so that a schedule brought back from a stretched
    wait still honours it (``Retry-After`` is kept on the row already).
    """

    at: datetime
    source: DelaySource
    notes: tuple[str, ...]
    counters: Counters
    final_look: bool = False
    hint_at: datetime | None = None


@dataclass(frozen=True)
class Restored:
    """A stretched wait brought back to the normal schedule (trust withdrawn)."""

    at: datetime
    source: DelaySource
    final_look: bool = False


Decision = Collect | Finish | Stop | Wait


def before_request(record: PollRecord, now: datetime) -> Stop | None:
    """Checks before a status request; only None lets the shell charge and send."""
    if now >= record.deadline_at:
        return Stop(
            EscalationReason.DEADLINE_EXCEEDED,
            f"deadline {isoformat(record.deadline_at)} reached before the next status request",
        )
    if record.status_requests_used >= record.max_status_requests:
        return Stop(
            EscalationReason.REQUEST_BUDGET_EXHAUSTED,
            f"{record.status_requests_used} of {record.max_status_requests} status requests used",
        )
    return None


@dataclass(frozen=True)
class Lapse:
    """A stretch in which this service could not look at its operations.

    Known (its storage refused every write, ``storage.availability``) or inferred (an
    operation claimed long after it was due: the service was stopped or its storage
    down, which across a restart nothing else remembers).
    """

    started_at: datetime
    ended_at: datetime
    inferred: bool = False


def deadline_lapse(
    deadline_at: datetime,
    due_at: datetime | None,
    now: datetime,
    known: tuple[Lapse, ...] | list[Lapse],
    *,
    slack_seconds: float,
) -> Lapse | None:
    """The lapse of ours that covered this deadline, or None: then the deadline is the story.

    ``due_at`` is when the operation asked to be looked at next (its last plan, at the
    latest the deadline). A lapse covers the deadline when it began by the deadline and
    lasted until that plan's moment or later: the read it planned, or a webhook that
    would have brought the read forward, was lost to us. A claim later than
    ``slack_seconds`` after its due time is a lapse in itself, from the due time plus the
    slack until now (the bounded window: within the slack a wake is merely a tick late):
    it needs no memory, so it holds across a restart. A read made after the lapse ended,
    before the deadline, was that look already: the lapse then ends before the plan.
    """
    if now < deadline_at:
        return None
    due = deadline_at if due_at is None else min(due_at, deadline_at)
    lapses = list(known)
    if (now - due).total_seconds() > slack_seconds:
        lapses.append(Lapse(due + timedelta(seconds=slack_seconds), now, inferred=True))
    covering = [lp for lp in lapses if lp.started_at <= deadline_at and lp.ended_at >= due]
    if not covering:
        return None
    return Lapse(
        min(lp.started_at for lp in covering),
        max(lp.ended_at for lp in covering),
        inferred=all(lp.inferred for lp in covering),
    )


def outage_stop(deadline_at: datetime, lapse: Lapse, said: str | None) -> Stop:
    """The escalation of a deadline that passed during our own outage: never a plain timeout."""
    looked = (
        f"a status read after recovery still said {_clip(said)}"
        if said is not None
        else "no status read after recovery could settle it"
    )
    return Stop(
        EscalationReason.DEADLINE_EXCEEDED,
        f"deadline {isoformat(deadline_at)} passed during this service's own storage outage "
        f"({isoformat(lapse.started_at)} to {isoformat(lapse.ended_at)}); {looked}",
    )


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


def decide(
    record: PollRecord,
    observation: Observation,
    now: datetime,
    rng: random.Random,
    policy: PollPolicy,
    *,
    trusted: bool = False,
) -> Decision:
    """Decide what one status response means. Exactly one request preceded it.

    ``trusted``: the provider's webhooks are trusted, so a pending answer may wait the
    stretched schedule (the shell passes it only where trust applies).
    """
    obs = observation
    if obs.transport_error is not None:
        what = f"status request failed without a response ({obs.transport_error.value})"
        if obs.transport_error is TransportError.TIMEOUT:
            what = "status request timed out (delivery ambiguous)"
        return _transport_failure(record, obs, now, rng, policy, what, sharp=False)
    status = obs.http_status
    if status is None:
        raise InvalidObservation("an observation needs an HTTP status or a transport error")
    if status == 429 or obs.rate_limited:
        return _rate_limited(record, obs, now, rng, policy)
    if status in (401, 403):
        return Stop(
            EscalationReason.AUTHORIZATION_DENIED,
            f"HTTP {status} from the status endpoint; check the credential, its scope "
            "and the account before any further request",
            _counters(record),
        )
    if status >= 500:
        what = f"HTTP {status} from the status endpoint"
        return _transport_failure(record, obs, now, rng, policy, what, sharp=status == 503)
    if status == 404:
        return _not_found(record, obs, now, rng, policy)
    if not 200 <= status < 300:
        return Stop(
            EscalationReason.CONTRACT_VIOLATION,
            f"unexpected HTTP {status} from the status endpoint",
            _counters(record),
        )
    return _status_body(record, obs, now, rng, policy, trusted)


def _counters(
    record: PollRecord,
    *,
    transport_failure: bool = False,
    rate_limited: bool = False,
    learned: bool = False,
) -> Counters:
    return Counters(
        transport_failures_used=record.transport_failures_used + (1 if transport_failure else 0),
        # "Consecutive": any answer that is not a 429 ends the streak.
        rate_limited_count=record.rate_limited_count + 1 if rate_limited else 0,
        poll_attempt=record.poll_attempt + 1,
        hint_consumed=record.hinted and learned,
    )


def _transport_failure(
    record: PollRecord,
    obs: Observation,
    now: datetime,
    rng: random.Random,
    policy: PollPolicy,
    what: str,
    *,
    sharp: bool,
) -> Decision:
    counters = _counters(record, transport_failure=True)
    used = counters.transport_failures_used
    if used >= record.max_transport_failures:
        return Stop(
            EscalationReason.PROVIDER_FAILURE,
            f"{what}; transport failure budget exhausted "
            f"({used} of {record.max_transport_failures})",
            counters,
        )
    delay = _failure_delay(obs, now, counters.poll_attempt, rng, policy, sharp=sharp)
    return _wait(record, obs, now, counters, delay, [], policy, hints=False)


def _rate_limited(
    record: PollRecord, obs: Observation, now: datetime, rng: random.Random, policy: PollPolicy
) -> Decision:
    counters = _counters(record, rate_limited=True)
    if counters.rate_limited_count >= policy.max_rate_limited:
        return Stop(
            EscalationReason.RATE_LIMITED,
            f"HTTP {obs.http_status} {counters.rate_limited_count} times in a row "
            f"(limit {policy.max_rate_limited})",
            counters,
        )
    delay = _failure_delay(obs, now, counters.poll_attempt, rng, policy, sharp=True)
    return _wait(record, obs, now, counters, delay, [], policy, hints=False)


def _failure_delay(
    obs: Observation,
    now: datetime,
    attempt: int,
    rng: random.Random,
    policy: PollPolicy,
    *,
    sharp: bool,
) -> float:
    # With a usable Retry-After the provider has said how long; it acts as the
    # minimum over the normal backoff. Without it, 429/503 back off sharply.
    if sharp and parse_retry_after(obs.retry_after, now) is None:
        return policy.sharp_delay(attempt, rng)
    return policy.backoff.delay(attempt, rng)


def _not_found(
    record: PollRecord, obs: Observation, now: datetime, rng: random.Random, policy: PollPolicy
) -> Decision:
    counters = _counters(record)
    grace = timedelta(seconds=policy.not_found_grace_seconds)
    if record.accepted_at is not None and obs.at < record.accepted_at + grace:
        note = (
            "HTTP 404 within the not-found grace window "
            f"(until {isoformat(record.accepted_at + grace)}): treated as eventual consistency"
        )
        delay = policy.backoff.delay(counters.poll_attempt, rng)
        return _wait(record, obs, now, counters, delay, [note], policy, hints=False)
    since = isoformat(record.accepted_at) if record.accepted_at is not None else "unknown"
    return Stop(
        EscalationReason.CONTRACT_VIOLATION,
        f"job not found (HTTP 404) after the grace window of {policy.not_found_grace_seconds:g}s "
        f"since acceptance at {since}",
        counters,
    )


def _status_body(
    record: PollRecord,
    obs: Observation,
    now: datetime,
    rng: random.Random,
    policy: PollPolicy,
    trusted: bool,
) -> Decision:
    category = obs.category
    learned = category is not None and obs.parse_error is None
    counters = _counters(record, learned=learned)
    state = _clip(obs.remote_state)
    if category is None or obs.parse_error is not None:
        return Stop(
            EscalationReason.CONTRACT_VIOLATION,
            f"HTTP {obs.http_status} status response could not be parsed: "
            f"{_clip(obs.parse_error) if obs.parse_error else 'no status in the body'}",
            counters,
        )
    if category is RemoteCategory.UNKNOWN:
        return Stop(
            EscalationReason.UNKNOWN_STATE,
            f"remote state {state} is not in the provider's state table",
            counters,
        )
    if category in _COLLECTABLE:
        if obs.required_fields_ok:
            return Collect(counters)
        return Stop(
            EscalationReason.CONTRADICTORY_STATUS,
            f"remote state {state} reports {category} but required result fields "
            "are missing or invalid",
            counters,
        )
    if category in _TERMINAL:
        return Finish(category, counters)
    return _pending(record, obs, now, rng, policy, counters, trusted)


def _pending(
    record: PollRecord,
    obs: Observation,
    now: datetime,
    rng: random.Random,
    policy: PollPolicy,
    counters: Counters,
    trusted: bool,
) -> Decision:
    notes: list[str] = []
    expiry = parse_rfc3339(obs.expires_at)
    if obs.expires_at is not None and expiry is None:
        notes.append(f"expires_at {_show(obs.expires_at)} ignored: not an RFC 3339 timestamp")
    elif expiry is not None and expiry < obs.at:
        return Stop(
            EscalationReason.CONTRADICTORY_STATUS,
            f"running after its own expiry: remote state {_clip(obs.remote_state)} "
            f"at {isoformat(obs.at)}, expires_at {isoformat(expiry)}",
            counters,
        )
    if record.hinted:
        notes.append(
            f"webhook hint not confirmed: the provider still reports {_clip(obs.remote_state)}"
        )
    delay = policy.backoff.delay(counters.poll_attempt, rng)
    stretched = policy.stretched_delay(rng) if trusted else None
    return _wait(record, obs, now, counters, delay, notes, policy, hints=True, stretched=stretched)


def _wait(
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
    # Stop now rather than schedule a read that before_request would refuse:
    # the history then shows the response that ended the run.
    if now >= record.deadline_at:
        return Stop(
            EscalationReason.DEADLINE_EXCEEDED,
            f"deadline {isoformat(record.deadline_at)} passed; last response: {_describe(obs)}",
            counters,
        )
    if record.status_requests_used >= record.max_status_requests:
        return Stop(
            EscalationReason.REQUEST_BUDGET_EXHAUSTED,
            f"{record.status_requests_used} of {record.max_status_requests} status requests "
            f"used; last response: {_describe(obs)}",
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
                    f"Retry-After {_show(obs.retry_after)} reaches past the deadline: waiting "
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
        notes.append(f"poll_after_seconds {_show(value)} ignored: {problem}")
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
        notes.append(f"next_check_at {_show(value)} ignored: {problem}")
        return None
    return when - now


def _retry_after(value: str | None, now: datetime, notes: list[str]) -> timedelta | None:
    if value is None:
        return None
    parsed = parse_retry_after(value, now)
    if parsed is None:
        notes.append(f"Retry-After {_show(value)} ignored: unparsable")
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


def _describe(obs: Observation) -> str:
    if obs.transport_error is not None:
        return f"no response ({obs.transport_error.value})"
    if obs.remote_state is not None:
        return f"HTTP {obs.http_status}, remote state {_clip(obs.remote_state)}"
    return f"HTTP {obs.http_status}"


def _clip(text: str | None) -> str:
    if text is None:
        return "(none)"
    flat = " ".join(text.split())
    return repr(flat if len(flat) <= _CLIP else flat[: _CLIP - 1] + "…")


def _show(value: Any) -> str:
    if isinstance(value, str):
        return _clip(value)
    shown = repr(value)
    return shown if len(shown) <= _CLIP else shown[: _CLIP - 1] + "…"
