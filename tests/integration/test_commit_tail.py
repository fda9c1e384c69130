"""A transaction's tail (PostgreSQL): notifications and leases given back are gathered
and written as its last statement, every kind in it.

A listener on a connection of its own hears a transaction's notifications once it
commits, each once, in the order first gathered; a rolled-back transaction sends none,
and a savepoint rolled back takes back only what was gathered inside it. Leases given
back in one transaction are all free once it commits, and one given back inside a
savepoint rolled back stays held.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from reconciler.core.errors import StaleWrite
from reconciler.core.states import State
from reconciler.storage import leases
from reconciler.storage import operations as store
from reconciler.storage.database import Database, savepoint
from reconciler.storage.journal import Journal
from reconciler.storage.notify import CHANGE_CHANNEL, WAKE_CHANNEL, notify_in_transaction
from reconciler.storage.tables import HISTORY, OPS, TOMBSTONES
from tests.support.factories import insert_operation, new_operation
from tests.support.statements import recording

pytestmark = pytest.mark.postgres


@pytest.fixture
def pg(pg_url: str) -> Iterator[tuple[Database, psycopg.Connection]]:
    db = Database(pg_url)
    dsn = sa.make_url(pg_url).set(drivername="postgresql").render_as_string(hide_password=False)
    listener = psycopg.connect(dsn, autocommit=True)
    listener.execute(f"LISTEN {WAKE_CHANNEL}")
    listener.execute(f"LISTEN {CHANGE_CHANNEL}")
    try:
        yield db, listener
    finally:
        listener.close()
        db.dispose()


def _heard(listener: psycopg.Connection) -> list[tuple[str, str]]:
    # The notifications of a committed transaction are delivered together; a short wait
    # for more only bounds the test when none came.
    return [(n.channel, n.payload) for n in listener.notifies(timeout=0.3)]


def test_a_transactions_notifications_arrive_once_each_after_its_commit(
    pg: tuple[Database, psycopg.Connection],
) -> None:
    db, listener = pg
    with db.write() as conn:
        notify_in_transaction(conn, CHANGE_CHANNEL, "op_1")
        notify_in_transaction(conn, WAKE_CHANNEL)
        notify_in_transaction(conn, CHANGE_CHANNEL, "op_1")
        notify_in_transaction(conn, CHANGE_CHANNEL, "op_2")
        assert _heard(listener) == []  # nothing before the commit
    assert _heard(listener) == [
        (CHANGE_CHANNEL, "op_1"),
        (WAKE_CHANNEL, ""),
        (CHANGE_CHANNEL, "op_2"),
    ]


def test_a_rollback_sends_nothing_and_a_savepoint_takes_back_only_its_own(
    pg: tuple[Database, psycopg.Connection],
) -> None:
    db, listener = pg
    with pytest.raises(StaleWrite), db.write() as conn:
        notify_in_transaction(conn, CHANGE_CHANNEL, "lost")
        raise StaleWrite("lost")
    with db.write() as conn:
        notify_in_transaction(conn, CHANGE_CHANNEL, "kept")
        with pytest.raises(StaleWrite), savepoint(conn, "attempt"):
            notify_in_transaction(conn, CHANGE_CHANNEL, "undone")
            notify_in_transaction(conn, CHANGE_CHANNEL, "kept")
            raise StaleWrite("lost")
        notify_in_transaction(conn, WAKE_CHANNEL)
    assert _heard(listener) == [(CHANGE_CHANNEL, "kept"), (WAKE_CHANNEL, "")]


def test_leases_given_back_in_a_transaction_are_free_after_its_commit(
    pg: tuple[Database, psycopg.Connection],
) -> None:
    db, _ = pg
    journal = Journal()
    now = datetime.now(UTC)
    ops = []
    for _ in range(3):
        op = insert_operation(db, journal, now)
        with db.write() as conn:
            ops.append(
                journal.write(
                    conn,
                    op,
                    now=now,
                    changes={"lease_owner": "w1", "lease_expires_at": now + timedelta(minutes=5)},
                )
            )
    with db.write() as conn:
        leases.release_at_commit(conn, ops[0].id, "w1")
        with pytest.raises(StaleWrite), savepoint(conn, "attempt"):
            leases.release_at_commit(conn, ops[1].id, "w1")
            raise StaleWrite("lost")
        leases.release_at_commit(conn, ops[2].id, "w1")
        leases.release_at_commit(conn, ops[2].id, "w1")  # twice: one statement all the same
        assert [_owner(conn, op.id) for op in ops] == ["w1", "w1", "w1"]  # not yet
    with db.read() as conn:
        assert [_owner(conn, op.id) for op in ops] == [None, "w1", None]


def _owner(conn: Connection, op_id: str) -> str | None:
    return store.load_records(conn, [op_id])[0].lease_owner


def test_leases_and_notifications_go_as_one_statement_and_both_take_effect(
    pg: tuple[Database, psycopg.Connection], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both kinds in one transaction: one round trip (each a CTE of one statement), and
    each takes effect as if sent alone, two owners' leases included."""
    db, listener = pg
    journal = Journal()
    now = datetime.now(UTC)
    held = []
    for owner in ("w1", "w2"):
        op = insert_operation(db, journal, now)
        lease = {"lease_owner": owner, "lease_expires_at": now + timedelta(minutes=5)}
        with db.write() as conn:
            held.append(journal.write(conn, op, now=now, changes=lease))
    with recording(monkeypatch) as ran, db.write() as conn:
        leases.release_at_commit(conn, held[0].id, "w1")
        leases.release_at_commit(conn, held[1].id, "w2")
        notify_in_transaction(conn, CHANGE_CHANNEL, held[0].id)
    [(statement, _)] = ran  # the notifications, and one release for each owner
    assert statement.startswith("WITH part_0 AS MATERIALIZED") and "part_2" in statement
    assert _heard(listener) == [(CHANGE_CHANNEL, held[0].id)]
    with db.read() as conn:
        assert [_owner(conn, op.id) for op in held] == [None, None]


