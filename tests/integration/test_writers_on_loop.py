"""PostgreSQL's writers run on the event loop (``storage.on_loop``): a write that waits for
the server, for a row lock or for a connection, holds neither the loop nor the other
writer, and the writers follow the loop that uses them."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from reconciler.core.errors import StorageUnavailable
from reconciler.core.records import OperationRecord
from reconciler.storage import on_loop
from reconciler.storage.database import Database
from reconciler.storage.fastsql import run
from reconciler.storage.journal import Journal
from tests.support.factories import new_operation
from tests.support.waiting import wait_until_async

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]

NOW = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def db(pg_url: str) -> Iterator[Database]:
    database = Database(pg_url)
    try:
        yield database
    finally:
        database.dispose()


def _plain(url: str) -> str:
    return sa.make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _seed(db: Database, n: int) -> list[OperationRecord]:
    ops = [new_operation(NOW) for _ in range(n)]
    with db.write() as conn:
        for op in ops:
            Journal().insert(conn, op, actor="test", cause="test:create", now=NOW)
    return ops


def _touch(op_id: str) -> Any:
    def write(conn: Connection) -> str:
        run(conn, "UPDATE operations SET next_poll_at = next_poll_at WHERE id = $1", [op_id])
        return op_id

    return write


async def test_a_write_waiting_for_a_row_lock_holds_neither_the_loop_nor_the_other_writer(
    db: Database, pg_url: str
) -> None:
    locked, free = _seed(db, 2)
    with (
        psycopg.connect(_plain(pg_url)) as holder,
        psycopg.connect(_plain(pg_url), autocommit=True) as watcher,
    ):
        holder.execute("SELECT 1 FROM operations WHERE id = %s FOR UPDATE", [locked.id])
        waiting = asyncio.ensure_future(db.run_joined(_touch(locked.id), key=locked.id))

        def lock_waits() -> bool:
            row = watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database()"
            ).fetchone()
            return bool(row and row[0])

        await wait_until_async(lock_waits, 10, "the write waiting for the row lock")
        # Meanwhile the loop answers, and the other writer commits a write of its own.
        assert await db.run_joined(_touch(free.id), key=free.id) == free.id
        assert await db.run(lambda: "a read") == "a read"
        assert not waiting.done()
        holder.rollback()
    assert await waiting == locked.id


@pytest.fixture
def silent_server() -> Iterator[tuple[int, threading.Event]]:
    """A TCP port that takes connections and never answers (a server that hangs)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    accepted = threading.Event()
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            held.append(conn)
            accepted.set()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1], accepted
    finally:
        listener.close()
        for conn in held:
            conn.close()
        thread.join(timeout=5)


async def test_a_connection_that_never_answers_holds_neither_the_loop_nor_its_bound(
    silent_server: tuple[int, threading.Event],
) -> None:
    port, accepted = silent_server
    url = f"postgresql+psycopg://nobody@127.0.0.1:{port}/nothing?connect_timeout=3"
    db = Database(url, write_wait_seconds=0.5)
    try:
        write = asyncio.ensure_future(db.run_joined(lambda conn: None, key="op"))
        assert await asyncio.to_thread(accepted.wait, 10), "the writer never connected"
        # The writer is connecting, and this coroutine runs: the loop is not held.
        assert not write.done()
        with pytest.raises(StorageUnavailable, match="within 0.5 s"):
            await write
    finally:
        await db.aclose()


async def test_two_writers_making_their_first_connections_at_once_both_commit(
    db: Database,
) -> None:
    """SQLAlchemy sets the first connection up under a thread lock; on the loop's thread,
    a second writer meeting it there would stop the loop (the pool's first connections
    are made on threads)."""
    ops = _seed(db, 2)
    fresh = Database(db.url)
    try:
        assert fresh.writer.count == 2
        written = await asyncio.gather(
            fresh.run_write(lambda: _in_a_write(fresh, ops[0].id)),
            fresh.run_write(lambda: _in_a_write(fresh, ops[1].id)),
        )
        assert written == [ops[0].id, ops[1].id]
    finally:
        await fresh.aclose()


def _in_a_write(db: Database, op_id: str) -> str:
    assert on_loop.driven() is not None  # the writers are on the loop
    with db.write() as conn:
        result: str = _touch(op_id)(conn)
        return result


def test_the_writers_follow_each_loop_that_uses_them(db: Database) -> None:
    """A database outlives an event loop (a CLI command's, a test's): the next loop's
    writes get writers of their own."""
    first, second = _seed(db, 2)
    assert asyncio.run(db.run_joined(_touch(first.id), key=first.id)) == first.id
    assert asyncio.run(db.run_joined(_touch(second.id), key=second.id)) == second.id


async def test_closing_lets_the_queued_writes_finish_first(db: Database) -> None:
    ops = _seed(db, 5)
    writes = [asyncio.ensure_future(db.run_joined(_touch(op.id), key=op.id)) for op in ops]
    await asyncio.sleep(0)  # every write is queued
    await db.aclose()
    assert await asyncio.gather(*writes) == [op.id for op in ops]
