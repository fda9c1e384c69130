"""A restart with many overdue operations does not burst at the provider.

The service stops acting while 50 operations are being observed, stays down
longer than their longest poll interval, and a second replica starts on the same
database: the provider's status reads in any half second after the restart stay
within 2x the steady rate measured before the stop (a late wake never bursts:
docs/design.md#catch-up).

Both replicas and the provider run on one manual clock (``tests/support/world.py``),
so the rates are measured in provider time and the downtime costs nothing. Every
operation is overdue after the stop: a burst puts all 50 reads in the first half
second; the spread sends them at most at the steady rate and 16 a second (the
provider's concurrency).
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest

from reconciler.demo.sim import SimState
from tests.support.world import open_world

pytestmark = pytest.mark.anyio

OPERATIONS = 50
INTERVAL = 5.0  # polling base = max delay: each operation is read every 2.5-5 s
BUCKET = 0.5  # seconds: the rate is compared per half second
STEADY_WINDOW = 6.0
CATCH_UP_AFTER = 2.0  # overdue by more than this: spread (the default, 5 s, is a longer stop)
DOWN = INTERVAL + CATCH_UP_AFTER + 1.0
AFTER_WINDOW = 12.0  # long enough for the spread to read all 50 at the steady rate
POLLING = {
    "base_delay_seconds": INTERVAL,
    "max_delay_seconds": INTERVAL,
    "deadline_seconds": 600,
    "max_status_requests": 1000,
}


def _status_times(sim: SimState) -> list[float]:
    return [r.at for r in sim.requests if r.endpoint == "status"]


def _read_twice(sim: SimState) -> bool:
    reads = Counter(r.job_id for r in sim.requests if r.endpoint == "status")
    return len(reads) >= OPERATIONS and min(reads.values()) >= 2


def _per_bucket(times: list[float], start: float, end: float) -> list[int]:
    buckets = Counter(int((t - start) / BUCKET) for t in times if start <= t < end)
    return [buckets.get(i, 0) for i in range(int((end - start) / BUCKET))]


async def test_overdue_reads_are_spread_after_a_restart(tmp_path: Path, db_url: str) -> None:
    scheduler = {"catch_up_after_seconds": CATCH_UP_AFTER}
    first = await open_world(tmp_path, db_url, polling=POLLING, scheduler=scheduler)
    try:
        sim = first.sim
        for _ in range(OPERATIONS):
            await first.create(scenario="never_finishes", webhooks="never")
        # Settled once every operation has been read twice; then the steady rate.
        await first.run_until(lambda: _read_twice(sim))
        steady_start = sim.now()
        await first.advance(STEADY_WINDOW)
        steady_end = sim.now()
        # The first replica stops acting, as a stopped process would; time passes.
        first.clock.set(first.now + timedelta(seconds=DOWN))
        restarted = sim.now()
        second = await open_world(
            tmp_path,
            db_url,
            polling=POLLING,
            scheduler=scheduler,
            clock=first.clock,
            sim=sim,
            tokens=(first.agent_token, first.operator_token),
        )
        try:
            await second.advance(AFTER_WINDOW)
        finally:
            await second.close()
    finally:
        await first.close()
    times = _status_times(sim)
    steady = _per_bucket(times, steady_start, steady_end)
    steady_rate = sum(steady) / len(steady)
    assert steady_rate > 0
    assert not [t for t in times if steady_end < t < restarted]
    after = _per_bucket(times, restarted, restarted + AFTER_WINDOW)
    assert sum(after) >= OPERATIONS, "not every overdue operation was read after the restart"
    assert max(after) <= 2 * steady_rate, (
        f"peak {max(after)} per {BUCKET} s after the restart against a steady "
        f"{steady_rate:.1f} (per {BUCKET} s after: {after}; steady: {steady})"
    )
