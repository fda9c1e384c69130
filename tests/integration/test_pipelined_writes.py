"""A joined PostgreSQL transaction sends its writes' statements together
(``storage.pipelined``): each turn is one round trip for every write waiting on one, and
what each write sees, and how a failure ends, stay what they are one write at a time.

The writes log when they send a statement and when they have its answer; the order of
those lines is what the tests assert, so nothing here depends on timing.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa
from greenlet import GreenletExit
from sqlalchemy.engine import Connection

from reconciler.core.errors import Conflict, StaleWrite, StorageUnavailable
from reconciler.logs import trace_id_var
from reconciler.storage import operations as store
from reconciler.storage import pipelined
from reconciler.storage.database import Database
from reconciler.storage.fastsql import run
from reconciler.storage.journal import Journal
from tests.support.factories import new_operation

pytestmark = pytest.mark.postgres

NOW = datetime(2026, 1, 1, tzinfo=UTC)
Write = Callable[[Connection], Any]


@pytest.fixture
def db(pg_url: str) -> Any:
    database = Database(pg_url)
    try:
        yield database
    finally:
        database.dispose()


def _together(db: Database, writes: list[tuple[str, Write]]) -> list[Any]:
    """``writes`` (key, write) in one transaction: each one's result or its error."""
    outcomes = db.write_together([(write, 1, key) for key, write in writes])
    return [result if error is None else error for result, error in outcomes]


def _echo(log: list[str], name: str) -> Write:
    def write(conn: Connection) -> str:
        log.append(f"{name} sends")
        (value,) = run(conn, "SELECT $1::text", [name]).fetchone()
        log.append(f"{name} has {value}")
        return str(value)

    return write


def _stored(db: Database, ids: list[str]) -> set[str]:
    with db.read() as conn:
        return {op.id for op in store.load_records(conn, ids)}


def test_writes_on_different_operations_share_each_round_trip(db: Database) -> None:
    log: list[str] = []
    names = ["a", "b", "c"]
    assert _together(db, [(name, _echo(log, name)) for name in names]) == names
    # Every statement went out before any answer came back, and each answer is its own.
    assert log == ["a sends", "b sends", "c sends", "a has a", "b has b", "c has c"]


def test_writes_on_one_operation_run_one_after_another_and_see_each_other(
    db: Database,
) -> None:
    journal = Journal()
    op = new_operation(NOW)
    log: list[str] = []

    def insert(conn: Connection) -> str:
        log.append("insert sends")
        journal.insert(conn, op, actor="test", cause="test:create", now=NOW)
        log.append("insert done")
        return op.id

    def read_back(conn: Connection) -> list[str]:
        log.append("read sends")
        found = [record.id for record in store.load_records(conn, [op.id])]
        log.append("read done")
        return found

    outcomes = _together(
        db,
        [("", _echo(log, "many")), (op.id, insert), (op.id, read_back), ("z", _echo(log, "z"))],
    )
    assert outcomes == ["many", op.id, [op.id], "z"]
    # The second write on the operation starts only once the first is done, and reads
    # what it wrote; the other lanes go on beside them.
    assert log.index("insert done") < log.index("read sends")
    assert log.index("z sends") < log.index("insert done")
    assert log[:3] == ["many sends", "insert sends", "z sends"]


def test_a_statement_refused_in_a_turn_undoes_only_its_own_write(db: Database) -> None:
    journal = Journal()
    existing, first, last = new_operation(NOW), new_operation(NOW), new_operation(NOW)

    def insert(op: Any) -> Write:
        return lambda conn: journal.insert(conn, op, actor="test", cause="c", now=NOW).id

    assert _together(db, [(existing.id, insert(existing))]) == [existing.id]
    outcomes = _together(
        db, [(first.id, insert(first)), (existing.id, insert(existing)), (last.id, insert(last))]
    )
    # The refusal came back with the turn's answers, for no write in particular: each
    # ran again in a savepoint of its own, which found the one it belonged to.
    assert outcomes[0] == first.id and outcomes[2] == last.id
    assert isinstance(outcomes[1], Conflict)
    assert _stored(db, [existing.id, first.id, last.id]) == {existing.id, first.id, last.id}


