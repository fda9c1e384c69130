"""A prune killed (SIGKILL) in the middle of its batches, then run again; and two pruners
at once. Each batch is one transaction: an operation goes with all its rows and its
tombstone and its retention record, or stays whole, whatever moment the kill lands.

The kill lands while a batch waits for a lock the test holds: on PostgreSQL the batch has
already deleted rows in its transaction (it waits for the retention log), on SQLite it
waits for the write lock between two batches, which the test takes between batches until
it sees one committed. Nothing is ordered by sleeping: the test polls the database for
the first committed batch and for the batch's wait.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa

from reconciler.core.retention import RetentionPolicy, cutoffs
from reconciler.storage import audit, retention
from reconciler.storage.database import Database
from reconciler.storage.journal import Journal
from reconciler.storage.pruner import Pruner
from tests.support import forked
from tests.support.factories import seed_finished
from tests.support.process import ROOT, cli_here, service_config, service_env
from tests.support.waiting import wait_until

pytestmark = pytest.mark.both_backends

LONG_AGO = datetime(2025, 1, 1, tzinfo=UTC)
SEEDED = 400


def _log_records(db: Database) -> int:
    with db.read() as conn:
        return len(retention.retention_log(conn))


@contextmanager
def _held(db: Database) -> Iterator[None]:
    """A lock the prune's next batch needs, taken once a first batch committed and held
    until the block ends. On SQLite the write lock itself: taken again and again between
    batches until a committed record is seen under it, so the prune cannot finish while
    the test looks. Each try is refused at once while a batch holds the lock and made
    again a moment later: SQLite's own busy wait sleeps up to 100 ms between its looks,
    long enough on a loaded machine for the prune's back-to-back batches to finish."""
    if db.sqlite:
        path = sa.make_url(db.url).database
        assert path
        conn = sqlite3.connect(path, timeout=0, isolation_level=None)
        try:
            deadline = time.monotonic() + 60
            while True:
                assert time.monotonic() < deadline, "no batch committed within 60 s"
                try:
                    conn.execute("BEGIN IMMEDIATE")
                except sqlite3.OperationalError as exc:
                    if "locked" not in str(exc):
                        raise
                    time.sleep(0.0005)  # a batch holds it: look again
                    continue
                if conn.execute("SELECT count(*) FROM retention_log").fetchone()[0] >= 1:
                    break
                conn.execute("ROLLBACK")
            yield
            conn.execute("ROLLBACK")
        finally:
            conn.close()
        return
    wait_until(lambda: _log_records(db) >= 1, 60, "the first batch to commit")
    with db.engine.connect() as conn:
        conn.execute(sa.text("LOCK TABLE retention_log IN ACCESS EXCLUSIVE MODE"))
        yield
        conn.rollback()


def _waiting_on_lock(db: Database) -> bool:
    """PostgreSQL: another session waits for a lock (the batch, mid-transaction)."""
    with db.read() as conn:
        return bool(
            conn.execute(
                sa.text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
                )
            ).scalar_one()
        )


def _rows_of(db: Database, ids: list[str]) -> dict[str, tuple[int, int, int, int]]:
    """Per operation: (operation rows, history rows, payload rows, tombstones)."""
    with db.read() as conn:

        def per(table: str, column: str) -> dict[str, int]:
            query = sa.text(f"SELECT {column}, count(*) FROM {table} GROUP BY {column}")
            return {str(k): int(v) for k, v in conn.execute(query)}

        ops = per("operations", "id")
        history = per("history", "operation_id")
        payloads = per("operation_payloads", "operation_id")
        stones = per("tombstones", "operation_id")
    return {
        i: (ops.get(i, 0), history.get(i, 0), payloads.get(i, 0), stones.get(i, 0)) for i in ids
    }


def _whole_or_gone(db: Database, ids: list[str]) -> int:
    """Every operation whole and without a tombstone, or gone with one; how many went."""
    rows = _rows_of(db, ids)
    broken = {i: r for i, r in rows.items() if r not in ((1, 1, 1, 0), (0, 0, 0, 1))}
    assert not broken, f"half-pruned operations: {list(broken.items())[:5]}"
    gone = sum(1 for r in rows.values() if r == (0, 0, 0, 1))
    with db.read() as conn:
        logged = sum(r["operations"] for r in retention.retention_log(conn))
    assert logged == gone, "the retention log must account for exactly what went"
    return gone


@pytest.mark.timeout(180)
def test_a_prune_killed_mid_batch_leaves_whole_operations(
    tmp_path: Path, db_url: str, db: Database
) -> None:
    ids = seed_finished(db, Journal(), SEEDED, LONG_AGO)
    config, _ = service_config(
        tmp_path,
        db_url,
        "http://127.0.0.1:9",
        scheduler={"lease_seconds": 1.0},
        retention={"batch_size": 1},  # many short batches: the kill lands among them
    )
    argv = ["db", "prune", "--older-than", "30d", "--config", str(config)]
    proc = forked.reconciler(argv, service_env(), ROOT, tmp_path / "prune.log")
    try:
        with _held(db):
            if not db.sqlite:
                wait_until(lambda: _waiting_on_lock(db), 30, "a batch to wait mid-transaction")
            proc.kill()
            proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    gone = _whole_or_gone(db, ids)
    assert 0 < gone < SEEDED, f"the kill should land mid-run ({gone} of {SEEDED} pruned)"
    assert audit.verify(db, None).ok

    # The dead pruner's lease lapses (1 s); the next run finishes the job.
    def rerun() -> bool:
        done = cli_here(config, "db", "prune", "--older-than", "30d")
        return done.returncode == 0

    wait_until(rerun, 60, "a prune after the killed one's lease lapsed")
    assert _whole_or_gone(db, ids) == SEEDED
    report = audit.verify(db, None)
    assert report.ok and report.retention is not None
    assert report.retention.operations == SEEDED


def test_two_pruners_at_once_prune_each_operation_once(db: Database) -> None:
    """Two replicas' pruners that both hold the lease (its owner name shared, as after a
    lapse that both saw): on PostgreSQL their batches pick disjoint rows (SKIP LOCKED) and
    collide on the log's sequence, which rolls one batch back to be taken again; on SQLite
    the writes take turns. Either way each operation is pruned once and recorded once."""
    ids = seed_finished(db, Journal(), 300, LONG_AGO)
    limits = cutoffs(RetentionPolicy.of_days(30, 0, 0), datetime.now(UTC))
    results: list[int] = []
    errors: list[BaseException] = []

    def prune() -> None:
        try:
            pruner = Pruner(db, lambda: datetime.now(UTC), "replica", None, batch_size=3)
            results.append(pruner.run(limits).operations)
        except BaseException as exc:  # reported below, with the thread's result
            errors.append(exc)

    threads = [threading.Thread(target=prune) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    assert sum(results) == 300
    assert _whole_or_gone(db, ids) == 300
    with db.read() as conn:
        seqs = [r["seq"] for r in retention.retention_log(conn)]
    assert seqs == list(range(1, len(seqs) + 1))
    assert audit.verify(db, None).ok
