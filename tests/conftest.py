"""Shared fixtures: database tests run on SQLite; storage tests on PostgreSQL too.

A test (or module) whose subject is storage behaviour, what the two databases do
differently (transactions racing, claims and leases, LISTEN/NOTIFY, migrations,
counting in SQL), carries ``@pytest.mark.both_backends``: its ``backend``,
``db_url``, ``db``, ``runtime``, ``empty_db_url`` and ``module_db_url`` run once
per backend. Every other test runs on a SQLite file: what it proves (HTTP, the
engine's decisions, the doors) does not depend on the database underneath.

The PostgreSQL flavour needs ``RECONCILER_TEST_POSTGRES_URL`` (``.ci/run``
starts a cluster and sets it). Locally it is skipped when unset; under
``CI=true`` a missing URL is an error, so CI can never pass on SQLite alone.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.config import Settings
from reconciler.core.clock import ManualClock
from reconciler.runtime import Runtime
from reconciler.storage.database import Database
from tests.support.databases import (
    PostgresFactory,
    need_postgres,
    postgres_admin_url,
    sqlite_url,
)

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
BOTH_BACKENDS = "both_backends"


def _parametrized_by_mark(metafunc: pytest.Metafunc, name: str) -> bool:
    for mark in metafunc.definition.iter_markers("parametrize"):
        names = mark.args[0]
        if isinstance(names, str):
            names = [n.strip() for n in names.split(",")]
        if name in names:
            return True
    return False


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Runs a ``both_backends`` test once per backend; any other test gets SQLite only."""
    if metafunc.definition.get_closest_marker(BOTH_BACKENDS) is None:
        return
    for name, scope in (("backend", "function"), ("module_db_url", "module")):
        if name in metafunc.fixturenames and not _parametrized_by_mark(metafunc, name):
            metafunc.parametrize(name, BACKENDS, indirect=True, scope=scope)  # type: ignore[arg-type]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``-n N`` hands tests out one by one, keeping the modules of ``WHOLE`` together."""
    if config.getoption("dist") != "load":
        return None
    from tests.support.scheduling import LoadKeepingModulesWhole

    # Collection order, as --dist load keeps it: not the largest units first.
    config.option.loadscopereorder = False
    return LoadKeepingModulesWhole(config, log)


@pytest.fixture(scope="session")
def postgres_factory() -> Iterator[PostgresFactory | None]:
    url = postgres_admin_url()
    if url is None:
        yield None
        return
    factory = PostgresFactory(url)
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    """The database under test: SQLite unless the test is ``both_backends``."""
    return str(getattr(request, "param", "sqlite"))


@pytest.fixture
def db_url(backend: str, tmp_path: Path, postgres_factory: PostgresFactory | None) -> Iterator[str]:
    """A migrated, empty database on the backend under test."""
    if backend == "sqlite":
        with sqlite_url(tmp_path) as url:
            yield url
        return
    yield from _postgres_clone(postgres_factory)


@pytest.fixture
def pg_url(postgres_factory: PostgresFactory | None) -> Iterator[str]:
    """A migrated, empty PostgreSQL database, for tests of what only PostgreSQL does."""
    yield from _postgres_clone(postgres_factory)


def _postgres_clone(postgres_factory: PostgresFactory | None) -> Iterator[str]:
    factory = need_postgres(postgres_factory)
    url = factory.clone()
    try:
        yield url
    finally:
        factory.release(url)


@pytest.fixture
def empty_db_url(
    backend: str, tmp_path: Path, postgres_factory: PostgresFactory | None
) -> Iterator[str]:
    """A database with no schema at all, for migration tests."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.db'}"
        return
    factory = need_postgres(postgres_factory)
    url = factory.empty()
    try:
        yield url
    finally:
        factory.drop(url)


@pytest.fixture
def db(db_url: str) -> Iterator[Database]:
    database = Database(db_url)
    try:
        yield database
    finally:
        database.dispose()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def runtime(db_url: str, clock: ManualClock) -> Iterator[Runtime]:
    rt = Runtime.build(Settings(database_url=db_url), clock=clock, rng=random.Random(7))
    try:
        yield rt
    finally:
        rt.db.dispose()


@pytest.fixture(scope="module")
def module_db_url(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    postgres_factory: PostgresFactory | None,
) -> Iterator[str]:
    """Like ``db_url``, shared by one module's tests (for a service that is slow to set up)."""
    if getattr(request, "param", "sqlite") == "sqlite":
        with sqlite_url(tmp_path_factory.mktemp("module-db")) as url:
            yield url
        return
    yield from _postgres_clone(postgres_factory)
