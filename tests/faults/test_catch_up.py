"""A restart with hundreds of overdue operations does not burst at the provider.

The real service process is stopped (SIGTERM) while 150 operations are being
observed, stays down longer than their longest poll interval, and is started
again: the provider's status reads in any half second after the restart stay
within 2x the steady rate measured before the stop (a late wake never bursts:
docs/design.md#catch-up).

Every operation is overdue after the stop: a burst puts its 150 reads in about
as many half seconds as the service needs to send them, each several times the
bound (about 40); the spread sends them at 16 a second (the provider's
concurrency) at most.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from pathlib import Path

import httpx

from reconciler.demo.sim import SimConfig, SimState
from reconciler.demo.sim import create_app as create_sim
from tests.support.process import make_tokens, service_config, service_process, upgrade
from tests.support.servers import serve_asgi
from tests.support.stack import SIM_TOKEN, WEBHOOK_SECRET
from tests.support.waiting import wait_until

OPERATIONS = 150
INTERVAL = 5.0  # polling base = max delay: reads every 2.5-5 s (jitter floor 0.5), ~40/s
BUCKET = 0.5  # seconds: the rate is compared per half second
STEADY_WINDOW = 6.0
CATCH_UP_AFTER = 2.0  # overdue by more than this: spread (the default, 5 s, is a longer stop)
DOWN = INTERVAL + CATCH_UP_AFTER + 1.0
AFTER_WINDOW = 12.0  # the spread takes 150 / 16 = 9.4 s at most


def _status_times(sim: SimState) -> list[float]:
    return [r.at for r in sim.requests if r.endpoint == "status"]


def _read_twice(sim: SimState) -> bool:
    reads = Counter(r.job_id for r in sim.requests if r.endpoint == "status")
    return len(reads) >= OPERATIONS and min(reads.values()) >= 2


def _per_bucket(times: list[float], start: float, end: float) -> list[int]:
    buckets = Counter(int((t - start) / BUCKET) for t in times if start <= t < end)
    return [buckets.get(i, 0) for i in range(int((end - start) / BUCKET))]


def test_overdue_reads_are_spread_after_a_restart(tmp_path: Path) -> None:
    sim = SimState(SimConfig(token=SIM_TOKEN, webhook_secret=WEBHOOK_SECRET))
    with serve_asgi(create_sim(state=sim)) as sim_url:
        db_url = f"sqlite:///{tmp_path / 'reconciler.db'}"
        config, port = service_config(
            tmp_path,
            db_url,
            sim_url,
            provider={
                "base_delay_seconds": INTERVAL,
                "max_delay_seconds": INTERVAL,
                "deadline_seconds": 600,
                "max_status_requests": 1000,
            },
            scheduler={"catch_up_after_seconds": CATCH_UP_AFTER},
        )
        upgrade(db_url)
        agent, _ = make_tokens(db_url)
        headers = {"Authorization": f"Bearer {agent}"}
        with service_process(config, port) as svc:
            with httpx.Client(base_url=svc.url, headers=headers, timeout=30) as client:
                for _ in range(OPERATIONS):
                    body = {
                        "provider": "sim",
                        "request": {"scenario": "never_finishes", "webhooks": "never"},
                        "idempotency_key": uuid.uuid4().hex,
                    }
                    client.post("/v1/operations", json=body).raise_for_status()
            # Settled once every operation has been read twice; then the steady rate.
            wait_until(lambda: _read_twice(sim), 120, "two reads of every operation")
            steady_start = sim.now()
            time.sleep(STEADY_WINDOW)
            steady_end = sim.now()
        steady = _per_bucket(_status_times(sim), steady_start, steady_end)
        steady_rate = sum(steady) / len(steady)
        stopped = sim.now()
        time.sleep(DOWN)
        starting = sim.now()
        with service_process(config, port):
            # From the first read after the restart: the service may read before the test
            # sees it ready, and a burst then would fall before a window started later.
            first = wait_until(
                lambda: min((t for t in _status_times(sim) if t > starting), default=None),
                60,
                "a status read after the restart",
            )
            restarted = float(first)
            time.sleep(max(0.0, restarted + AFTER_WINDOW - sim.now()))
        assert not [t for t in _status_times(sim) if stopped + 1 < t < starting]
        after = _per_bucket(_status_times(sim), restarted, restarted + AFTER_WINDOW)
        assert sum(after) >= OPERATIONS, "not every overdue operation was read after the restart"
        assert max(after) <= 2 * steady_rate, (
            f"peak {max(after)} per {BUCKET} s after the restart against a steady "
            f"{steady_rate:.1f} (per {BUCKET} s after: {after}; steady: {steady})"
        )
