"""The sweep under load: retention set to seconds while operations keep starting, ending,
retrying their completion and being read. The world sweeps at every moment it acts on,
so every batch runs between the steps of operations in flight.

Invariants, all zero: a job per started operation (no duplicate submissions, none
lost); every operation either stored whole or pruned with a tombstone, never both and
never pruned before it finished with its completion settled (one whose hook keeps
failing stays until that is given up, and then waits for a person); the hook run once
per operation; every read answered 200 or 410, nothing else; a retry of a pruned key starts
nothing; ``audit verify`` intact and accounting for every pruned operation.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from reconciler.core.states import END_STATES
from reconciler.storage import audit
from reconciler.storage.tables import TOMBSTONES
from tests.support import hooks
from tests.support.world import World, world

pytestmark = pytest.mark.both_backends

OPERATIONS = 60
WINDOW_SECONDS = 2.0
SCENARIOS: list[dict[str, Any]] = [
    {"scenario": "success", "duration": 1.5, "webhooks": "normal"},
    {"scenario": "success", "duration": 4.0, "webhooks": "never"},
    {"scenario": "late_failure", "duration": 3.0},
    {"scenario": "partial", "duration": 2.0},
    {"scenario": "success", "duration": 2.0, "webhooks": "duplicate", "duplicates": 2},
]


def test_sweeping_every_moment_under_load_keeps_every_invariant(
    tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "hooks.log"
    monkeypatch.setenv(hooks.LOG_ENV, str(log))
    rng = random.Random(20261205)

    async def body(w: World) -> None:
        started: dict[str, str] = {}  # id -> idempotency key
        failing: set[str] = set()  # their second hook fails until it is given up
        reads: Counter[int] = Counter()
        for i in range(OPERATIONS):
            key = f"load-{i}"
            fails = i % 6 == 5
            response = await w.submit(
                dict(rng.choice(SCENARIOS)),
                idempotency_key=key,
                **({"metadata": {"hook": "fail"}} if fails else {}),
            )
            assert response.status_code == 202, response.text
            started[response.json()["id"]] = key
            if fails:
                failing.add(response.json()["id"])
            await w.advance(rng.uniform(0.05, 0.6))
            for op_id in rng.sample(sorted(started), min(3, len(started))):
                got = await w.client.get(f"/v1/operations/{op_id}", headers=w.headers())
                reads[got.status_code] += 1
        # Everything ends, each completion settles (the failing hook is given up after its
        # attempts, which opens an escalation), and the window passes.
        await w.advance(300.0)

        assert set(reads) <= {200, 410}, reads
        assert reads[410] > 0, "reads should have met pruned operations during the run"
        assert len(w.sim.jobs) == OPERATIONS, "one job per started operation"
        with w.runtime.db.read() as conn:
            stones = {r.operation_id: r for r in conn.execute(sa.select(TOMBSTONES))}
            live = {r[0] for r in conn.execute(sa.text("SELECT id FROM operations"))}
        assert not (live & set(stones)), "an operation both stored and pruned"
        assert set(started) == live | set(stones), "an operation lost"
        # What is left is exactly what waits for a person: the given-up completions.
        assert live == failing
        assert all(w.row(op_id)["escalation_open"] for op_id in live)
        ended = {state.value for state in END_STATES}
        for stone in stones.values():
            assert stone.state in ended
            assert (stone.pruned_at - stone.done_at).total_seconds() >= WINDOW_SECONDS - 1e-3
        runs = Counter(line.split()[1] for line in log.read_text().splitlines())
        assert runs == dict.fromkeys(started, 1), "the hook ran other than once"

        again = await w.submit(dict(SCENARIOS[0]), idempotency_key=started[next(iter(stones))])
        assert again.status_code in (409, 410), again.text
        assert len(w.sim.jobs) == OPERATIONS

        report = audit.verify(w.runtime.db, w.runtime.journal.key)
        assert report.ok, report.fault
        assert report.retention is not None
        assert report.retention.operations == OPERATIONS - len(failing)

    async def main() -> None:
        async with world(
            tmp_path,
            db_url,
            hooks=(hooks.RECORD, hooks.FAILS_WHEN_ASKED),
            retention={"operations_days": WINDOW_SECONDS / 86_400, "batch_size": 4},
        ) as w:
            await body(w)

    asyncio.run(main())
