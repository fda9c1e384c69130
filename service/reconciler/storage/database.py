"""Engines, transactions and the one place storage errors become domain errors.

SQLite gets WAL, a busy timeout and foreign keys, and write transactions
start with ``BEGIN IMMEDIATE``: a deferred transaction that later upgrades
to a write lock fails with SQLITE_BUSY without waiting, which would turn
ordinary contention into errors. Reads use a separate engine with plain
deferred transactions so they never queue behind writers.

The WAL stays bounded: passive checkpoints run off the hot path every second,
and once the WAL file passes ``WAL_TRUNCATE_BYTES`` a truncating checkpoint
resets it (a passive checkpoint alone never shrinks the file, and readers that
are always active keep it from being reused from the start);
``journal_size_limit`` caps what SQLite keeps after any reset.

From the event loop, reads go through ``run`` (a thread pool of their own)
and writes through ``run_write`` (``storage.writer``: writers behind a bounded
queue, each write waiting at most ``write_wait_seconds``; on PostgreSQL greenlets on
the loop whose waits are the loop's, ``storage.on_loop``), so a lock held by another
process blocks only the writers, never a read or the loop.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any, TypeVar

import anyio.to_thread
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

from reconciler.core.errors import (
    Conflict,
    StaleWrite,
    StorageUnavailable,
    UnstorableContent,
    WriteCycle,
)
from reconciler.storage import after_commit as committed
from reconciler.storage import commit_tail, on_loop, pipelined
from reconciler.storage.availability import Availability, WriteFailure, classify
from reconciler.storage.fastsql import run, wait_sent
from reconciler.storage.writer import Joined, Writer

T = TypeVar("T")

# How long a write waits for the lock (the busy timeout, and the bound of ``run_write``).
DEFAULT_WRITE_WAIT_SECONDS = 5.0
CHECKPOINT_SECONDS = 1.0
# The WAL is reset (TRUNCATE checkpoint) once it grows past this; SQLite trims it to the
# size limit after any other reset.
WAL_TRUNCATE_BYTES = 16 * 1024 * 1024
JOURNAL_SIZE_LIMIT_BYTES = 64 * 1024 * 1024
CHECKPOINT_WAIT_MS = 50
WRITE_QUEUE_LIMIT = 10_000
# Write transactions in flight at once on PostgreSQL. Each carries what queued behind the
# one before it, so fewer threads mean fuller, fewer commits (bench/peer_dbos.py, 1,000
# operations, fsync on, medians of 2 rounds: 8 threads 58.6 ops/s, 4.4 commits and
# 20.8 ms of CPU an operation, service and server; 4: 60.0, 4.2, 20.5; 2: 61.3, 2.8,
# 18.8). Two still let one transaction run while another waits on a row lock or the disk.
# They run on the loop (``storage.on_loop``): threads handing the interpreter lock back and
# forth held the process at 0.80 of a core at its ceiling, 0.85 on the loop (peer_dbos.py).
POSTGRES_WRITERS = 2
# A PostgreSQL connection unused this long is pinged before use: a server restart or an
# idle timeout (the server's or a pooler's) closes connections nobody is using, and the
# first statement on one would fail. Pinging every checkout (pool_pre_ping) cost 2 to
# 3 ms of CPU per operation (bench/throughput.py --postgres); a connection that dies
# while in steady use fails its statement instead, which invalidates the pool and is
# retried as any storage outage is.
IDLE_PING_SECONDS = 5.0
# JSON columns (payloads, history details, errors) are written without the spaces
# json.dumps puts after every "," and ":": a result of many small rows is about a tenth
# smaller, and every reader parses the text (the history hash covers its own canonical
# text, not this one). ASCII-only as before, so any database encoding takes it.
_JSON_TEXT = json.JSONEncoder(separators=(",", ":"))
_RETURNED_AT = "reconciler_returned_at"
_BACKEND = "reconciler_backend_pid"
# A lost race is retried on fresh data this many times before StaleWrite reaches the caller.
STALE_ATTEMPTS = 5
# PostgreSQL's answers that a transaction was chosen to break a deadlock (40P01) or lost a
# serialization conflict (40001): nothing was written, and running it again is the cure.
_CYCLE_STATES = frozenset({"40P01", "40001"})
# Times a joined transaction that met one is run again before its callers are told to retry.
CYCLE_ATTEMPTS = 5
# The ``run_joined`` key of a write that makes a new operation: after every operation id,
# so it runs last in its transaction (its row is new; nobody waits on it before then).
NEW_OPERATION = "\U0010ffff"


def retry_stale(fn: Callable[[], T], attempts: int = STALE_ATTEMPTS) -> T:
    """Run ``fn`` (one whole write that reads what it writes) again after a lost race.

    Every write is conditional on the version it read (``StaleWrite`` when another
    writer was first); a retry reads again and decides again on the fresh row.
    """
    for attempt in range(attempts):
        try:
            return fn()
        except StaleWrite:
            if attempt == attempts - 1:
                raise
            on_loop.sleep(0.002 * (attempt + 1))  # let the winner's commit land first
    raise AssertionError("unreachable")


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


def _sqlite_engine(
    url: str,
    *,
    immediate: bool,
    busy_ms: Callable[[], int],
    background_checkpoint: bool = False,
) -> Engine:
    engine = sa.create_engine(
        url,
        connect_args={"check_same_thread": False, "timeout": busy_ms() / 1000},
        json_serializer=_JSON_TEXT.encode,
        pool_size=8,
        max_overflow=8,
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: sqlite3.Connection, _record: Any) -> None:
        # Take transaction control away from the driver so BEGIN is ours.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA busy_timeout={busy_ms()}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute(f"PRAGMA journal_size_limit={JOURNAL_SIZE_LIMIT_BYTES}")
        # Checkpoints run on a background thread (Database.checkpointer), not inside
        # whichever commit happens to cross the threshold, which may be on the event loop.
        cur.execute(f"PRAGMA wal_autocheckpoint={0 if background_checkpoint else 1000}")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        if immediate:
            # A write waits for the lock no longer than its caller waits for it.
            run(conn, f"PRAGMA busy_timeout={busy_ms()}")
        run(conn, "BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


def _postgres_engine(
    url: str, own: set[int], idle_ping_seconds: float = IDLE_PING_SECONDS
) -> Engine:
    """``own`` gets the server process of each connection while it is open (the listener
    tells this process's own notifications by it: ``engine.wakeups``)."""
    engine = sa.create_engine(url, json_serializer=_JSON_TEXT.encode, pool_size=10, max_overflow=20)
    connection_class = on_loop.loop_connection_class()

    @event.listens_for(engine, "do_connect")
    def _do_connect(_dialect: Any, _record: Any, cargs: Any, cparams: Any) -> Any:
        # A writer on the loop connects on a thread: a connect that waits for an
        # unreachable server must not hold the loop.
        return on_loop.off_loop(lambda: connection_class.connect(*cargs, **cparams))

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, record: Any) -> None:
        pid = getattr(getattr(dbapi_conn, "info", None), "backend_pid", None)
        if isinstance(pid, int):
            record.info[_BACKEND] = pid
            own.add(pid)

    @event.listens_for(engine, "close")
    def _on_close(_dbapi_conn: Any, record: Any) -> None:
        own.discard(record.info.pop(_BACKEND, -1))

    # A statement run through SQLAlchemy inside joined writes (a transactional hook's)
    # waits for its result before SQLAlchemy reads it, as ``fastsql.run``'s statements do
    # (``storage.pipelined`` queues them).
    @event.listens_for(engine, "after_cursor_execute")
    def _after_execute(*_args: Any) -> None:
        wait_sent()

    # A connection that sat in the pool is pinged before use; one in steady use is not
    # (see IDLE_PING_SECONDS). The ping is the dialect's own (pool_pre_ping's, which would
    # ping every checkout); a failed one makes the pool discard it and connect again.
    @event.listens_for(engine, "checkin")
    def _on_checkin(_dbapi_conn: Any, record: Any) -> None:
        record.info[_RETURNED_AT] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        returned = record.info.get(_RETURNED_AT)
        if returned is None or time.monotonic() - returned < idle_ping_seconds:
            return
        try:
            engine.dialect.do_ping(dbapi_conn)
        except Exception as exc:
            raise sa.exc.DisconnectionError("an idle pooled connection is gone") from exc

    return engine


