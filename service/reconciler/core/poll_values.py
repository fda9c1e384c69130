"""What a status read is decided on, and the decisions it comes to: values only.

The poller's policy, the operation's counters as the decision reads them
(``PollRecord``, ``record_of``), one answer as the shell parsed it (``Observation``),
and the four decisions (``Collect``, ``Finish``, ``Stop``, ``Wait``). ``core.poll``
decides, ``core.next_read`` schedules, ``core.lapses`` and ``core.cancel`` handle the
reads past a deadline; they all speak in these values.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from reconciler.core.backoff import BackoffPolicy
from reconciler.core.records import OperationRecord
from reconciler.core.states import State
from reconciler.core.vocabulary import DelaySource, EscalationReason, RemoteCategory, TransportError

# A 429 or 503 without Retry-After means the provider is under pressure: the
# next read waits at least four normal backoff steps or the policy's floor,
# whichever is longer.
SHARP_BACKOFF_FACTOR = 4.0

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


def record_of(op: OperationRecord) -> PollRecord:
    """The operation's counters as a read decides on them."""
    deadline = op.deadline_at
    if op.state == State.CANCELLING.value and op.cancel_deadline_at is not None:
        # A cancellation is watched until its own window closes, even past the job's
        # deadline: a timed-out operation may still be cancelled.
        deadline = op.cancel_deadline_at
    return PollRecord(
        deadline_at=deadline,
        accepted_at=op.accepted_at,
        max_status_requests=op.max_status_requests,
        status_requests_used=op.status_requests_used,
        max_transport_failures=op.max_transport_failures,
        transport_failures_used=op.transport_failures_used,
        rate_limited_count=op.rate_limited_count,
        poll_attempt=op.poll_attempt,
        hinted=op.hinted_at is not None,
    )


@dataclass(frozen=True)
class Observation:
    """One status request's outcome as the shell parsed it; hint fields are raw values.

    ``job_id_matches`` is False when the answer names a job (``job_id``) other than the
    one asked about, None when the provider file does not say where an answer names it.
    """

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
    job_id: str | None = None
    job_id_matches: bool | None = None
    not_found: bool = False  # a 404, or the answer the provider file says means "no such job"
    no_credential: str | None = None  # why the credential's source refused: nothing was sent
    credential_problem: str | None = None  # a 401 no fresh credential could follow: why


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


Decision = Collect | Finish | Stop | Wait


def describe(obs: Observation) -> str:
    """An answer in a few words, for the detail of the decision it led to."""
    if obs.transport_error is not None:
        return f"no response ({obs.transport_error.value})"
    if obs.remote_state is not None:
        return f"HTTP {obs.http_status}, remote state {clip(obs.remote_state)}"
    return f"HTTP {obs.http_status}"


def clip(text: str | None) -> str:
    """A provider's text on one line, quoted and cut short: it goes into a record."""
    if text is None:
        return "(none)"
    flat = " ".join(text.split())
    return repr(flat if len(flat) <= _CLIP else flat[: _CLIP - 1] + "…")


def show(value: Any) -> str:
    """A raw value from an answer, as a note quotes it."""
    if isinstance(value, str):
        return clip(value)
    shown = repr(value)
    return shown if len(shown) <= _CLIP else shown[: _CLIP - 1] + "…"
