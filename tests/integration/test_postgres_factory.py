"""The PostgreSQL databases the tests get: a database handed on is what a fresh clone is.

``PostgresFactory.release`` empties a database a test is done with and gives it to the
next one, unless the test changed its schema (see ``tests/support/databases.py``).
"""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa

from reconciler.storage.database import Database
from reconciler.storage.history import history_of
from reconciler.storage.journal import Journal
from tests.support.databases import PostgresFactory, need_postgres
from tests.support.factories import insert_operation

TABLES = "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1"


def _rows(url: str) -> dict[str, int]:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            tables = [t for (t,) in conn.exec_driver_sql(TABLES)]
            return {
                t: conn.exec_driver_sql(f'SELECT count(*) FROM "{t}"').scalar_one() for t in tables
            }
    finally:
        engine.dispose()


def _execute(url: str, *statements: str) -> None:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            for statement in statements:
                conn.exec_driver_sql(statement)
    finally:
        engine.dispose()


def test_a_released_database_comes_back_empty_with_its_sequences_restarted(
    postgres_factory: PostgresFactory | None,
) -> None:
    factory = need_postgres(postgres_factory)
    url = factory.clone()
    fresh = _rows(url)
    assert fresh.pop("alembic_version") == 1 and set(fresh.values()) == {0}
    db = Database(url)
    journal = Journal()
    insert_operation(db, journal, datetime.now(UTC), id="op_1")  # a row and its history
    db.dispose()
    # A connection left open, as a stopped service's pool may leave one.
    held = Database(url)
    with held.read() as conn:
        conn.exec_driver_sql("SELECT 1")
    factory.release(url)

    again = factory.clone()
    assert again == url  # the same database, handed on
    assert _rows(again) == {**fresh, "alembic_version": 1}
    db = Database(again)
    insert_operation(db, journal, datetime.now(UTC), id="op_2")
    with db.read() as conn:
        (entry,) = history_of(conn, "op_2")
    db.dispose()
    assert entry.id == 1  # the history's sequence starts again
    held.dispose()
    factory.release(again)


def test_a_database_whose_schema_changed_is_dropped(
    postgres_factory: PostgresFactory | None,
) -> None:
    factory = need_postgres(postgres_factory)
    url = factory.clone()
    _execute(url, "CREATE TABLE effects (key text)")
    factory.release(url)

    other = factory.clone()
    assert other != url
    name = sa.make_url(url).database
    admin = sa.create_engine(factory.admin_url, poolclass=sa.pool.NullPool)
    try:
        with admin.connect() as conn:
            found = conn.exec_driver_sql(
                "SELECT count(*) FROM pg_database WHERE datname = %s", (name,)
            ).scalar_one()
    finally:
        admin.dispose()
    assert found == 0
    factory.release(other)
