"""A restart with hundreds of overdue operations does not burst at the provider.

The real service process is stopped (SIGTERM) while 300 operations are being
observed, stays down longer than their longest poll interval, and is started
again: the provider's status reads in any one second after the restart stay
within 2x the steady rate measured before the stop (a late wake never bursts:
docs/design.md#catch-up).
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from pathlib import Path

import httpx

from reconciler.demo.sim import SimConfig, SimState
from reconciler.demo.sim import create_app as create_sim
from tests.support.process import cli, make_tokens, service_config, service_process
from tests.support.servers import serve_asgi
from tests.support.stack import SIM_TOKEN, WEBHOOK_SECRET

OPERATIONS = 300
INTERVAL = 10.0  # polling base = max delay: reads every 5-10 s (jitter floor 0.5), ~40/s
STEADY_WINDOW = 10.0
DOWN = INTERVAL + 4.0
AFTER_WINDOW = 15.0


def _status_times(sim: SimState) -> list[float]:
    return [r.at for r in sim.requests if r.endpoint == "status"]


def _per_second(times: list[float], start: float, end: float) -> list[int]:
    buckets = Counter(int(t - start) for t in times if start <= t < end)
    return [buckets.get(i, 0) for i in range(int(end - start))]


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
        )
        assert cli(config, "db", "upgrade").returncode == 0
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
            # Two full intervals to settle, then the steady rate.
            time.sleep(2 * INTERVAL)
            steady_start = sim.now()
            time.sleep(STEADY_WINDOW)
            steady_end = sim.now()
        steady = _per_second(_status_times(sim), steady_start, steady_end)
        steady_rate = sum(steady) / len(steady)
        stopped = sim.now()
        time.sleep(DOWN)
        with service_process(config, port):
            restarted = sim.now()
            time.sleep(AFTER_WINDOW)
        assert not [t for t in _status_times(sim) if stopped + 1 < t < restarted]
        after = _per_second(_status_times(sim), restarted, restarted + AFTER_WINDOW)
        assert sum(after) >= OPERATIONS, "not every overdue operation was read after the restart"
        assert max(after) <= 2 * steady_rate, (
            f"peak {max(after)}/s after the restart against a steady {steady_rate:.1f}/s "
            f"(per second after: {after}; steady: {steady})"
        )
