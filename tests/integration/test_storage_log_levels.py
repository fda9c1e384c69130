"""Expected storage conditions are WARNINGs that name the condition, once per outage.

A locked database, an unreachable server or a full disk is the database's state, not
the service's error: a webhook batch refused for it is logged at WARNING (it was an
ERROR), and a full disk is named in the log (before, only ``/readyz`` said so), on
SQLite ("database or disk is full") and PostgreSQL ("No space left on device").
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa

from reconciler.core.errors import StorageUnavailable
from reconciler.engine.group_commit import GroupCommitter
from reconciler.storage.availability import Availability, WriteFailure, classify, explain
from reconciler.storage.database import Database
from reconciler.storage.journal import Journal
from reconciler.storage.webhook_events import IncomingEvent
from tests.support.databases import sqlite_url
from tests.support.waiting import wait_until_async


def _unavailable(orig: Exception) -> StorageUnavailable:
    try:
        try:
            raise sa.exc.OperationalError("INSERT ...", {}, orig)
        except sa.exc.OperationalError as wrapped:
            raise StorageUnavailable("the database is unavailable; retry later") from wrapped
    except StorageUnavailable as exc:
        return exc


@pytest.mark.parametrize(
    "orig",
    [
        sqlite3.OperationalError("database or disk is full"),
        psycopg.errors.DiskFull('could not extend file "base/5/16384": No space left on device'),
    ],
    ids=["sqlite", "postgresql"],
)
def test_a_full_disk_is_named(orig: Exception) -> None:
    exc = _unavailable(orig)
    assert classify(exc) is WriteFailure.DISK_FULL
    assert explain(exc).startswith("disk full")


def test_one_warning_per_outage_naming_it_and_a_line_when_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="reconciler.storage.availability")
    availability = Availability()
    for _ in range(50):
        availability.failed(WriteFailure.DISK_FULL)
    availability.succeeded(changed=True)
    records = [r for r in caplog.records if r.name == "reconciler.storage.availability"]
    assert [(r.levelno, r.getMessage().split(":")[0]) for r in records] == [
        (logging.WARNING, "database writes are failing"),
        (logging.INFO, "database writes succeed again after 0.0 s (disk_full)"),
    ]
    assert "disk full" in records[0].getMessage()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_a_webhook_batch_refused_by_a_busy_database_is_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The database's one writer is held past the bound: the batch is refused, a WARNING."""
    caplog.set_level(logging.INFO)
    with sqlite_url(tmp_path) as url:
        db = Database(url, write_wait_seconds=0.3)
        committer = GroupCommitter(
            db, Journal(), lambda: datetime.now(UTC), on_hint=lambda: None, wait_seconds=2.0
        )
        gate, entered = threading.Event(), threading.Event()

        def hold() -> None:
            entered.set()
            gate.wait(10.0)

        holding = asyncio.ensure_future(db.run_write(hold, wait=10.0))
        event = IncomingEvent("sim", "evt_1", "job_1", "0" * 64, "{}", datetime.now(UTC))
        try:
            # The writer holds the lock before the batch comes (a batch goes ahead of
            # writes still queued, not of one running).
            assert await asyncio.to_thread(entered.wait, 10)
            with pytest.raises(StorageUnavailable):
                await committer.submit(event)
            # The sender's bound and the writer's are the same 0.3 s and the sender's starts
            # first: hold the writer until the batch itself has been refused.
            await wait_until_async(
                lambda: _from_group_commit(caplog), 10, "the refused batch's log line"
            )
        finally:
            gate.set()
            await holding
            db.dispose()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]
    refused = _from_group_commit(caplog)
    assert refused and all(r.levelno == logging.WARNING for r in refused)
    assert "locked or busy" in refused[0].getMessage()


def _from_group_commit(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "reconciler.engine.group_commit"]
