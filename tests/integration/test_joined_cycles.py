"""Two replicas' joined commits on one PostgreSQL over the same operations.

Each replica is a ``Database`` of its own (its own writer threads and connections), both
on one database. Writes declare the operation they lock (``run_joined(key=...)``): a
joined transaction runs them in that order, so two replicas that queued the same
operations in opposite orders still lock them in one order, and neither waits on the
other in a cycle. A cycle met anyway (writes that declare nothing, made to lock in
opposite orders) is broken by PostgreSQL, which fails one transaction; that batch runs
again whole, and no caller sees an error. Either way every write lands exactly once.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy.engine import Connection

from reconciler.core.chain import Entry
from reconciler.core.records import OperationRecord
from reconciler.core.vocabulary import HistoryKind
from reconciler.storage import on_loop
from reconciler.storage import operations as store
from reconciler.storage.database import CYCLE_ATTEMPTS, Database
from reconciler.storage.history import history_of
from reconciler.storage.journal import Journal
from tests.support.factories import new_operation
from tests.support.writers import held_until

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]

NOW = datetime(2026, 1, 1, tzinfo=UTC)
JOURNAL = Journal()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def replicas(pg_url: str) -> Iterator[tuple[Database, Database]]:
    a, b = Database(pg_url), Database(pg_url)
    try:
        yield a, b
    finally:
        a.dispose()
        b.dispose()


def _seed(db: Database, n: int) -> list[OperationRecord]:
    ops = sorted((new_operation(NOW) for _ in range(n)), key=lambda op: op.id)
    with db.write() as conn:
        for op in ops:
            JOURNAL.insert(conn, op, actor="test", cause="test:create", now=NOW)
    return ops


def _note(replica: str, op_id: str, meet: Callable[[], None] | None = None) -> Any:
    """A step's write: one history entry and a changed column on the row as it is now."""
    runs = [0]

    def write(conn: Connection) -> str:
        runs[0] += 1
        fresh = store.load_records(conn, [op_id])[0]
        JOURNAL.write(
            conn,
            fresh,
            now=NOW,
            changes={"next_poll_at": NOW + timedelta(seconds=runs[0])},
            entries=[Entry(kind=HistoryKind.NOTE, actor=replica, cause="test:note")],
        )
        if meet is not None and runs[0] == 1:
            on_loop.off_loop(meet)  # holds this row until the other replica holds its own first row
        return op_id

    return write


async def _joined_behind_held_writers(
    queues: list[tuple[Database, list[tuple[Any, str]]]],
) -> list[Any]:
    """Queue each replica's (write, key) list while its writer threads are all held, then
    let them all go at once; every outcome (a result or the error raised), in order."""
    go = threading.Event()
    entered = threading.Semaphore(0)
    hold = held_until(go, entered)
    held = []
    for db, _ in queues:
        threads = db.writer.count
        held += [asyncio.ensure_future(db.run_write(hold)) for _ in range(threads)]
    for _ in held:
        assert await asyncio.to_thread(entered.acquire, True, 10)
    tasks = [
        asyncio.ensure_future(db.run_joined(write, attempts=5, key=key))
        for db, writes in queues
        for write, key in writes
    ]
    await asyncio.sleep(0)
    go.set()
    await asyncio.gather(*held)
    return list(await asyncio.gather(*tasks, return_exceptions=True))


def _notes(db: Database, ops: list[OperationRecord]) -> dict[str, list[str]]:
    with db.read() as conn:
        return {
            op.id: sorted(h.actor for h in history_of(conn, op.id) if h.kind == HistoryKind.NOTE)
            for op in ops
        }


async def test_opposite_orders_take_the_rows_in_one_order(
    replicas: tuple[Database, Database],
) -> None:
    a, b = replicas
    ops = _seed(a, 24)
    outcomes = await _joined_behind_held_writers(
        [
            (a, [(_note("a", op.id), op.id) for op in ops]),
            (b, [(_note("b", op.id), op.id) for op in reversed(ops)]),
        ]
    )
    assert outcomes == [op.id for op in ops] + [op.id for op in reversed(ops)]
    assert a.write_cycles == 0 and b.write_cycles == 0
    assert _notes(a, ops) == {op.id: ["a", "b"] for op in ops}
    assert not a.availability.outages_between(NOW - timedelta(days=1), datetime.now(UTC))
    assert not b.availability.outages_between(NOW - timedelta(days=1), datetime.now(UTC))


async def test_a_cycle_met_anyway_runs_its_batch_again_and_loses_nothing(
    replicas: tuple[Database, Database],
) -> None:
    a, b = replicas
    first, second = _seed(a, 2)
    # Each replica's first write waits, holding its row, until the other holds its own:
    # then each asks for the other's row, and PostgreSQL must fail one of the two.
    meeting = threading.Barrier(2, timeout=10)
    outcomes = await _joined_behind_held_writers(
        [
            (a, [(_note("a", first.id, meeting.wait), ""), (_note("a", second.id), "")]),
            (b, [(_note("b", second.id, meeting.wait), ""), (_note("b", first.id), "")]),
        ]
    )
    assert outcomes == [first.id, second.id, second.id, first.id]
    # PostgreSQL fails one of the two. The batch it failed runs again at once, and on a
    # loaded machine that rerun can meet the other transaction again before it commits,
    # which PostgreSQL breaks the same way: every meeting is counted, none is an error.
    assert 1 <= a.write_cycles + b.write_cycles < CYCLE_ATTEMPTS
    assert _notes(a, [first, second]) == {first.id: ["a", "b"], second.id: ["a", "b"]}
    # Two transactions meeting is not the database failing: no outage is recorded.
    assert not a.availability.outages_between(NOW - timedelta(days=1), datetime.now(UTC))
    assert not b.availability.outages_between(NOW - timedelta(days=1), datetime.now(UTC))
