"""A deadline that passes during our own outage does not time the operation out falsely.

The service runs as a real process; the provider finishes its jobs early, while our
database is unavailable, so every webhook of theirs is refused and no status read can
be charged. The outage outlasts every operation's deadline. On PostgreSQL the test's
own cluster is crashed (``pg_ctl -m immediate``) and started again; on SQLite an
outside connection holds ``BEGIN EXCLUSIVE``. Before the fix every operation ended
``result_timed_out`` (``deadline_exceeded``, no status read after recovery) and its
agent was told so in a signed callback; now each is read once after recovery and
succeeds, with exactly one callback saying ``succeeded``.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from bench.soak_infra import ThrowawayPostgres

from reconciler.demo.sim import SimConfig, SimState
from reconciler.demo.sim import create_app as create_sim
from reconciler.storage.database import Database
from tests.support import loopback
from tests.support.faults import history, stored
from tests.support.hooks import serve_receiver
from tests.support.process import cli, make_tokens, service_config, service_process
from tests.support.servers import serve_asgi
from tests.support.stack import SIM_TOKEN, WEBHOOK_SECRET
from tests.support.waiting import wait_until

pytestmark = pytest.mark.both_backends

OPERATIONS = 6
DEADLINE = 10.0  # seconds from create: inside the outage
DONE_AFTER = 4.0  # the provider finishes this long after create, during the outage
OUTAGE = 12.0  # from the moment every job id is in: past every deadline
POLLING = {"base_delay_seconds": 0.5, "max_delay_seconds": 1, "deadline_seconds": DEADLINE}


class OwnCluster(ThrowawayPostgres):
    """A cluster of the test's own, so that crashing it touches nobody else."""

    def crash(self) -> None:
        self._pg_ctl_stop("immediate")

    def restart(self) -> None:
        self._pg_ctl_start()


@contextmanager
def own_postgres() -> Iterator[OwnCluster]:
    cluster = OwnCluster()
    try:
        cluster.start()
    except (RuntimeError, OSError) as exc:
        cluster.stop()
        pytest.skip(f"cannot start a PostgreSQL cluster here: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()


def _run(
    tmp_path: Path, db_url: str, down: Callable[[], None], up: Callable[[], None]
) -> dict[str, Any]:
    """Create the operations, take storage away past their deadlines, give it back."""
    sim = SimState(SimConfig(token=SIM_TOKEN, webhook_secret=WEBHOOK_SECRET))
    with serve_asgi(create_sim(state=sim)) as sim_url, serve_receiver() as (receiver, cb_url):
        config, port = service_config(
            tmp_path, db_url, sim_url, provider=POLLING, server={"write_wait_seconds": 2.0}
        )
        assert cli(config, "db", "upgrade").returncode == 0
        agent, _ = make_tokens(db_url)
        with service_process(config, port) as svc:
            sim.config.webhook_url = f"{svc.url}/webhooks/sim"
            headers = {"Authorization": f"Bearer {agent}"}
            body = {"scenario": "success", "duration": DONE_AFTER}

            def create(i: int) -> str:
                created = loopback.post(
                    f"{svc.url}/v1/operations",
                    json={"provider": "sim", "request": body, "callback_url": f"{cb_url}/cb/{i}"},
                    headers=headers,
                    timeout=10,
                )
                assert created.status_code == 202, created.text
                op_id: str = created.json()["id"]
                return op_id

            with ThreadPoolExecutor(OPERATIONS) as pool:  # all inside one second
                ids = list(pool.map(create, range(OPERATIONS)))
            wait_until(
                lambda: all(
                    loopback.get(f"{svc.url}/v1/operations/{i}", headers=headers).json()["state"]
                    != "create_pending"
                    for i in ids
                ),
                10,
                "every job id to be in",
            )
            down()
            time.sleep(OUTAGE)  # the outage itself, past every deadline by design
            up()
            db = Database(db_url)
            try:
                wait_until(
                    lambda: all(
                        stored(db, i).done_at and not stored(db, i).completion_pending for i in ids
                    ),
                    60,
                    "every operation to end and complete",
                )
                rows = [stored(db, i) for i in ids]
                causes = [[e.cause for e in history(db, i)] for i in ids]
            finally:
                db.dispose()
            wait_until(lambda: len(receiver.deliveries()) >= OPERATIONS, 30, "the callbacks")
            time.sleep(1.0)  # a duplicate would come within the retry delay
            callbacks = [json.loads(d.body)["operation"] for d in receiver.deliveries()]
    jobs = list(sim.jobs.values())
    return {
        "states": Counter(r.state for r in rows),
        "reasons": Counter("storage_outage" in c for c in causes),
        # When each job succeeded at the provider, seconds after its create.
        "done_after": [
            round(t.at - j.timeline[0].at, 2)
            for j in jobs
            for t in j.timeline
            if t.state == "succeeded"
        ],
        "reads_after": [r.status_requests_used for r in rows],
        "callbacks": Counter((c["id"], c["state"]) for c in callbacks),
        "ids": ids,
        "causes": causes,
    }


def _check(found: dict[str, Any]) -> None:
    print(found)  # the figures: what the operations ended as
    assert len(found["done_after"]) == OPERATIONS
    assert all(after < DEADLINE for after in found["done_after"]), "done before the deadline"
    assert found["states"] == {"succeeded": OPERATIONS}, found
    assert found["reasons"] == {True: OPERATIONS}, "each outage recorded as ours"
    assert found["callbacks"] == {(i, "succeeded"): 1 for i in found["ids"]}, found["callbacks"]


def test_a_postgres_crash_over_the_deadlines_times_nothing_out(tmp_path: Path) -> None:
    with own_postgres() as cluster:
        url = f"postgresql+psycopg://postgres@127.0.0.1:{cluster.port}/postgres"
        found = _run(tmp_path, url, cluster.crash, cluster.restart)
    _check(found)


def test_a_sqlite_lock_over_the_deadlines_times_nothing_out(tmp_path: Path) -> None:
    db_path = tmp_path / "reconciler.db"
    outside: list[sqlite3.Connection] = []

    def lock() -> None:
        conn = sqlite3.connect(db_path, isolation_level=None, timeout=10)
        conn.execute("BEGIN EXCLUSIVE")
        outside.append(conn)

    def unlock() -> None:
        conn = outside.pop()
        conn.execute("ROLLBACK")
        conn.close()

    found = _run(tmp_path, f"sqlite:///{db_path}", lock, unlock)
    _check(found)
