"""Webhook trust, pure: judging each completion, counting it into a provider's health, spreading.

Guarantee: trust is earned only from recorded facts and lost at the first miss.
Values in, values out; no I/O, no clock, no hidden randomness. The shell stores
what these functions return (``storage.trust``) in the same transaction as the
observation that decided it.

A completion (an operation whose terminal remote state a status read confirmed) is

* ``webhook_first``: a verified webhook was stored before the read was sent;
* ``pending``: the read found it first; the grace decides, once it is over, between
* ``late``: a webhook for the job followed within ``webhook_grace_seconds`` (not held
  against trust, not counted towards it either),
* ``webhook_first`` after all: a webhook received before the read whose hint was
  committed only after the read was judged, and
* ``miss``: no webhook within the grace.

States: ``learning`` → ``trusted`` after ``trust_after`` consecutive webhook-first
completions; ``distrusted`` after ``distrust_after_misses`` misses counted since trust
was last earned (or since learning began); from ``distrusted`` trust is earned again
exactly as at first.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum

from reconciler.core.clock import isoformat

DEFAULT_TRUST_AFTER = 20
DEFAULT_DISTRUST_AFTER_MISSES = 1
DEFAULT_GRACE_SECONDS = 30.0
TRUSTED_MAX_FACTOR = 10.0  # trusted_max_delay_seconds defaults to 10 x max_delay_seconds


class TrustMode(StrEnum):
    ADAPTIVE = "adaptive"
    OFF = "off"


class TrustState(StrEnum):
    LEARNING = "learning"
    TRUSTED = "trusted"
    DISTRUSTED = "distrusted"


class Verdict(StrEnum):
    WEBHOOK_FIRST = "webhook_first"
    PENDING = "pending"
    LATE = "late"
    MISS = "miss"
    # No webhook, but our own storage was down while it was due (we refused it): not the
    # provider's miss, and counted nowhere.
    EXCUSED = "excused"


@dataclass(frozen=True)
class TrustPolicy:
    """A provider's ``[polling]`` trust keys, validated by the loader."""

    mode: TrustMode = TrustMode.OFF
    trust_after: int = DEFAULT_TRUST_AFTER
    distrust_after_misses: int = DEFAULT_DISTRUST_AFTER_MISSES
    trusted_max_delay_seconds: float = 1200.0
    webhook_grace_seconds: float = DEFAULT_GRACE_SECONDS

    @property
    def adaptive(self) -> bool:
        return self.mode is TrustMode.ADAPTIVE


@dataclass(frozen=True)
class Health:
    """One provider's webhook health as stored; counters only ever grow except the two runs."""

    state: TrustState = TrustState.LEARNING
    streak: int = 0  # consecutive webhook-first completions since the last miss
    misses: int = 0  # misses since trust was last earned (or since learning began)
    webhook_first: int = 0
    late: int = 0
    missed: int = 0
    changed_at: datetime | None = None
    last_miss_operation: str | None = None


@dataclass(frozen=True)
class Change:
    """A state transition that one counted completion caused."""

    before: TrustState
    after: TrustState
    operation_id: str
    verdict: Verdict

    @property
    def distrusted(self) -> bool:
        return self.after is TrustState.DISTRUSTED and self.before is not TrustState.DISTRUSTED


def judge_read(
    hinted_at: datetime | None,
    asked_at: datetime,
    unanswered_at: datetime | None = None,
    *,
    outage: bool = False,
) -> Verdict:
    """A status read confirmed a terminal state: was a verified webhook stored before we asked?

    ``hinted_at`` is the operation's pending hint; ``unanswered_at`` the first verified
    webhook for the job received after the previous request was sent (so no earlier
    read answered it). The hint alone can hide such a webhook: one coalesced while this
    read was in flight moves ``hinted_at`` past the read, and a hint whose webhook
    arrived before we asked may commit after the request went out. ``outage``: our own
    storage was down at some point since the last read, so the job's webhook may have
    come then and been refused by us: not the provider's miss (``EXCUSED``).
    """
    for at in (hinted_at, unanswered_at):
        if at is not None and at <= asked_at:
            return Verdict.WEBHOOK_FIRST
    return Verdict.EXCUSED if outage else Verdict.PENDING


def settle_after(seen_at: datetime, policy: TrustPolicy) -> datetime:
    """When a pending completion can be judged: the grace after the read saw the end."""
    return seen_at + timedelta(seconds=policy.webhook_grace_seconds)


