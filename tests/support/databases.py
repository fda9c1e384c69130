"""Throw-away databases: a SQLite file per test, and on PostgreSQL a database per test
cloned from a migrated template (``CREATE DATABASE ... TEMPLATE``), as procrastinate does.

Both backends migrate once per test process and copy the result: a SQLite test gets a
byte copy of a migrated file, a PostgreSQL test a clone of the migrated template. Names
carry the process id and the xdist worker, so parallel workers (and parallel runs on one
shared server) never touch each other's databases.

A PostgreSQL database a test is done with is emptied and handed to the next test rather
than dropped, when its schema is still the template's: a clone and its drop cost the
server about 0.4 s of CPU (kernel time copying and removing the files, and the checkpoint
each clone forces), an emptying about 0.1 s. Emptying is what a fresh clone is: every
connection to it ended, every table truncated with its sequences restarted (the template's
tables hold no rows; ``alembic_version`` is the schema, and is kept). A database whose
schema a test changed (a table of its own, a migration run down and up) is dropped.
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import sqlalchemy as sa

from reconciler.storage import migrate
from reconciler.storage.database import Database

POSTGRES_ENV = "RECONCILER_TEST_POSTGRES_URL"


def postgres_admin_url() -> str | None:
    return os.environ.get(POSTGRES_ENV) or None


def need_postgres(factory: PostgresFactory | None) -> PostgresFactory:
    """The session's PostgreSQL factory; a skip without one, a failure in CI, where the
    PostgreSQL tests are part of what must pass."""
    if factory is None:
        if os.environ.get("CI") == "true":
            pytest.fail(
                f"{POSTGRES_ENV} must be set in CI: the PostgreSQL tests may not be skipped"
            )
        pytest.skip(f"{POSTGRES_ENV} is not set")
    return factory


def worker_tag() -> str:
    """This test process's name for what it creates: the xdist worker and the process id."""
    return f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}_{os.getpid()}"


def _with_database(url: str, name: str) -> str:
    return str(sa.make_url(url).set(database=name).render_as_string(hide_password=False))


def _admin_engine(url: str) -> sa.Engine:
    return sa.create_engine(url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)


# What a test could change of a database's schema: relations and their columns, indexes,
# constraints, functions, triggers, types, schemas, settings, and the migration revision.
SCHEMA_FINGERPRINT = """
SELECT md5(string_agg(x, ',' ORDER BY x)) FROM (
  SELECT 'rel:' || c.relname || ':' || c.relkind::text || ':' || coalesce(string_agg(
           a.attname || ' ' || format_type(a.atttypid, a.atttypmod) || ' ' || a.attnotnull::text,
           ';' ORDER BY a.attnum), '') AS x
    FROM pg_class c
    LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
   WHERE c.relnamespace = 'public'::regnamespace
   GROUP BY c.relname, c.relkind
  UNION ALL SELECT 'idx:' || pg_get_indexdef(i.indexrelid)
    FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
   WHERE c.relnamespace = 'public'::regnamespace
  UNION ALL SELECT 'con:' || conname || ':' || pg_get_constraintdef(oid)
    FROM pg_constraint WHERE connamespace = 'public'::regnamespace
  UNION ALL SELECT 'fn:' || proname FROM pg_proc WHERE pronamespace = 'public'::regnamespace
  UNION ALL SELECT 'trg:' || t.tgname
    FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
   WHERE c.relnamespace = 'public'::regnamespace AND NOT t.tgisinternal
  UNION ALL SELECT 'type:' || typname FROM pg_type
   WHERE typnamespace = 'public'::regnamespace AND typtype IN ('e', 'd', 'r', 'm')
  UNION ALL SELECT 'ns:' || nspname FROM pg_namespace
   WHERE nspname !~ '^pg_' AND nspname <> 'information_schema'
  UNION ALL SELECT 'set:' || array_to_string(setconfig, ';') FROM pg_db_role_setting
   WHERE setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())
  UNION ALL SELECT 'rev:' || version_num FROM alembic_version
) parts
"""
TABLES = "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
KEPT = {"alembic_version"}


