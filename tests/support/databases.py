"""Throw-away databases: a SQLite file per test, and on PostgreSQL a database per test
cloned from a migrated template (``CREATE DATABASE ... TEMPLATE``), as procrastinate does.

Both backends migrate once per test process and copy the result: a SQLite test gets a
byte copy of a migrated file, a PostgreSQL test a clone of the migrated template. Names
carry the process id and the xdist worker, so parallel workers (and parallel runs on one
shared server) never touch each other's databases.
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

import sqlalchemy as sa

from reconciler.storage import migrate
from reconciler.storage.database import Database

POSTGRES_ENV = "RECONCILER_TEST_POSTGRES_URL"


def postgres_admin_url() -> str | None:
    return os.environ.get(POSTGRES_ENV) or None


def worker_tag() -> str:
    """This test process's name for what it creates: the xdist worker and the process id."""
    return f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}_{os.getpid()}"


def _with_database(url: str, name: str) -> str:
    return str(sa.make_url(url).set(database=name).render_as_string(hide_password=False))


def _admin_engine(url: str) -> sa.Engine:
    return sa.create_engine(url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)


class PostgresFactory:
    """Creates databases cloned from one migrated template per test session."""

    def __init__(self, admin_url: str) -> None:
        self.admin_url = admin_url
        self.template = f"reconciler_tmpl_{worker_tag()}_{secrets.token_hex(3)}"
        self._admin = _admin_engine(admin_url)
        with self._admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{self.template}"')
        db = Database(_with_database(admin_url, self.template))
        try:
            migrate.upgrade(db)
        finally:
            db.dispose()
        self.created: list[str] = []

    def empty(self) -> str:
        name = f"reconciler_t_{secrets.token_hex(6)}"
        with self._admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        self.created.append(name)
        return _with_database(self.admin_url, name)

    def clone(self) -> str:
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

    def drop(self, url: str) -> None:
        name = sa.make_url(url).database
        with self._admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if name in self.created:
            self.created.remove(name)

    def close(self) -> None:
        with self._admin.connect() as conn:
            for name in [*self.created, self.template]:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self._admin.dispose()


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
