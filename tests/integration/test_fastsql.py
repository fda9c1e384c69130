"""The plain driver statements of the hot path, on a real database.

They bypass SQLAlchemy's statement layer, so two things must still hold: the
values they store read back exactly as the ORM would have stored them, and a
driver error reaches ``translate_errors`` as the same error family.
"""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta, timezone

import pytest
import sqlalchemy as sa

from reconciler.core.errors import Conflict, StorageUnavailable
from reconciler.storage.database import Database, translate_errors
from reconciler.storage.fastsql import insert_many, raw_for, run
from reconciler.storage.webhook_events import EVENT_COLUMNS, EVENTS

pytestmark = pytest.mark.both_backends

INSTANTS = [
    datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC),  # no fraction: still six digits on SQLite
    datetime(2026, 3, 1, 12, 0, 0, 7, tzinfo=UTC),
    datetime(2026, 3, 1, 23, 30, 0, 123456, tzinfo=timezone(timedelta(hours=-5))),
    datetime(999, 1, 2, 3, 4, 5, tzinfo=UTC),
]


def _event_row(db: Database, event_id: str, at: datetime, body: str = "{}") -> tuple[object, ...]:
    raw = raw_for(db.engine.dialect.name)
    return ("sim", event_id, raw.time(at), None, None, "0" * 64, body, 0, 0)


@pytest.mark.parametrize("at", INSTANTS, ids=str)
def test_encoded_times_match_what_the_orm_stores(db: Database, at: datetime) -> None:
    with db.write() as conn:
        insert_many(conn, EVENTS, EVENT_COLUMNS, [_event_row(db, "fast", at)])
        conn.execute(
            sa.insert(EVENTS).values(
                provider="sim",
                event_id="orm",
                received_at=at,
                body_sha256="0" * 64,
                duplicates=0,
                conflicts=0,
            )
        )
    with db.read() as conn:
        stored = dict(
            conn.execute(sa.text("SELECT event_id, received_at FROM webhook_events")).all()
        )
        typed = dict(conn.execute(sa.select(EVENTS.c.event_id, EVENTS.c.received_at)).all())
    assert stored["fast"] == stored["orm"]
    assert typed["fast"] == typed["orm"] == at


def test_the_same_instant_encodes_alike_each_time(db: Database) -> None:
    raw = raw_for(db.engine.dialect.name)
    first, second = INSTANTS[1], INSTANTS[2]
    assert raw.time(first) == raw.time(first)
    assert raw.time(second) != raw.time(first)
    assert raw.time(first) == raw.time(datetime(2026, 3, 1, 12, 0, 0, 7, tzinfo=UTC))


def test_a_constraint_violation_is_a_conflict_and_keeps_values_out(db: Database) -> None:
    secret_body = '{"token": "do-not-print-me"}'
    with db.write() as conn:
        insert_many(conn, EVENTS, EVENT_COLUMNS, [_event_row(db, "e1", INSTANTS[0])])
    with pytest.raises(Conflict) as caught, db.write() as conn:
        insert_many(conn, EVENTS, EVENT_COLUMNS, [_event_row(db, "e2", INSTANTS[0])])
        insert_many(conn, EVENTS, EVENT_COLUMNS, [_event_row(db, "e1", INSTANTS[0], secret_body)])
    assert "do-not-print-me" not in str(caught.value)
    assert "do-not-print-me" not in str(caught.value.__cause__)
    # The failed transaction left nothing behind, not even the row before the failure.
    with db.read() as conn:
        ids = conn.execute(sa.text("SELECT event_id FROM webhook_events")).scalars().all()
    assert ids == ["e1"]


def test_a_broken_statement_is_the_same_error_as_through_sqlalchemy(db: Database) -> None:
    def failure(execute: object) -> type[BaseException]:
        try:
            with db.write() as conn:
                if execute is run:
                    run(conn, "SELECT no_such_column FROM webhook_events")
                else:
                    conn.exec_driver_sql("SELECT no_such_column FROM webhook_events")
        except Exception as exc:
            return type(exc)
        raise AssertionError("the statement did not fail")

    assert failure(run) is failure("sqlalchemy")


def test_a_locked_sqlite_database_is_storage_unavailable(db: Database) -> None:
    if not db.sqlite:
        pytest.skip("SQLite's file lock")
    holder = sqlite3.connect(db.engine.url.database or "", isolation_level=None)
    try:
        with db.engine.connect() as conn:
            conn.connection.dbapi_connection.execute("PRAGMA busy_timeout=50")  # type: ignore[union-attr]
            holder.execute("BEGIN IMMEDIATE")  # another process holding the write lock
            with pytest.raises(StorageUnavailable), translate_errors(), conn.begin():
                pass
    finally:
        holder.close()


def test_a_lost_postgres_connection_is_storage_unavailable_and_replaced(db: Database) -> None:
    if db.sqlite:
        pytest.skip("PostgreSQL connections")
    with pytest.raises(StorageUnavailable), db.write() as conn:
        pid = run(conn, "SELECT pg_backend_pid()").fetchone()[0]
        with db.engine.connect() as killer:
            killer.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        run(conn, "SELECT 1")
    # The dead connection was invalidated, not handed out again.
    with db.write() as conn:
        assert run(conn, "SELECT 1").fetchone()[0] == 1


def test_row_encoder_picks_and_encodes_columns_in_order(db: Database) -> None:
    raw = raw_for(db.engine.dialect.name)
    at = INSTANTS[1]
    row = {"event_id": "e", "received_at": at, "provider": "sim", "ignored": 1}
    both = raw.row_encoder(EVENTS, ("received_at", "event_id"))
    assert both(row) == (raw.time(at), "e")
    assert raw.row_encoder(EVENTS, ("event_id",))(row) == ("e",)
    assert raw.row_encoder(EVENTS, ("received_at",))(row) == (raw.time(at),)
