"""Joined writes (``Database.run_joined``): writes queued together commit in one
transaction, in the order of their keys, a failed one undoing only itself, and each
caller is answered only after that commit.

Every writer thread is held inside a job of its own while the writes queue behind it, so
what shares a transaction is decided by the queue, not by timing.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from reconciler.core.errors import Conflict, StaleWrite, StorageUnavailable
from reconciler.core.records import OperationRecord
from reconciler.engine.group_commit import GroupCommitter
from reconciler.storage import operations as store
from reconciler.storage.database import Database, savepoint
from reconciler.storage.journal import Journal
from reconciler.storage.tables import EVENTS
from reconciler.storage.webhook_events import IncomingEvent, Outcome
from reconciler.storage.writer import JOIN_LIMIT
from tests.support.factories import new_operation
from tests.support.waiting import wait_until_async
from tests.support.writers import held_until

pytestmark = pytest.mark.anyio

NOW = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _insert(journal: Journal, op: OperationRecord) -> Callable[[Connection], str]:
    def write(conn: Connection) -> str:
        return journal.insert(conn, op, actor="test", cause="test:create", now=NOW).id

    return write


def _stored(db: Database, ids: list[str]) -> set[str]:
    with db.read() as conn:
        return {op.id for op in store.load_records(conn, ids)}


async def _behind_a_held_writer(db: Database, writes: list[Callable[..., Any]]) -> list[Any]:
    """Queue ``writes`` (joined, or plain ones marked by ``plain``) while the writer is
    held, then let it go; the outcomes (a result or the error raised) in order."""
    go = threading.Event()
    held = await _hold_writers(db, go)
    tasks = []
    for write in writes:
        if getattr(write, "plain", False):
            tasks.append(asyncio.ensure_future(db.run_write(write)))
        else:
            attempts = getattr(write, "attempts", 1)
            key = getattr(write, "key", "")
            tasks.append(asyncio.ensure_future(db.run_joined(write, attempts=attempts, key=key)))
    await asyncio.sleep(0)  # each task has put its job in the queue
    go.set()
    await held
    return list(await asyncio.gather(*tasks, return_exceptions=True))


async def _hold_writers(db: Database, go: threading.Event) -> asyncio.Future[Any]:
    """Hold every writer inside a job of its own until ``go`` is set."""
    threads = db.writer.count
    entered = threading.Semaphore(0)
    hold = held_until(go, entered)
    held = asyncio.gather(*(db.run_write(hold) for _ in range(threads)))
    for _ in range(threads):
        assert await asyncio.to_thread(entered.acquire, True, 10)
    return held


@pytest.mark.both_backends
async def test_writes_queued_together_share_one_commit(db: Database) -> None:
    journal = Journal()
    ops = [new_operation(NOW) for _ in range(5)]
    before = db.write_transactions
    outcomes = await _behind_a_held_writer(db, [_insert(journal, op) for op in ops])
    assert outcomes == [op.id for op in ops]
    assert db.write_transactions - before == 1
    assert _stored(db, [op.id for op in ops]) == {op.id for op in ops}


@pytest.mark.both_backends
async def test_joined_writes_run_in_the_order_of_their_keys(db: Database) -> None:
    journal = Journal()
    ops = sorted((new_operation(NOW) for _ in range(4)), key=lambda op: op.id)
    order: list[str] = []

    def keyed(op: OperationRecord) -> Callable[[Connection], str]:
        def write(conn: Connection) -> str:
            order.append(op.id)
            return _insert(journal, op)(conn)

        write.key = op.id  # type: ignore[attr-defined]
        return write

    def many(conn: Connection) -> None:  # over many rows: no key, so first
        order.append("many")

    queued = [keyed(ops[2]), keyed(ops[0]), many, keyed(ops[3]), keyed(ops[1])]
    outcomes = await _behind_a_held_writer(db, queued)
    assert outcomes == [ops[2].id, ops[0].id, None, ops[3].id, ops[1].id]
    assert order == ["many", *(op.id for op in ops)]


@pytest.mark.both_backends
async def test_a_write_that_fails_leaves_nothing_and_the_others_commit(db: Database) -> None:
    journal = Journal()
    first, duplicate, last = new_operation(NOW), new_operation(NOW), new_operation(NOW)

    def twice(conn: Connection) -> str:
        _insert(journal, duplicate)(conn)
        return _insert(journal, duplicate)(conn)  # the same id again: a conflict

    def lost_race(conn: Connection) -> None:
        raise StaleWrite("another writer was first")

    before = db.write_transactions
    outcomes = await _behind_a_held_writer(
        db, [_insert(journal, first), twice, lost_race, _insert(journal, last)]
    )
    # All four in one transaction; on PostgreSQL after a first try without savepoints,
    # which the failures rolled back whole.
    assert db.write_transactions - before == (1 if db.sqlite else 2)
    assert outcomes[0] == first.id and outcomes[3] == last.id
    assert isinstance(outcomes[1], Conflict)
    assert isinstance(outcomes[2], StaleWrite)
    # The failed write's first insert went with its savepoint.
    assert _stored(db, [first.id, duplicate.id, last.id]) == {first.id, last.id}


@pytest.mark.both_backends
@pytest.mark.parametrize("together", [True, False], ids=["together", "alone"])
async def test_a_lost_race_is_run_again_and_leaves_nothing_of_its_first_attempt(
    db: Database, together: bool
) -> None:
    journal = Journal()
    first_try, second_try, other = new_operation(NOW), new_operation(NOW), new_operation(NOW)
    tries: list[int] = []

    def racing(conn: Connection) -> str:
        tries.append(1)
        if len(tries) == 1:
            _insert(journal, first_try)(conn)
            raise StaleWrite("another writer was first")
        return _insert(journal, second_try)(conn)

    if together:
        racing.attempts = 2  # type: ignore[attr-defined]
        outcomes = await _behind_a_held_writer(db, [racing, _insert(journal, other)])
        assert outcomes == [second_try.id, other.id]
    else:
        assert await db.run_joined(racing, attempts=2) == second_try.id
    assert len(tries) == 2
    ids = [first_try.id, second_try.id, other.id]
    assert _stored(db, ids) == ({second_try.id, other.id} if together else {second_try.id})


@pytest.mark.both_backends
async def test_a_storage_failure_in_one_write_fails_them_all(db: Database) -> None:
    journal = Journal()
    ops = [new_operation(NOW), new_operation(NOW)]

    def disk_gone(conn: Connection) -> None:
        raise StorageUnavailable("the database is unavailable; retry later")

    before = db.write_transactions
    outcomes = await _behind_a_held_writer(
        db, [_insert(journal, ops[0]), disk_gone, _insert(journal, ops[1])]
    )
    assert all(isinstance(o, StorageUnavailable) for o in outcomes), outcomes
    assert _stored(db, [op.id for op in ops]) == set()
    assert db.write_transactions - before == 1


async def test_a_plain_write_keeps_its_own_transaction_and_its_turn(db: Database) -> None:
    journal = Journal()
    ops = [new_operation(NOW) for _ in range(3)]
    order: list[str] = []

    def joined(op: OperationRecord) -> Callable[[Connection], str]:
        def write(conn: Connection) -> str:
            order.append(op.id)
            return _insert(journal, op)(conn)

        return write

    def plain() -> str:
        order.append("plain")
        with db.write() as conn:
            return _insert(journal, ops[2])(conn)

    plain.plain = True  # type: ignore[attr-defined]
    before = db.write_transactions
    outcomes = await _behind_a_held_writer(db, [joined(ops[0]), plain, joined(ops[1])])
    assert outcomes == [op.id for op in (ops[0], ops[2], ops[1])]
    # The first joined write, then the plain one in its place, then the last joined.
    assert order == [ops[0].id, "plain", ops[1].id]
    assert db.write_transactions - before == 3


async def test_a_write_whose_caller_gave_up_is_not_run(db: Database) -> None:
    journal = Journal()
    op, kept = new_operation(NOW), new_operation(NOW)
    entered, go = threading.Event(), threading.Event()

    def hold() -> None:
        entered.set()
        assert go.wait(10)

    held = asyncio.ensure_future(db.run_write(hold))
    assert await asyncio.to_thread(entered.wait, 10)
    gone = asyncio.ensure_future(db.run_joined(_insert(journal, op)))
    waiting = asyncio.ensure_future(db.run_joined(_insert(journal, kept)))
    await asyncio.sleep(0)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    go.set()
    await held
    assert await waiting == kept.id
    assert _stored(db, [op.id, kept.id]) == {kept.id}


@pytest.mark.both_backends
def test_a_savepoint_undoes_only_what_failed_inside_it(db: Database) -> None:
    journal = Journal()
    outside, inside = new_operation(NOW), new_operation(NOW)
    with db.write() as conn:
        _insert(journal, outside)(conn)
        with pytest.raises(StaleWrite), savepoint(conn, "attempt"):
            _insert(journal, inside)(conn)
            raise StaleWrite("lost")
    assert _stored(db, [outside.id, inside.id]) == {outside.id}


@pytest.mark.both_backends
async def test_a_webhook_batch_with_a_bad_event_stores_the_others(db: Database) -> None:
    committer = GroupCommitter(db, Journal(), lambda: NOW, on_hint=lambda: None)

    def incoming(event_id: str, digest: str | None = "0" * 64) -> IncomingEvent:
        return IncomingEvent("sim", event_id, None, digest, "{}", NOW)  # type: ignore[arg-type]

    # No digest: the events table refuses the row, and with it the batch's transaction.
    events = [incoming("evt_a"), incoming("evt_bad", digest=None), incoming("evt_b")]
    outcomes = await asyncio.gather(*(committer.submit(e) for e in events), return_exceptions=True)
    assert outcomes[0] == Outcome.ORPHAN and outcomes[2] == Outcome.ORPHAN, outcomes
    assert isinstance(outcomes[1], Exception) and not isinstance(outcomes[1], Outcome)
    with db.read() as conn:
        stored = {row[0] for row in conn.execute(sa.select(EVENTS.c.event_id))}
    assert stored == {"evt_a", "evt_b"}


@pytest.mark.both_backends
async def test_a_webhook_batch_goes_ahead_of_the_queued_engine_writes(db: Database) -> None:
    """A delivery's bound is spent on one transaction, not on the engine's backlog: its
    batch is taken before writes queued earlier, with the head of the queue, however the
    writer threads are scheduled afterwards."""
    committer = GroupCommitter(db, Journal(), lambda: NOW, on_hint=lambda: None)
    first_round = db.writer.count * JOIN_LIMIT  # what every writer takes at once
    # Who ran in which transaction: each write keeps the connection it was handed (kept
    # alive here, so no two transactions' connections can be mistaken for one).
    ran: list[tuple[str, Connection]] = []
    write_batch = committer._write

    def batch(conn: Connection, pending: Any) -> Any:
        ran.append(("webhook", conn))
        return write_batch(conn, pending)

    committer._write = batch  # type: ignore[method-assign]

    def engine(n: int) -> Callable[[Connection], None]:
        def write(conn: Connection) -> None:
            ran.append((f"engine-{n}", conn))

        return write

    go = threading.Event()
    held = await _hold_writers(db, go)
    backlog = [
        asyncio.ensure_future(db.run_joined(engine(n), key=f"op_{n:04d}"))
        for n in range(2 * first_round)
    ]
    event = IncomingEvent("sim", "evt_first", None, "0" * 64, "{}", NOW)  # type: ignore[arg-type]
    delivery = asyncio.ensure_future(committer.submit(event))
    await wait_until_async(lambda: db.writer._queue.qsize() > len(backlog), 10, "the batch queued")
    go.set()
    await held
    assert await delivery == Outcome.ORPHAN
    await asyncio.gather(*backlog)
    assert len(ran) == len(backlog) + 1
    # Taken first, though queued behind two rounds of the engine's writes: its transaction
    # is the one that took the head of the queue with it.
    [shared] = [conn for name, conn in ran if name == "webhook"]
    mates = [name for name, conn in ran if conn is shared and name != "webhook"]
    assert mates == [f"engine-{n}" for n in range(JOIN_LIMIT - 1)], mates