@contextmanager
def _begin(connection: Connection) -> Iterator[Connection]:
    with connection as conn, conn.begin():
        yield conn


@contextmanager
def translate_errors() -> Iterator[None]:
    """Map driver errors to the package's errors; constraint names decide the family.

    A value the database refuses by its content (``DataError``: a NUL in PostgreSQL text,
    a number out of range, a string past SQLite's length limit) is ``UnstorableContent``:
    the same value will always be refused, so a caller that retries gains nothing.
    """
    try:
        yield
    except sa.exc.IntegrityError as exc:
        raise Conflict(f"the write conflicts with a stored record ({_constraint(exc)})") from exc
    except sa.exc.DataError as exc:
        raise UnstorableContent(
            "the content cannot be stored; retrying the same content will not help"
        ) from exc
    except (sa.exc.OperationalError, sa.exc.InterfaceError) as exc:
        if getattr(exc.orig, "sqlstate", None) in _CYCLE_STATES:
            raise WriteCycle("the write met a lock cycle and was undone; retry") from exc
        raise StorageUnavailable("the database is unavailable; retry later") from exc
    except sa.exc.DBAPIError as exc:
        if exc.connection_invalidated:
            raise StorageUnavailable("the database connection was lost; retry later") from exc
        raise


@contextmanager
def savepoint(conn: Connection, name: str) -> Iterator[None]:
    """A savepoint inside the connection's write transaction: what fails inside it is
    undone and raised, and the transaction goes on. A savepoint that cannot be rolled
    back to raises ``StorageUnavailable``: the transaction is then lost as a whole."""
    with translate_errors():
        run(conn, f"SAVEPOINT {name}")
    queued, gathered = committed.mark(conn), commit_tail.mark(conn)
    try:
        yield
    except BaseException:
        committed.undo(conn, queued)
        commit_tail.undo(conn, gathered)
        with translate_errors():
            run(conn, f"ROLLBACK TO {name}")
            run(conn, f"RELEASE {name}")
        raise
    with translate_errors():
        run(conn, f"RELEASE {name}")


