"""The short chaos soak, as a test: 150 operations, three SIGKILLs, every invariant zero.

``bench/soak.py`` runs the service as real processes on the test's database (SQLite; on
PostgreSQL two replicas), the simulated provider with random faults on every endpoint and
random webhook behaviour, an agent load with repeated idempotency keys and cancels, a
callback receiver and logging hooks, and kills the service at random moments. The seed is
fixed so a failure replays (``RECONCILER_SOAK_SEED`` picks another; the report names the
replay command). ``make soak`` runs the long one.

With the fixed seed the first 150 operations draw every kind of the mix that 300 drew
(the plan of a run is drawn in order, so they are the first half of the 300), in 15 s
of submissions; the three kills land among them as among 300, each checked to have hit
work in flight, and every invariant is checked as before.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from bench.soak import SoakConfig, run

pytestmark = pytest.mark.both_backends

SEED = int(os.environ.get("RECONCILER_SOAK_SEED", "20261129"))
OPERATIONS = int(os.environ.get("RECONCILER_SOAK_OPERATIONS", "150"))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_short_soak_keeps_every_invariant(tmp_path: Path, db_url: str, backend: str) -> None:
    started = time.monotonic()
    result = run(
        SoakConfig(
            operations=OPERATIONS,
            kills=3,
            seed=SEED,
            replicas=2 if backend == "postgres" else 1,
            rate=10.0,
            max_active=120,
            database_url=db_url,
            settle_seconds=150.0,
            workdir=tmp_path / "soak",
            quiet=True,
        )
    )
    print(result.report)
    print(f"soak on {backend}: {time.monotonic() - started:.1f} s")
    breaches = {inv.name: inv.breaches[:5] for inv in result.invariants if inv.count}
    assert not breaches, f"{breaches}\n{result.report}"
    # The run did what it claims: every operation settled, the kills happened and hit work.
    assert result.figures.operations == OPERATIONS
    assert len(result.kills) == 3
    assert sum(sum(k.windows.values()) for k in result.kills) > 0
    # Webhook trust was on and judged the completions (its random webhook loss: misses).
    assert result.trust_verdicts.get("webhook_first", 0) > 0, result.report
    assert result.trust_verdicts.get("miss", 0) > 0, result.report
