"""Spreading status reads that fell due together (a restart, a pause): a pure decision.

Guarantee: a late wake never bursts (missed intervals are not made up with a
burst of status calls, docs/design.md#catch-up). Overdue reads of one provider are
placed one by one over a window as long as their own cadence would have
taken to send them — ``n`` reads at the rate ``sum(1 / interval)`` they were
being sent at, never faster than ``max_rate`` — so the window grows with
their number; each gets a jittered slot (earliest due first), no read moves
before its ``Retry-After`` or past its deadline.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

# Below this the cadence of a read is not trusted for the rate (a hint, a first read).
MIN_INTERVAL_SECONDS = 1.0
# The claim looks for long-overdue reads at most this often, and at least five times as
# often as a read must be overdue to be spread.
PROBE_EVERY_SECONDS = 1.0


def probe_due(last: datetime | None, now: datetime, overdue_after: timedelta) -> bool:
    """Whether a claim looks for long-overdue reads now (``last``: when one last looked).

    A read that was not overdue by ``overdue_after`` at the last look is overdue by at
    most ``now - last`` more, so looking every fifth of ``overdue_after`` (and every
    second at most) still finds a burst before any read is overdue by 1.2 times it; the
    claims in between (many a second under load) skip the probe's statement.
    """
    if last is None or now < last:
        return True
    every = min(timedelta(seconds=PROBE_EVERY_SECONDS), overdue_after / 5)
    return now - last >= every


@dataclass(frozen=True)
class Overdue:
    operation_id: str
    due_at: datetime
    interval_seconds: float  # the delay it was scheduled with: its share of the steady rate
    deadline_at: datetime  # the read is never moved past it
    not_before: datetime | None = None  # the provider's Retry-After


@dataclass(frozen=True)
class Slot:
    operation_id: str
    at: datetime
    window_seconds: float


def window_seconds(overdue: Sequence[Overdue], max_rate: float) -> float:
    """How long ``overdue`` reads take at their own steady rate (capped at ``max_rate``/s)."""
    if not overdue:
        return 0.0
    steady = sum(1.0 / max(MIN_INTERVAL_SECONDS, o.interval_seconds) for o in overdue)
    return len(overdue) / min(max_rate, steady)


def spread(
    overdue: Sequence[Overdue], now: datetime, rng: random.Random, max_rate: float
) -> list[Slot]:
    """One jittered slot each over ``window_seconds``: evenly paced, earliest due first."""
    items = sorted(overdue, key=lambda o: (o.due_at, o.operation_id))
    window = window_seconds(items, max_rate)
    if not items:
        return []
    step = window / len(items)
    slots = []
    for k, item in enumerate(items):
        at = now + timedelta(seconds=(k + rng.random()) * step)
        if item.not_before is not None and at < item.not_before:
            at = item.not_before
        slots.append(Slot(item.operation_id, min(at, item.deadline_at), window))
    return slots