def _changes(conn: Connection) -> int | None:
    """SQLite's count of rows changed on this connection (None elsewhere: always "changed")."""
    raw = conn.connection.dbapi_connection
    if isinstance(raw, sqlite3.Connection):
        return raw.total_changes
    return None


def _constraint(exc: sa.exc.IntegrityError) -> str:
    diag = getattr(exc.orig, "diag", None)
    name = getattr(diag, "constraint_name", None)
    return str(name) if name else str(exc.orig).splitlines()[0]


def constraint_name(exc: BaseException) -> str | None:
    """The violated constraint's name, on PostgreSQL directly and on SQLite from the columns."""
    cause = exc.__cause__ if not isinstance(exc, sa.exc.IntegrityError) else exc
    if not isinstance(cause, sa.exc.IntegrityError):
        return None
    return _constraint(cause)


class _OneFailed(Exception):
    """One of the writes sharing a transaction failed on its own; the transaction is gone."""


class Database:
    """The engines and the transaction helpers. Thread-safe; one per process."""

    def __init__(
        self,
        url: str,
        *,
        background_checkpoint: bool = False,
        write_wait_seconds: float = DEFAULT_WRITE_WAIT_SECONDS,
        now: Callable[[], datetime] | None = None,
    ) -> None:
        self.url = url
        self.sqlite = is_sqlite(url)
        self.write_wait_seconds = write_wait_seconds
        self.availability = Availability(now)
        self._writer: Writer | None = None
        self._writer_guard = threading.Lock()
        # The PostgreSQL server processes of this process's open connections.
        self._own_backends: set[int] = set()
        self._checkpointer: threading.Thread | None = None
        self._stop = threading.Event()
        if self.sqlite:
            bg = background_checkpoint
            self.engine = _sqlite_engine(
                url, immediate=True, busy_ms=self._busy_ms, background_checkpoint=bg
            )
            self.read_engine = _sqlite_engine(
                url, immediate=False, busy_ms=self._busy_ms, background_checkpoint=bg
            )
            if bg:
                self._checkpointer = threading.Thread(
                    target=self._checkpoint_loop, name="sqlite-checkpoint", daemon=True
                )
                self._checkpointer.start()
        else:
            self.engine = _postgres_engine(url, self._own_backends)
            self.read_engine = self.engine
        self._limiter = anyio.CapacityLimiter(16)
        # SQLite has one writer at a time. This process's writers queue on a lock, woken
        # as soon as it is free, instead of polling SQLite's busy handler: its sleeps (up
        # to 100 ms) and lack of order let some writers starve for seconds under load.
        # Other processes (the CLI, a second service) still meet the busy timeout.
        self._write_lock = threading.Lock() if self.sqlite else None
        # Write transactions begun by this process (``reconciler_write_transactions_total``),
        # and those PostgreSQL undid to break a lock cycle (``WriteCycle``).
        self.write_transactions = 0
        self.write_cycles = 0
        self._count_guard = threading.Lock()

    def is_own_backend(self, pid: int) -> bool:
        """Whether PostgreSQL's process ``pid`` serves one of this process's connections."""
        return pid in self._own_backends

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def _remaining(self) -> float:
        """Seconds the current write may still wait: its job's deadline, else the bound."""
        deadline = self._writer.deadline() if self._writer is not None else None
        if deadline is None:
            return self.write_wait_seconds
        return max(0.0, deadline - time.monotonic())

    def _connect(self) -> Connection:
        """A pooled connection for a write. A writer on the loop makes the pool's first
        connection on a thread: SQLAlchemy holds a thread lock while it sets up the first
        one, and a second writer meeting that lock on the loop's thread would stop it."""
        if on_loop.driven() is not None and not self.engine.pool.checkedin():  # type: ignore[attr-defined]
            return on_loop.off_loop(self.engine.connect)
        return self.engine.connect()

    def _busy_ms(self) -> int:
        return max(1, int(self._remaining() * 1000))

    @contextmanager
    def write(self, *, lanes: bool = False) -> Iterator[Connection]:
        """A write transaction; ``lanes`` (PostgreSQL): one for ``pipelined.run_lanes``."""
        with self._count_guard:
            self.write_transactions += 1
        lock = self._write_lock
        if lock is not None and not lock.acquire(timeout=self._remaining()):
            self.availability.failed(WriteFailure.LOCKED)
            raise StorageUnavailable("the database is busy; retry later")
        try:
            begin = pipelined.transaction if lanes else _begin
            with translate_errors(), begin(self._connect()) as conn:
                committed.begin(conn)
                commit_tail.begin(conn)
                before = _changes(conn)
                yield conn
                commit_tail.send(conn)
                changed = before is None or _changes(conn) != before
                pending = committed.take(conn)
        except WriteCycle:
            with self._count_guard:
                self.write_cycles += 1
            raise  # the database works: two transactions met, and this one gives way
        except StorageUnavailable as exc:
            self.availability.failed(classify(exc))
            raise
        finally:
            if lock is not None:
                lock.release()
        self.availability.succeeded(changed=changed)
        committed.run(pending)

    def write_together(self, writes: Sequence[Joined]) -> list[tuple[Any, BaseException | None]]:
        """Several writes in one transaction, answered (result, error) each in order; each
        comes with the attempts it may make after a lost race (``retry_stale``).

        Alone, a write is exactly ``retry_stale`` of ``write``: an attempt that loses its
        race costs the whole transaction. Together, one that fails (a lost race, a
        conflict, a bug) leaves nothing behind and the others still commit. A storage
        failure in any of them fails the transaction for all: the database, not that
        write, is what broke. A transaction PostgreSQL undid to break a lock cycle
        (``WriteCycle``) is run again whole, up to ``CYCLE_ATTEMPTS`` times: nothing of it
        was written, and its writes are functions of the connection that decide again.
        """
        for attempt in range(CYCLE_ATTEMPTS):
            try:
                return self._together(writes)
            except WriteCycle:
                if attempt == CYCLE_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

    def _together(self, writes: Sequence[Joined]) -> list[tuple[Any, BaseException | None]]:
        if len(writes) == 1:
            write, attempts, key = writes[0]

            def alone() -> Any:
                if self.sqlite:
                    with self.write() as conn:
                        return write(conn)
                # Pipelined too, for its BEGIN and COMMIT: two round trips fewer. A
                # statement's error is its own, reported as the write would have met it.
                with self.write(lanes=True) as conn:
                    return pipelined.run_lanes(conn, [write], [key])[0]

            return [(retry_stale(alone, attempts), None)]
        if not self.sqlite:
            # A savepoint is two round trips more per write on PostgreSQL (SQLite's cost
            # nothing): first all of them plainly, and only if one fails, each in its own.
            try:
                return self._all_or_none(writes)
            except _OneFailed:
                pass
        outcomes: list[tuple[Any, BaseException | None]] = []
        with self.write() as conn:
            for write, attempts, _key in writes:

                def attempt(write: Callable[[Connection], Any] = write) -> Any:
                    with translate_errors(), savepoint(conn, "joined"):
                        return write(conn)

                try:
                    outcomes.append((retry_stale(attempt, attempts), None))
                except StorageUnavailable:
                    raise
                except Exception as exc:
                    outcomes.append((None, exc))
        return outcomes

    def _all_or_none(self, writes: Sequence[Joined]) -> list[tuple[Any, BaseException | None]]:
        """``writes`` in one transaction with no savepoints; ``_OneFailed`` (the whole
        transaction rolled back) as soon as one of them fails for a reason of its own.

        Their statements go to the server together, a turn at a time (``pipelined``)."""
        with self.write(lanes=True) as conn:
            try:
                results = pipelined.run_lanes(
                    conn, [write for write, _, _ in writes], [key for _, _, key in writes]
                )
            except (StorageUnavailable, sa.exc.OperationalError, sa.exc.InterfaceError):
                raise
            except Exception as exc:
                raise _OneFailed() from exc
        return [(result, None) for result in results]

    @contextmanager
    def read(self) -> Iterator[Connection]:
        with translate_errors(), self.read_engine.connect() as conn, conn.begin():
            yield conn

    def ping(self) -> None:
        """One ``SELECT 1`` on a read connection (the readiness probe's whole cost once the
        schema is known); ``StorageUnavailable`` when the database cannot answer it."""
        with self.read() as conn:
            conn.execute(sa.text("SELECT 1"))

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a blocking read off the event loop (reads never wait for the write lock)."""
        return await anyio.to_thread.run_sync(fn, *args, limiter=self._limiter)

    def size_bytes(self) -> int:
        """The database's size on disk: PostgreSQL's for this database, SQLite's pages and WAL."""
        with self.read() as conn:
            if self.sqlite:
                pages = run(conn, "PRAGMA page_count").fetchone()[0]
                page = run(conn, "PRAGMA page_size").fetchone()[0]
                return int(pages) * int(page) + self.wal_bytes()
            return int(run(conn, "SELECT pg_database_size(current_database())").fetchone()[0])

    def wal_bytes(self) -> int:
        """The size of the SQLite WAL file now (0 without one)."""
        path = sa.make_url(self.url).database
        try:
            return os.path.getsize(f"{path}-wal") if path else 0
        except OSError:
            return 0

    async def run_write(self, fn: Callable[..., T], *args: Any, wait: float | None = None) -> T:
        """Run a blocking function that writes in a writer, waiting at most the bound.

        Past ``wait`` (default ``write_wait_seconds``) it raises ``StorageUnavailable``;
        a write that had not started by then is never run.
        """
        return await self.writer.run(fn, *args, wait=wait)

    async def run_joined(
        self,
        fn: Callable[..., T],
        *args: Any,
        attempts: int = 1,
        key: str = "",
        first: bool = False,
    ) -> T:
        """Run ``fn(conn, *args)`` in a write transaction shared with the other such writes
        queued with it (``write_together``): fewer commits under load. A lost race
        (``StaleWrite``) is run again ``attempts - 1`` times on fresh data.

        ``key`` is the operation id whose row the write locks ("" for a write over many
        rows, which goes first): a shared transaction runs its writes in key order, so
        two of them, on this replica or another, take the rows they share in the same
        order and do not wait on each other in a cycle. A cycle met anyway (rows locked
        in another order inside one write) undoes that one transaction, which runs again.
        ``first``: a request on the wire waits for it; it goes ahead of the queued writes.
        """
        return await self.writer.run_joined(fn, *args, attempts=attempts, key=key, first=first)

    @property
    def writer(self) -> Writer:
        if self._writer is None:
            with self._writer_guard:
                if self._writer is None:
                    # SQLite takes one writer at a time: more threads would only queue on
                    # its lock. PostgreSQL writes to different rows in parallel.
                    self._writer = Writer(
                        threads=1 if self.sqlite else POSTGRES_WRITERS,
                        queue_limit=WRITE_QUEUE_LIMIT,
                        wait_seconds=self.write_wait_seconds,
                        join=self.write_together,
                        on_timeout=lambda _: self.availability.failed(WriteFailure.LOCKED),
                        loop_writers=not self.sqlite,
                    )
        return self._writer

    def _checkpoint_loop(self) -> None:
        """Copy the WAL back into the database once a second, and reset it when it grows.

        A passive checkpoint never blocks writers. A truncating one waits for them (and for
        readers of older snapshots) through the busy timeout, so it runs only when the WAL
        is past its bound, here on this thread and never inside a commit.
        """
        while not self._stop.wait(CHECKPOINT_SECONDS):
            mode = "TRUNCATE" if self.wal_bytes() > WAL_TRUNCATE_BYTES else "PASSIVE"
            try:
                self.checkpoint(mode)
            except (sa.exc.SQLAlchemyError, sqlite3.Error):
                continue  # busy or closing: the next round will do it

    def checkpoint(self, mode: str = "PASSIVE") -> None:
        """One SQLite checkpoint, outside any transaction (inside one it could not complete)."""
        if mode not in ("PASSIVE", "FULL", "RESTART", "TRUNCATE"):
            raise ValueError(f"unknown checkpoint mode {mode!r}")
        with self.read_engine.connect() as conn:
            # The driver connection is in autocommit (see _on_connect): no BEGIN precedes it.
            raw = conn.connection.driver_connection
            assert raw is not None
            if mode == "PASSIVE":
                raw.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                return
            # A resetting checkpoint holds the write lock while it waits for older readers:
            # it may wait only briefly, so writers are never held up for long; a busy
            # answer just means the next round tries again.
            raw.execute(f"PRAGMA busy_timeout={CHECKPOINT_WAIT_MS}")
            try:
                raw.execute(f"PRAGMA wal_checkpoint({mode})").fetchall()
            finally:
                raw.execute(f"PRAGMA busy_timeout={self._busy_ms()}")

    async def aclose(self) -> None:
        """``dispose``, once writers on this loop have finished what is queued."""
        if self._writer is not None:
            await self._writer.aclose()
        self.dispose()

    def dispose(self) -> None:
        self._stop.set()
        if self._writer is not None:
            self._writer.close()
        if self._checkpointer is not None:
            self._checkpointer.join(timeout=5)
        self.engine.dispose()
        if self.read_engine is not self.engine:
            self.read_engine.dispose()