class PostgresFactory:
    """Creates databases cloned from one migrated template per test session, and empties
    each one a test is done with for the next (see the module)."""

    def __init__(self, admin_url: str) -> None:
        self.admin_url = admin_url
        self.template = f"reconciler_tmpl_{worker_tag()}_{secrets.token_hex(3)}"
        self._admin = _admin_engine(admin_url)
        with self._admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{self.template}"')
        url = _with_database(admin_url, self.template)
        db = Database(url)
        try:
            migrate.upgrade(db)
        finally:
            db.dispose()
        # Read with a connection that is gone before the first clone (a template in use
        # cannot be copied).
        self._fingerprint = _fingerprint(url)
        self.created: list[str] = []
        self._spare: list[str] = []

    def empty(self) -> str:
        name = f"reconciler_t_{secrets.token_hex(6)}"
        with self._admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        self.created.append(name)
        return _with_database(self.admin_url, name)

    def clone(self) -> str:
        """A migrated database with no rows: an emptied one if there is one, else a clone."""
        if self._spare:
            return _with_database(self.admin_url, self._spare.pop())
        name = f"reconciler_t_{secrets.token_hex(6)}"
        with self._admin.connect() as conn:
            # FILE_COPY: PostgreSQL 15's default (WAL_LOG) writes the template's every page
            # into the WAL, about twice the CPU of copying its files on a cluster run
            # without fsync as the tests' is.
            conn.exec_driver_sql(
                f'CREATE DATABASE "{name}" TEMPLATE "{self.template}" STRATEGY FILE_COPY'
            )
        self.created.append(name)
        return _with_database(self.admin_url, name)

    def release(self, url: str) -> None:
        """A test is done with ``url`` (a clone): empty it for the next test, or drop it."""
        name = sa.make_url(url).database
        assert name is not None
        if name in self.created and self._empty(name):
            self._spare.append(name)
        else:
            self.drop(url)

    def _empty(self, name: str) -> bool:
        """Whether ``name`` now is what a fresh clone would be (False: drop it)."""
        with self._admin.connect() as conn:
            # A service the test stopped may still be closing its pool.
            conn.exec_driver_sql(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            )
        engine = _admin_engine(_with_database(self.admin_url, name))
        try:
            with engine.connect() as conn:
                conn.exec_driver_sql("SET lock_timeout = '5s'")
                if conn.exec_driver_sql(SCHEMA_FINGERPRINT).scalar() != self._fingerprint:
                    return False
                tables = [t for (t,) in conn.exec_driver_sql(TABLES) if t not in KEPT]
                listed = ", ".join(f'"{t}"' for t in tables)
                conn.exec_driver_sql(f"TRUNCATE {listed} RESTART IDENTITY CASCADE")
            return True
        except sa.exc.DBAPIError:
            return False  # locked or gone: a fresh clone instead
        finally:
            engine.dispose()

    def drop(self, url: str) -> None:
        name = sa.make_url(url).database
        with self._admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if name in self.created:
            self.created.remove(name)
        if name in self._spare:
            self._spare.remove(name)

    def close(self) -> None:
        with self._admin.connect() as conn:
            for name in [*self.created, self.template]:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self._admin.dispose()


def _fingerprint(url: str) -> str:
    engine = _admin_engine(url)
    try:
        with engine.connect() as conn:
            return str(conn.exec_driver_sql(SCHEMA_FINGERPRINT).scalar())
    finally:
        engine.dispose()


_sqlite_template: Path | None = None


def _migrated_sqlite_file() -> Path:
    """A migrated SQLite file made once per process (migrating costs more than a copy)."""
    global _sqlite_template
    if _sqlite_template is None:
        directory = Path(tempfile.mkdtemp(prefix=f"reconciler-tmpl-{worker_tag()}-"))
        atexit.register(shutil.rmtree, directory, True)
        path = directory / "template.db"
        db = Database(f"sqlite:///{path}")
        try:
            migrate.upgrade(db)
        finally:
            db.dispose()
        # Everything in the main file, so a copy without the -wal file is complete.
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            conn.close()
        _sqlite_template = path
    return _sqlite_template


@contextmanager
def sqlite_url(directory: Path, migrated: bool = True) -> Iterator[str]:
    path = directory / "reconciler.db"
    if migrated:
        shutil.copyfile(_migrated_sqlite_file(), path)
    yield f"sqlite:///{path}"
