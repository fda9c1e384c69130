"""The named statements (``storage.fastsql.Sql``), on a real database.

They bypass SQLAlchemy's statement layer but encode and decode with each column's
own type, so the values they store read back exactly as the ORM would have stored
them (and what the ORM stored reads back alike through them), and a driver error
reaches ``translate_errors`` as the same error family.
"""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta, timezone

import pytest
import sqlalchemy as sa

from reconciler.core.errors import Conflict, StorageUnavailable
from reconciler.storage.database import Database, _postgres_engine, translate_errors
from reconciler.storage.fastsql import AS_IS, MANY_ROWS, Sql, codec_for, run
from reconciler.storage.journal import Journal
from reconciler.storage.tables import EVENTS, OPS, PAYLOAD_TABLE
from reconciler.storage.webhook_events import EVENT_COLUMNS
from tests.support.factories import insert_operation
from tests.support.waiting import wait_until

_INSERT_EVENT = Sql(
    "test-event-insert",
    EVENTS,
    f"INSERT INTO webhook_events ({', '.join(EVENT_COLUMNS)}) "
    f"VALUES ({', '.join(['?'] * len(EVENT_COLUMNS))})",
    params=EVENT_COLUMNS,
)
_EVENTS_IN = Sql(
    "test-events-in",
    EVENTS,
    "SELECT event_id, received_at FROM webhook_events WHERE event_id IN (?*) "
    "AND provider = ? ORDER BY event_id [[FOR UPDATE|]]",
    params=("event_id", "provider"),
    returns=("event_id", "received_at"),
)

pytestmark = pytest.mark.both_backends

INSTANTS = [
    datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC),  # no fraction: still six digits on SQLite
    datetime(2026, 3, 1, 12, 0, 0, 7, tzinfo=UTC),
    datetime(2026, 3, 1, 23, 30, 0, 123456, tzinfo=timezone(timedelta(hours=-5))),
    datetime(999, 1, 2, 3, 4, 5, tzinfo=UTC),
]


def _event_row(event_id: str, at: datetime, body: str = "{}") -> tuple[object, ...]:
    return ("sim", event_id, at, None, None, "0" * 64, body, 0, 0, None, None, False)


@pytest.mark.parametrize("at", INSTANTS, ids=str)
def test_encoded_times_match_what_the_orm_stores(db: Database, at: datetime) -> None:
    with db.write() as conn:
        _INSERT_EVENT.run(conn, *_event_row("fast", at))
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
        ours = dict(_EVENTS_IN.rows(conn, ["fast", "orm"], "sim"))
    assert stored["fast"] == stored["orm"]
    assert typed["fast"] == typed["orm"] == at
    assert ours["fast"] == ours["orm"] == at
    assert ours["fast"].tzinfo is UTC


def test_the_same_instant_encodes_alike_each_time(db: Database) -> None:
    codec = codec_for(db.engine.dialect)
    column = EVENTS.c.received_at
    first, second = INSTANTS[1], INSTANTS[2]
    assert codec.encode(column, first) == codec.encode(column, first)
    assert codec.encode(column, second) != codec.encode(column, first)
    same = datetime(2026, 3, 1, 12, 0, 0, 7, tzinfo=UTC)
    assert codec.encode(column, first) == codec.encode(column, same)


def test_a_constraint_violation_is_a_conflict_and_keeps_values_out(db: Database) -> None:
    secret_body = '{"token": "do-not-print-me"}'
    with db.write() as conn:
        _INSERT_EVENT.run(conn, *_event_row("e1", INSTANTS[0]))
    with pytest.raises(Conflict) as caught, db.write() as conn:
        _INSERT_EVENT.run(conn, *_event_row("e2", INSTANTS[0]))
        _INSERT_EVENT.run(conn, *_event_row("e1", INSTANTS[0], secret_body))
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


def _terminate(db: Database, pid: int) -> None:
    """End one server backend, as a restart or an idle timeout does, and wait until it is gone."""
    with db.engine.connect() as killer:
        killer.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})

    def gone() -> bool:
        with db.engine.connect() as conn:
            query = sa.text("SELECT count(*) FROM pg_stat_activity WHERE pid = :pid")
            return conn.execute(query, {"pid": pid}).scalar() == 0

    wait_until(gone, 10, f"backend {pid} to exit")


def _pooled_backend(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())


def test_an_idle_postgres_connection_the_server_closed_is_replaced_unseen(db: Database) -> None:
    if db.sqlite:
        pytest.skip("PostgreSQL connections")
    # Every pooled connection counts as idle.
    engine = _postgres_engine(db.url, set(), idle_ping_seconds=0.0)
    try:
        first = _pooled_backend(engine)
        _terminate(db, first)
        # The ping on checkout finds it gone: the caller gets a fresh connection, no error.
        assert _pooled_backend(engine) != first
    finally:
        engine.dispose()


def test_a_connection_in_steady_use_is_not_pinged(db: Database) -> None:
    if db.sqlite:
        pytest.skip("PostgreSQL connections")
    engine = _postgres_engine(db.url, set(), idle_ping_seconds=3600.0)
    try:
        first = _pooled_backend(engine)
        _terminate(db, first)
        # No ping: the statement itself meets the closed connection, as an outage.
        with pytest.raises(StorageUnavailable), translate_errors(), engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
        assert _pooled_backend(engine) != first  # and the pool connected again
    finally:
        engine.dispose()


