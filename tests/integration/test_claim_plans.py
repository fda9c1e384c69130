"""Every statement of a tick on the operations table uses an index, on both databases.

A tick must cost the same with 10 k or 100 k operations in flight: the due rows are found
by ``next_poll_at`` (``ix_operations_due``), and every other row a tick touches by its id.
SQLite plans without statistics and took the state index for the overdue probe and the
completion shares, and the provider's index for the provider share, so a tick read every
operation in flight (``bench/poller.py --only ticks``: 37 ms at 10 k, 420 ms at 100 k).

The statements are the ones a real tick runs (a worker's tick over a seeded table, each
statement recorded as it reaches the driver), with the claims a tick makes only at times
(the catch-up scan, the callbacks share with full hosts left out) run beside it. Each is
explained (SQLite: ``EXPLAIN QUERY PLAN``; PostgreSQL: ``EXPLAIN``, after ``ANALYZE``) on a
table where most rows are in flight and not due, and many are done.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from bench import poller
from psycopg import ClientCursor

from reconciler.core.states import State
from reconciler.engine.catch_up import NOT_SPREAD
from reconciler.storage import fastsql, leases, retention
from reconciler.storage.database import Database
from reconciler.storage.tables import OPS
from tests.support.statements import Ran, recording

pytestmark = pytest.mark.both_backends

IN_FLIGHT = 6000
DUE = 16
DONE_SHARE = 3  # one row in three has ended, its completion done (no next read)


@pytest.fixture(scope="module")
def seeded(module_db_url: str) -> tuple[str, list[str], datetime]:
    """A table of mostly not-due operations, many of them done; the due ones' ids."""
    now = datetime.now(UTC)
    due_ids = poller.seed(module_db_url, IN_FLIGHT, DUE, now)
    db = Database(module_db_url)
    try:
        with db.write() as conn:
            ids = [row[0] for row in conn.execute(sa.select(OPS.c.id).order_by(OPS.c.id))]
            done = [i for n, i in enumerate(ids) if n % DONE_SHARE == 0 and i not in due_ids]
            conn.execute(
                sa.update(OPS)
                .where(OPS.c.id.in_(done))
                .values(
                    state=State.SUCCEEDED.value,
                    next_poll_at=None,
                    delay_source=None,
                    done_at=now - timedelta(days=40),
                )
            )
        if not db.sqlite:
            with db.engine.connect() as conn:
                conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("ANALYZE")
    finally:
        db.dispose()
    return module_db_url, due_ids, now