def test_a_move_sends_its_own_notification_in_its_statement_and_a_lost_one_none(
    pg: tuple[Database, psycopg.Connection], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An operation's move notifies its waiters from the statement that makes it: no tail
    is sent for it. A move that lost its race (its row changed since it was read) is
    undone, and says nothing; one undone by a savepoint neither."""
    db, listener = pg
    journal = Journal()
    now = datetime.now(UTC)
    op = insert_operation(db, journal, now)
    _heard(listener)  # the new operation's wake-up
    moved = None
    with recording(monkeypatch) as ran, db.write() as conn:
        moved = journal.transition(
            conn, op, State.ACCEPTED, actor="t", cause="t", now=now, changes={"remote_job_id": "j"}
        )
    assert [sql for sql, _ in ran if "pg_notify" in sql] == [ran[0][0]]
    assert "UPDATE operations" in ran[0][0]
    assert _heard(listener) == [(CHANGE_CHANNEL, op.id)]

    with db.write() as conn:
        with pytest.raises(StaleWrite), savepoint(conn, "attempt"):
            journal.transition(conn, op, State.ACCEPTED, actor="t", cause="stale", now=now)
        with pytest.raises(StaleWrite), savepoint(conn, "attempt"):
            journal.transition(conn, moved, State.OBSERVING, actor="t", cause="undone", now=now)
            raise StaleWrite("undone")
    assert _heard(listener) == []


def test_a_create_that_finds_its_key_free_wakes_once_and_one_that_finds_it_taken_not(
    pg: tuple[Database, psycopg.Connection],
) -> None:
    """The insert that checks its key in its own statement sends the new operation's
    wake-up only when it made the row: a second insert under the key (a retry) writes
    nothing and says nothing, and neither does one under a pruned key's tombstone."""
    db, listener = pg
    journal = Journal()
    now = datetime.now(UTC)
    first = new_operation(now, caller="agent-k", idempotency_key="k-1")
    wake = [(WAKE_CHANNEL, "")]
    with db.write() as conn:
        made = journal.insert_if_key_free(
            conn, first, "d-1", actor="t", cause="t", now=now, notify=wake
        )
    assert made is not None and made.version == 1
    assert _heard(listener) == [(WAKE_CHANNEL, "")]

    retry = new_operation(now, caller="agent-k", idempotency_key="k-1")
    with db.write() as conn:
        conn.execute(
            sa.insert(TOMBSTONES).values(
                operation_id="op-pruned",
                caller="agent-k",
                key_digest="d-2",
                request_fingerprint="f",
                provider="sim",
                state="succeeded",
                done_at=now,
                pruned_at=now,
            )
        )
        pruned = new_operation(now, caller="agent-k", idempotency_key="k-2")
        for op, digest in ((retry, "d-1"), (pruned, "d-2")):
            assert (
                journal.insert_if_key_free(
                    conn, op, digest, actor="t", cause="t", now=now, notify=wake
                )
                is None
            )
    assert _heard(listener) == []
    with db.read() as conn:
        ids = conn.execute(sa.select(OPS.c.id).where(OPS.c.caller == "agent-k")).scalars().all()
        entries = conn.execute(sa.select(sa.func.count()).select_from(HISTORY)).scalar()
    assert ids == [first.id]
    assert entries == 1