@pytest.fixture
def operation_row(db: Database) -> str:
    """The id of one stored operation (its payload rows need it)."""
    return insert_operation(db, Journal(), INSTANTS[0]).id


_PAYLOAD_INSERT = Sql(
    "test-payload-insert",
    PAYLOAD_TABLE,
    "INSERT INTO operation_payloads (operation_id, name, value) VALUES (?, ?, ?)",
    params=("operation_id", "name", "value"),
)
_PAYLOAD_VALUES = Sql(
    "test-payload-values",
    PAYLOAD_TABLE,
    "SELECT name, value FROM operation_payloads WHERE operation_id = ? ORDER BY name",
    params=("operation_id",),
    returns=("name", "value"),
)


def test_json_round_trips_alike_through_both_paths(db: Database, operation_row: str) -> None:
    value = {"nested": [1, 2.5, "x", None, True], "empty": {}}
    with db.write() as conn:
        _PAYLOAD_INSERT.run(conn, operation_row, "meta", value)
        conn.execute(
            sa.insert(PAYLOAD_TABLE).values(operation_id=operation_row, name="result", value=value)
        )
    with db.read() as conn:
        ours = dict(_PAYLOAD_VALUES.rows(conn, operation_row))
        query = sa.select(PAYLOAD_TABLE.c.name, PAYLOAD_TABLE.c.value).order_by(
            PAYLOAD_TABLE.c.name
        )
        typed = {name: value for name, value in conn.execute(query)}
    assert ours == typed
    assert ours["meta"] == ours["result"] == value


def test_a_boolean_reads_back_as_a_boolean(db: Database, operation_row: str) -> None:
    flag = Sql(
        "test-flag",
        OPS,
        "SELECT completion_pending FROM operations",
        returns=("completion_pending",),
    )
    with db.read() as conn:
        assert flag.value(conn) is False
        assert conn.execute(sa.select(OPS.c.completion_pending)).scalar() is False


def test_a_list_mark_takes_any_length_and_postgres_one_text(db: Database) -> None:
    with db.write() as conn:
        for n in range(3):
            _INSERT_EVENT.run(conn, *_event_row(f"e{n}", INSTANTS[n]))
        assert [r[0] for r in _EVENTS_IN.rows(conn, ["e0"], "sim")] == ["e0"]
        assert [r[0] for r in _EVENTS_IN.rows(conn, ["e2", "e0", "zz"], "sim")] == ["e0", "e2"]
        assert _EVENTS_IN.rows(conn, ["e1"], "other") == []
    prepared = _EVENTS_IN._for(conn)
    if db.sqlite:
        assert "FOR UPDATE" not in prepared.text_for((["a", "b"], "sim"))
        assert prepared.text_for((["a", "b"], "sim")).count("?") == 3
    else:
        assert prepared.text_for((["a"], "sim")) == prepared.text_for((["a", "b", "c"], "sim"))
        assert "event_id = ANY($1)" in prepared.text and "FOR UPDATE" in prepared.text


def test_a_long_statement_of_many_values_keeps_each_value_in_its_place(db: Database) -> None:
    """PostgreSQL's marks are numbered in the text the server gets (the driver does not
    parse it again), so a statement of more values than the driver would cache, with a
    literal percent sign in it, reads each value back where it was put."""
    n = 60
    select = Sql(
        "test-many-values",
        None,
        "SELECT '100%' AS pct, " + ", ".join(["?"] * n),
        params=[AS_IS] * n,
    )
    with db.read() as conn:
        row = select.first(conn, *[f"v{i}" for i in range(n)])
    assert row is not None
    assert list(row) == ["100%", *[f"v{i}" for i in range(n)]]


def test_many_rows_of_a_plain_insert_are_stored_whole(db: Database) -> None:
    """On PostgreSQL ``many`` sends a plain INSERT's rows as statements of up to
    ``MANY_ROWS`` rows each: every row arrives, in its values, and the count is right."""
    n = MANY_ROWS + 3
    rows = [_event_row(f"m{i:04d}", INSTANTS[i % len(INSTANTS)], f'{{"i":{i}}}') for i in range(n)]
    with db.write() as conn:
        assert _INSERT_EVENT.many(conn, rows) == n
        stored = _EVENTS_IN.rows(conn, [r[1] for r in rows], "sim")
    assert [(r[0], r[1]) for r in stored] == [(row[1], row[2]) for row in rows]
    if not db.sqlite:
        assert _INSERT_EVENT._for(conn).rows_text(2) is not None


def test_a_statement_names_a_column_for_each_mark() -> None:
    with pytest.raises(ValueError, match="2 marks, 1 params"):
        Sql(
            "bad",
            EVENTS,
            "SELECT 1 FROM webhook_events WHERE provider = ? AND body = ?",
            ("provider",),
        )
    with pytest.raises(KeyError):
        Sql("unknown", EVENTS, "SELECT ?", ("no_such_column",))._for(_sqlite_conn())
    assert Sql("as-is", None, "SELECT ?", (AS_IS,)).params == (AS_IS,)


def _sqlite_conn() -> sa.Connection:
    return sa.create_engine("sqlite://").connect()