def settle(
    asked_at: datetime, webhook_at: datetime | None, until: datetime, *, outage: bool = False
) -> Verdict:
    """A pending completion once its grace is over: did a webhook follow the read in time?

    ``webhook_at`` is the earliest verified webhook for the job that no earlier read
    answered; ``until`` is the end of the grace. One received before the read was sent
    makes it webhook-first after all: its hint was committed only after the read had been
    judged. One after the read, within the grace, makes it late. ``outage``: our own
    storage was down during the webhook's window, so a missing webhook is excused.
    """
    if webhook_at is None or webhook_at > until:
        return Verdict.EXCUSED if outage else Verdict.MISS
    return Verdict.WEBHOOK_FIRST if webhook_at <= asked_at else Verdict.LATE


def count(
    health: Health, verdict: Verdict, operation_id: str, now: datetime, policy: TrustPolicy
) -> tuple[Health, Change | None]:
    """Count one judged completion into ``health``; the Change when the state moved."""
    if verdict is Verdict.PENDING:
        raise ValueError("a pending completion is counted only once the grace has decided it")
    before = health.state
    if verdict is Verdict.EXCUSED:
        return health, None
    if verdict is Verdict.LATE:
        return replace(health, late=health.late + 1), None
    if verdict is Verdict.WEBHOOK_FIRST:
        after = replace(health, streak=health.streak + 1, webhook_first=health.webhook_first + 1)
        if before is not TrustState.TRUSTED and after.streak >= policy.trust_after:
            after = replace(after, state=TrustState.TRUSTED, misses=0, changed_at=now)
    else:
        after = replace(
            health,
            streak=0,
            misses=health.misses + 1,
            missed=health.missed + 1,
            last_miss_operation=operation_id,
        )
        if before is not TrustState.DISTRUSTED and after.misses >= policy.distrust_after_misses:
            after = replace(after, state=TrustState.DISTRUSTED, changed_at=now)
    if after.state is before:
        return after, None
    return after, Change(before, after.state, operation_id, verdict)


def needs_replay(policy: TrustPolicy, stored: Health, since: datetime) -> bool:
    """Whether the trust state's transitions from ``since`` on must be found by counting
    the judged verdicts again (``count``, in the order judged): only the last one is
    stored (``changed_at``), and only one at or after ``since`` can have others in it."""
    return policy.adaptive and stored.changed_at is not None and stored.changed_at >= since


def share(health: Health) -> float | None:
    """Webhook-first completions among all judged ones; None before any evidence."""
    judged = health.webhook_first + health.late + health.missed
    return health.webhook_first / judged if judged else None


def spread(
    count_: int, now: datetime, base_seconds: float, concurrency: int, rng: random.Random
) -> list[datetime]:
    """Moments for ``count_`` reads brought back at once: never a burst.

    They are spread over a window of at least ``base_seconds`` and long enough that on
    average at most ``concurrency`` reads fall in any second; each gets one slot of the
    window, in random order, at a random point inside its slot (jitter).
    """
    if count_ <= 0:
        return []
    window = max(base_seconds, count_ / max(1, concurrency))
    width = window / count_
    slots = list(range(count_))
    rng.shuffle(slots)
    return [now + timedelta(seconds=width * (slot + rng.random())) for slot in slots]


@dataclass(frozen=True)
class TrustView:
    """What an operator sees of a provider's webhook trust (``GET /v1/providers``, console)."""

    provider: str
    mode: TrustMode
    state: TrustState | None  # None when trust is off
    webhook_first_share: float | None
    webhook_first: int
    late: int
    misses: int
    streak: int
    trust_after: int
    last_verified_webhook_at: datetime | None
    changed_at: datetime | None

    def as_dict(self) -> dict[str, object]:
        return {
            "mode": self.mode.value,
            "state": self.state.value if self.state is not None else None,
            "webhook_first_share": (
                round(self.webhook_first_share, 4) if self.webhook_first_share is not None else None
            ),
            "webhook_first": self.webhook_first,
            "late": self.late,
            "misses": self.misses,
            "streak": self.streak,
            "trust_after": self.trust_after,
            "last_verified_webhook_at": isoformat(self.last_verified_webhook_at),
            "changed_at": isoformat(self.changed_at),
        }


def view(
    provider: str, health: Health, policy: TrustPolicy, last_webhook_at: datetime | None
) -> TrustView:
    return TrustView(
        provider=provider,
        mode=policy.mode,
        state=health.state if policy.adaptive else None,
        webhook_first_share=share(health),
        webhook_first=health.webhook_first,
        late=health.late,
        misses=health.missed,
        streak=health.streak,
        trust_after=policy.trust_after,
        last_verified_webhook_at=last_webhook_at,
        changed_at=health.changed_at,
    )