def test_a_write_alone_keeps_the_others_out_of_its_savepoint(db: Database) -> None:
    log: list[str] = []

    def twice(name: str) -> Write:
        def write(conn: Connection) -> str:
            for n in (1, 2):
                log.append(f"{name} sends {n}")
                run(conn, "SELECT 1")
            return name

        return write

    def hooked(conn: Connection) -> int:
        run(conn, "SELECT 1")
        # As a transactional hook runs: in a savepoint, its statements through SQLAlchemy.
        with pipelined.alone(), conn.begin_nested():
            log.append("alone")
            value = int(conn.execute(sa.text("SELECT 7")).scalar_one())
            conn.execute(sa.text("SELECT 1/0"))
        log.append("after")
        return value

    def guarded(conn: Connection) -> int:
        try:
            return hooked(conn)
        except sa.exc.DataError:
            log.append("undone")
            return -1  # the savepoint undid the failure; the transaction goes on

    assert _together(db, [("a", twice("a")), ("b", guarded), ("c", twice("c"))]) == ["a", -1, "c"]
    # From "alone" until its savepoint was undone, no other write sent a statement.
    assert log == ["a sends 1", "c sends 1", "a sends 2", "alone", "undone", "c sends 2"]


def test_a_write_that_fails_ends_the_writes_still_waiting_for_an_answer(
    db: Database,
) -> None:
    ended: list[type[BaseException]] = []
    tries: list[str] = []

    def loses(conn: Connection) -> None:
        run(conn, "SELECT 1")
        raise StaleWrite("another writer was first")

    def waits(conn: Connection) -> str:
        tries.append("waits")
        try:
            run(conn, "SELECT 1")
            run(conn, "SELECT 2")
        except BaseException as exc:
            ended.append(type(exc))
            raise
        return "done"

    outcomes = _together(db, [("a", loses), ("b", waits)])
    assert isinstance(outcomes[0], StaleWrite)
    assert outcomes[1] == "done"
    # Its first run was ended where it waited; it then ran whole, on its own savepoint.
    assert ended == [GreenletExit]
    assert tries == ["waits", "waits"]


def test_each_write_runs_in_the_callers_context(db: Database) -> None:
    def trace(conn: Connection) -> str | None:
        run(conn, "SELECT 1")
        return trace_id_var.get()

    token = trace_id_var.set("trace-1")
    try:
        assert _together(db, [("a", trace), ("b", trace)]) == ["trace-1", "trace-1"]
    finally:
        trace_id_var.reset(token)


def test_a_connection_lost_in_a_turn_is_an_outage_and_the_next_write_works(
    db: Database,
) -> None:
    def end_own_connection(conn: Connection) -> None:
        run(conn, "SELECT pg_terminate_backend(pg_backend_pid())").fetchone()

    log: list[str] = []
    with pytest.raises(StorageUnavailable):
        _together(db, [("a", end_own_connection), ("b", _echo(log, "b"))])
    assert _together(db, [("a", _echo(log, "a")), ("b", _echo(log, "b"))]) == ["a", "b"]


@pytest.mark.parametrize("fails", [False, True], ids=["committed", "failed"])
def test_the_connection_goes_back_to_the_pool_as_it_came(db: Database, fails: bool) -> None:
    """The pipelined transaction runs its connection in autocommit (its BEGIN and COMMIT
    are its own statements); after it, committed or not, the next plain transaction on
    that connection is a transaction again: what it wrote goes with its failure."""
    journal = Journal()
    op = new_operation(NOW)

    def loses(conn: Connection) -> None:
        run(conn, "SELECT 1")
        if fails:
            raise StaleWrite("another writer was first")

    def backend(conn: Connection) -> int:
        return int(run(conn, "SELECT pg_backend_pid()").fetchone()[0])

    outcomes = _together(db, [("a", loses), ("b", backend)])
    assert isinstance(outcomes[0], StaleWrite) if fails else outcomes[0] is None
    with pytest.raises(RuntimeError), db.write() as conn:
        assert backend(conn) == outcomes[1]  # the same connection, from the pool
        journal.insert(conn, op, actor="test", cause="test:create", now=NOW)
        raise RuntimeError("the caller gave up")
    assert _stored(db, [op.id]) == set()


def test_a_write_alone_meets_its_own_refusal_as_one_at_a_time_would(db: Database) -> None:
    journal = Journal()
    op = new_operation(NOW)

    def insert(conn: Connection) -> str:
        return journal.insert(conn, op, actor="test", cause="test:create", now=NOW).id

    assert _together(db, [(op.id, insert)]) == [op.id]
    # Sent in a pipelined transaction of its own, its refusal is still a conflict that
    # names the constraint, and the connection is fine for the next write.
    with pytest.raises(Conflict, match="operations_pkey"):
        _together(db, [(op.id, insert)])
    assert _together(db, [("a", _echo([], "a"))]) == ["a"]
