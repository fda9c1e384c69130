"""The fallback poller's read decision: whether to read, and what an answer means. Pure.

Values in, a decision out: no I/O, no clock, no hidden randomness. The shell
follows this order around it (docs/design.md#read-order):

1. ``plan_read(op, now)`` (for a bare record ``before_request``); anything but a
   ``Read`` means no request is sent;
2. charge the request (``status_requests_used += 1``) and persist it;
3. send exactly one status request and persist the response metadata;
4. ``decide_read(op, observation, now, rng, policy)`` with the charged record (for a bare
   record ``decide``); persist ``decision.counters`` as they are and write the decision,
   a ``Wait`` at the moment ``core.next_read.after_answer`` gives it.

A late wake (the process slept or restarted past ``next_poll_at``) is not
special: it runs the same steps, so it sends at most one request and never a
burst to "catch up" on missed intervals. When the next read is, and why then, is
``core.next_read``'s; the reads past a deadline are ``core.lapses``' (our own outage)
and ``core.cancel``'s (the cancel window).

The claim prepares a step's first write (``engine.flow``) only where ``plan_read`` says
``Read()``, the plan the step itself follows: the two cannot disagree.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from reconciler.core.backoff import parse_retry_after
from reconciler.core.cancel import closed_stop, stop_reason, unconfirmed, window_closed
from reconciler.core.clock import isoformat
from reconciler.core.errors import InvalidObservation
from reconciler.core.lapses import Lapse, held_back, outage_stop, recovery_said
from reconciler.core.next_read import parse_rfc3339, schedule
from reconciler.core.poll_values import (
    Collect,
    Counters,
    Decision,
    Finish,
    Observation,
    PollPolicy,
    PollRecord,
    Stop,
    Wait,
    clip,
    record_of,
    show,
)
from reconciler.core.records import OperationRecord
from reconciler.core.states import State
from reconciler.core.vocabulary import EscalationReason, RemoteCategory, TransportError

_TERMINAL = frozenset({RemoteCategory.FAILURE, RemoteCategory.CANCELLED, RemoteCategory.EXPIRED})
_COLLECTABLE = frozenset({RemoteCategory.SUCCESS, RemoteCategory.PARTIAL})


@dataclass(frozen=True)
class Read:
    """Charge one status request and send it.

    ``last_look``: the cancel window has closed; one look may still show the cancel
    landed (our own database may have been down past the window), so only an end state
    it shows settles anything.
    """

    last_look: bool = False


@dataclass(frozen=True)
class NoRead:
    """No request goes out: the operation escalates with ``stop``.

    ``cancel_window``: the window that closed is the cancel window (our own outage in it
    goes on record). ``recoverable``: the job's deadline passed while observing; if our
    own outage covered it (``core.lapses.deadline_lapse``, which needs the outages the
    shell knows of) the recovery look is made instead.
    """

    stop: Stop
    cancel_window: bool = False
    recoverable: bool = False


@dataclass(frozen=True)
class NoJobId:
    """A status read with no job id to ask about: a state no transition leaves one in."""


ReadPlan = Read | NoRead | NoJobId


@dataclass(frozen=True)
class LastLook:
    """A read made when reads were over, so only an end state it shows settles anything:
    the look after the cancel window closed, or (``lapse``) the recovery look after our
    own outage covered the deadline (docs/design.md#recovery-look)."""

    lapse: Lapse | None = None


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


def plan_read(op: OperationRecord, now: datetime) -> ReadPlan:
    """The status read due on ``op`` at ``now``: the one answer both the claim's
    ``prepare`` and the step go by.

    A cancel window that closed gets one look before ``cancellation_unconfirmed``
    (budget permitting, a job to ask about, and not while the provider's Retry-After
    still runs: that look is a request like any other). Otherwise the deadline and the
    budget are checked first (``before_request``).
    """
    if window_closed(op, now):
        held = held_back(op.retry_not_before, now)  # further off than cancel_window_read waits
        if held or op.status_requests_used >= op.max_status_requests or not op.remote_job_id:
            return NoRead(closed_stop(op, held), cancel_window=True)
        return Read(last_look=True)
    stop = before_request(record_of(op), now)
    if stop is not None:
        state = State(op.state)
        return NoRead(
            Stop(stop_reason(stop.reason, state), stop.detail),
            recoverable=stop.reason is EscalationReason.DEADLINE_EXCEEDED
            and state is State.OBSERVING,
        )
    if op.remote_job_id is None:
        return NoJobId()
    return Read()


def before_send(charged: OperationRecord, now: datetime, look: LastLook | None) -> Stop | None:
    """The deadline checked again just before transmission: the charge's write (and, on a
    loaded machine, the wait for the loop) take time, and a read past the deadline is
    withheld, its charge an unused reservation. A last look is made past it by design."""
    deadline = record_of(charged).deadline_at
    if look is not None or now < deadline:
        return None
    return Stop(
        stop_reason(EscalationReason.DEADLINE_EXCEEDED, State(charged.state)),
        f"deadline {isoformat(deadline)} reached before the status request was sent",
    )


def may_stretch(observation: Observation, look: LastLook | None) -> bool:
    """Whether trust could stretch the wait after this answer: only a pending answer waits,
    and a last look never does (the shell reads the provider's trust only then)."""
    return observation.category is RemoteCategory.PENDING and look is None


def decide_read(
    op: OperationRecord,
    observation: Observation,
    now: datetime,
    rng: random.Random,
    policy: PollPolicy,
    *,
    look: LastLook | None = None,
    trusted: bool = False,
) -> Decision:
    """What one status answer means for the operation as its row is now (charged for it).

    ``decide`` on its counters, and what an operation adds to that, so the shell only
    writes the decision:

    * an answer that names another job than ours is contradictory, whatever it says;
    * a last look (``look``) is judged as if within the window, and only an end state
      settles it: a wait becomes ``cancellation_unconfirmed``, or after the recovery look
      the timeout that names our outage;
    * in a cancellation watch the window that runs out is the cancel window;
    * ``trusted`` (the provider's webhooks are trusted) stretches only what
      ``may_stretch`` allows.
    """
    obs = observation
    state = State(op.state)
    if obs.job_id_matches is False:
        return Stop(
            stop_reason(EscalationReason.CONTRADICTORY_STATUS, state),
            f"status answer names job {obs.job_id}, not {op.remote_job_id}",
        )
    record = record_of(op)
    if look is not None:
        # Judge the answer as if in the window; only an end state settles it.
        room = max(record.max_status_requests, record.status_requests_used + 1)
        record = replace(record, deadline_at=now + timedelta(days=1), max_status_requests=room)
    decision = decide(record, obs, now, rng, policy, trusted=trusted and may_stretch(obs, look))
    if isinstance(decision, Wait) and look is not None:
        if look.lapse is not None:
            stop = outage_stop(op.deadline_at, look.lapse, recovery_said(obs))
            decision = Stop(stop.reason, stop.detail, decision.counters)
        else:
            decision = unconfirmed(op, obs, decision)
    if isinstance(decision, Stop):
        return replace(decision, reason=stop_reason(decision.reason, state))
    return decision


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
    if obs.no_credential is not None:
        return Stop(
            EscalationReason.AUTHORIZATION_DENIED,
            f"the status request was not sent: {obs.no_credential}; check the credential's "
            "source before any further request",
            _counters(record),
        )
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
    if obs.not_found or status == 404:
        return _not_found(record, obs, now, rng, policy)
    if status in (401, 403):
        fresh = (
            f", and a fresh credential could not be obtained: {obs.credential_problem}"
            if obs.credential_problem
            else ""
        )
        return Stop(
            EscalationReason.AUTHORIZATION_DENIED,
            f"HTTP {status} from the status endpoint{fresh}; check the credential, its scope "
            "and the account before any further request",
            _counters(record),
        )
    if status >= 500:
        what = f"HTTP {status} from the status endpoint"
        return _transport_failure(record, obs, now, rng, policy, what, sharp=status == 503)
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
    return schedule(record, obs, now, counters, delay, [], policy, hints=False)


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
    return schedule(record, obs, now, counters, delay, [], policy, hints=False)


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
            f"HTTP {obs.http_status} (no such job) within the not-found grace window "
            f"(until {isoformat(record.accepted_at + grace)}): treated as eventual consistency"
        )
        delay = policy.backoff.delay(counters.poll_attempt, rng)
        return schedule(record, obs, now, counters, delay, [note], policy, hints=False)
    since = isoformat(record.accepted_at) if record.accepted_at is not None else "unknown"
    return Stop(
        EscalationReason.CONTRACT_VIOLATION,
        f"job not found (HTTP {obs.http_status}) after the grace window of "
        f"{policy.not_found_grace_seconds:g}s since acceptance at {since}",
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
    state = clip(obs.remote_state)
    if category is None or obs.parse_error is not None:
        return Stop(
            EscalationReason.CONTRACT_VIOLATION,
            f"HTTP {obs.http_status} status response could not be parsed: "
            f"{clip(obs.parse_error) if obs.parse_error else 'no status in the body'}",
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
        notes.append(f"expires_at {show(obs.expires_at)} ignored: not an RFC 3339 timestamp")
    elif expiry is not None and expiry < obs.at:
        return Stop(
            EscalationReason.CONTRADICTORY_STATUS,
            f"running after its own expiry: remote state {clip(obs.remote_state)} "
            f"at {isoformat(obs.at)}, expires_at {isoformat(expiry)}",
            counters,
        )
    if record.hinted:
        notes.append(
            f"webhook hint not confirmed: the provider still reports {clip(obs.remote_state)}"
        )
    delay = policy.backoff.delay(counters.poll_attempt, rng)
    stretched = policy.stretched_delay(rng) if trusted else None
    return schedule(
        record, obs, now, counters, delay, notes, policy, hints=True, stretched=stretched
    )