def _tick(
    db_url: str, due_ids: list[str], now: datetime, work: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[int, list[Ran]]:
    """One tick of a real worker until its steps are done: what it claimed, what it ran."""

    async def one() -> tuple[int, list[Ran]]:
        rig = poller.TickRig.build(db_url, due_ids, now, work)
        try:
            with recording(monkeypatch) as ran:
                _, _, claimed = await rig.tick()
        finally:
            await rig.close()
        return claimed, ran

    return asyncio.run(one())


def _occasional_claims(db: Database, now: datetime) -> None:
    """The claim-path statements a quiet tick does not run: the catch-up's scan, the
    callbacks share with some hosts full, and the release."""
    with db.write() as conn:
        leases.due_status_reads(conn, now, NOT_SPREAD, 100)
        full = leases.ShareFilter(
            completion=True, lanes=leases.Lanes.CALLBACKS, exclude=("callback:a.example",)
        )
        claimed = leases.claim_records(conn, "plans", now, 30.0, 10, full)
        claimed += leases.claim_records(conn, "plans", now, 30.0, 10)
        leases.release(conn, [op.id for op, _ in claimed] or ["op_none"], "plans")


def _numbered(sql: str) -> str:
    """psycopg's ``%s`` marks as the server's ``$1``, ``$2``, ... (``%%`` is a ``%``)."""
    parts = sql.split("%%")
    count = 0
    for index, part in enumerate(parts):
        pieces = part.split("%s")
        text = pieces[0]
        for piece in pieces[1:]:
            count += 1
            text += f"${count}{piece}"
        parts[index] = text
    return "%".join(parts)


def _plan(db: Database, sql: str, params: Any, *, index_only: bool = False) -> list[str]:
    """The statement's plan. On PostgreSQL its generic plan: what the server runs for every
    value once psycopg has prepared the statement and the plan cache settles on one plan
    (a probe with LIMIT 1 and no order read the whole table that way, 40 ms at 200 k rows)."""
    if db.sqlite:
        with db.read() as conn:
            cursor = fastsql.run(conn, "EXPLAIN QUERY PLAN " + sql, params)
            return [str(row[-1]) for row in cursor.fetchall()]
    with db.read() as conn:
        fastsql.run(conn, "SET LOCAL plan_cache_mode = force_generic_plan")
        if index_only:
            fastsql.run(conn, "SET LOCAL enable_seqscan = off")
        fastsql.run(conn, "PREPARE planned AS " + _numbered(sql))
        # The values as literals, which take the types the PREPARE inferred.
        marks = f"({', '.join(['%s'] * len(params))})" if params else ""
        execute = ClientCursor(conn.connection.dbapi_connection).mogrify(
            f"EXPLAIN EXECUTE planned{marks}", params
        )
        cursor = fastsql.run(conn, execute.replace("%", "%%"))
        plan = [str(row[-1]) for row in cursor.fetchall()]
        fastsql.run(conn, "DEALLOCATE planned")  # a session's, not the transaction's
        return plan


def _on_operations(sql: str) -> bool:
    words = sql.replace("(", " ").split()
    return any(a in ("FROM", "UPDATE", "INTO") and b == "operations" for a, b in pairwise(words))


def _full_scans(db: Database, plan: Sequence[str]) -> list[str]:
    if db.sqlite:
        scans = ("SCAN operations", "SCAN TABLE operations")
        return [line for line in plan if line.startswith(scans)]
    return [line for line in plan if "Seq Scan on operations" in line]


def test_each_statement_of_a_tick_on_operations_uses_an_index(
    seeded: tuple[str, list[str], datetime], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db_url, due_ids, now = seeded
    claimed, recorded = _tick(db_url, due_ids, now, tmp_path, monkeypatch)
    assert claimed == DUE
    db = Database(db_url)
    try:
        with recording(monkeypatch) as more:
            _occasional_claims(db, now)
        recorded += more
        statements = {sql: params for sql, params in recorded if _on_operations(sql)}
        due = [sql for sql in statements if "next_poll_at <" in sql]
        # The overdue probe, the catch-up scan, and the provider, hooks and both callbacks
        # shares' claims: each finds its rows by their due time.
        assert len(due) >= 6, due
        plans = {sql: _plan(db, sql, params) for sql, params in statements.items()}
    finally:
        db.dispose()
    for sql, plan in plans.items():
        assert not _full_scans(db, plan), (sql, plan)
        if db.sqlite:
            assert any(" USING " in line for line in plan), (sql, plan)
        else:
            assert any("Index" in line for line in plan), (sql, plan)
    for sql in due:
        assert any("ix_operations_due" in line for line in plans[sql]), (sql, plans[sql])
        # The index gives the rows in due order: nothing is sorted after reading them all.
        assert not any("TEMP B-TREE FOR ORDER BY" in line for line in plans[sql]), plans[sql]


def _scans_of(db: Database, table: str, plan: Sequence[str]) -> list[str]:
    if db.sqlite:
        return [line for line in plan if line.startswith((f"SCAN {table}", f"SCAN TABLE {table}"))]
    return [line for line in plan if f"Seq Scan on {table}" in line]


def test_a_prune_batch_finds_its_rows_by_index(
    seeded: tuple[str, list[str], datetime], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweep walks finished rows by ``done_at`` (``ix_operations_finished``) and deletes
    each table's rows by operation id: no statement reads a whole table, so a batch costs
    the same at 100 k rows as at 10 k. The batch is rolled back (the table is shared).

    PostgreSQL reads a table of a few thousand rows whole when that is cheaper (history
    holds one entry per operation here); its deletes are explained with sequential scans
    off, which shows an index serves each of them."""
    db_url, _, now = seeded
    db = Database(db_url)
    try:
        with recording(monkeypatch) as ran, db.engine.connect() as conn, conn.begin() as batch:
            removed = retention.prune_batch(conn, now - timedelta(days=30), now, 50, "t", None)
            batch.rollback()
        assert removed.operations == 50
        plans = [
            (sql, _plan(db, sql, params, index_only=sql.startswith("DELETE")))
            for sql, params in ran
        ]
    finally:
        db.dispose()
    pick = [plan for sql, plan in plans if sql.startswith("SELECT id, caller")]
    assert pick and any("ix_operations_finished" in line for line in pick[0]), pick
    assert not any("TEMP B-TREE FOR ORDER BY" in line for line in pick[0]), pick  # oldest first
    # Each picked row's steps are probed by its id: an anti-join read the whole steps table.
    assert not any("Anti Join" in line or "SCAN s" in line for line in pick[0]), pick
    for sql, plan in plans:
        for table in ("operations", "history", "operation_payloads"):
            assert not _scans_of(db, table, plan), (sql, plan)
