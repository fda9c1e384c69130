"""Attack: flooding the disk through status reads, the WAL and the create retry loop.

A ~1 MB request must be written once and never again; a status read writes only
what changed; the WAL is reset when it grows; the create path waits one backoff
step per call with the provider down. ``bench/amplification.py`` measures the
same end to end in bytes (``/proc/self/io``).
"""

from __future__ import annotations

import random
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from reconciler.core.backoff import BackoffPolicy
from reconciler.core.create import next_try_at
from reconciler.core.states import State
from reconciler.storage import migrate
from reconciler.storage.database import Database
from reconciler.storage.journal import Journal
from reconciler.storage.operations import get_operation
from reconciler.storage.payloads import load_request
from reconciler.storage.tables import PAYLOAD_TABLE
from tests.support.factories import insert_operation
from tests.support.stack import running_stack
from tests.support.waiting import wait_until

NOW = datetime(2026, 6, 1, tzinfo=UTC)
BIG = {"pad": "x" * 1_000_000}


def _wal(db: Database) -> int:
    return db.wal_bytes()


def _status_read(db: Database, journal: Journal, op_id: str, n: int) -> None:
    """What a status read writes: the charge, then the answer with its observation."""
    with db.write() as conn:
        op = get_operation(conn, op_id)
        assert op is not None
        op = journal.write(conn, op, now=NOW, changes={"status_requests_used": n})
        journal.write(conn, op, now=NOW, changes={"remote_state": "running", "next_poll_at": NOW})


@pytest.mark.both_backends
def test_a_status_read_does_not_rewrite_the_request(db_url: str, backend: str) -> None:
    db = Database(db_url)
    journal = Journal()
    try:
        op = insert_operation(db, journal, NOW, request=BIG, state=State.OBSERVING.value)
        with db.read() as conn:
            assert load_request(conn, op.id) == BIG
            before = conn.execute(sa.select(PAYLOAD_TABLE)).mappings().all()
        if backend == "postgres":
            with db.read() as conn:
                xmin = conn.execute(sa.text("SELECT xmin::text FROM operation_payloads")).all()
        if db.sqlite:
            db.checkpoint("TRUNCATE")
        start = _wal(db)
        for n in range(1, 11):
            _status_read(db, journal, op.id, n)
        grown = _wal(db) - start
        with db.read() as conn:
            assert conn.execute(sa.select(PAYLOAD_TABLE)).mappings().all() == before
            if backend == "postgres":
                # The payload row was never updated: same tuple, same creating transaction.
                again = conn.execute(sa.text("SELECT xmin::text FROM operation_payloads")).all()
                assert again == xmin
        if db.sqlite:
            # Ten reads (twenty commits) of a 1 MB operation: a few pages each, not megabytes.
            assert grown < 20 * 5 * 4200, grown
    finally:
        db.dispose()


def test_the_wal_is_reset_once_it_passes_its_bound(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'wal.db'}"
    db = Database(url)
    migrate.upgrade(db)
    db.dispose()
    db = Database(url, background_checkpoint=True)
    try:
        with db.read() as reader:
            reader.exec_driver_sql("SELECT count(*) FROM operations").all()  # an old snapshot
            journal = Journal()
            for i in range(20):
                insert_operation(db, journal, NOW, request={"pad": "y" * 1_000_000, "i": i})
            grown = db.wal_bytes()
        assert grown > 16 * 1024 * 1024  # the reader kept every frame in the WAL
        wait_until(lambda: db.wal_bytes() <= 4 * 1024 * 1024, 10, "the WAL to be reset")
    finally:
        db.dispose()


def test_every_create_or_lookup_waits_one_growing_backoff_step() -> None:
    policy = BackoffPolicy(base_seconds=0.2, max_seconds=2.0, jitter_floor=0.5)
    rng = random.Random(3)
    deadline = NOW + timedelta(seconds=60)
    waits = [(next_try_at(deadline, n, NOW, rng, policy) - NOW).total_seconds() for n in (1, 2, 3)]
    assert 0.2 <= waits[0] <= 0.4 and 0.4 <= waits[1] <= 0.8 and 0.8 <= waits[2] <= 1.6
    assert next_try_at(NOW + timedelta(seconds=1), 10, NOW, rng, policy) == NOW + timedelta(
        seconds=1
    )


@pytest.mark.slow
def test_provider_down_costs_one_call_per_backoff_step(tmp_path: Path, db_url: str) -> None:
    """The reported storm: 20 operations, 2,457 lookups in 60 s. Now one call per step."""
    polling = {"base_delay_seconds": 0.2, "max_delay_seconds": 1.0, "jitter_floor": 0.5}
    with running_stack(tmp_path, db_url, provider={"polling": polling}) as stack:
        stack.runtime.providers["sim"] = stack.runtime.providers["sim"].model_copy(
            update={"base_url": "http://127.0.0.1:9"}
        )
        stack.runtime.adapters.clear()
        ids = [stack.create({"i": i}).json()["id"] for i in range(5)]
        window = 6.0
        time.sleep(window)
        with stack.runtime.db.read() as conn:
            calls = [
                (op.create_attempts + op.create_lookups)
                for op in (get_operation(conn, i) for i in ids)
                if op is not None
            ]
    # Shortest waits the jitter allows: 0.2, 0.4, 0.5, 0.5, ... seconds.
    steps, spent = 0, 0.0
    while spent < window:
        steps += 1
        spent += 0.5 * min(1.0, 0.2 * 2**steps)
    assert calls and max(calls) <= steps + 1, (calls, steps)
