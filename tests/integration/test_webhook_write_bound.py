"""A webhook delivery is refused (503, Retry-After) before the provider's client gives up.

Providers time their deliveries out after 5-10 s (the simulator after 5 s) and may
count a timeout as a failed delivery; a 503 with ``Retry-After`` is a clear "later".
Another connection holds SQLite's write lock; the delivery is refused within the
webhook bound (2 s by default), well before the general write bound (5 s).
"""

from __future__ import annotations

import sqlite3
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa

from reconciler.config import ServerSettings
from reconciler.core.errors import StorageUnavailable
from reconciler.demo.sim import SimConfig
from reconciler.engine.group_commit import GroupCommitter
from reconciler.storage.database import Database
from reconciler.storage.journal import Journal
from reconciler.storage.webhook_events import IncomingEvent
from tests.support.databases import sqlite_url

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_the_webhook_bound_is_below_common_provider_client_timeouts() -> None:
    settings = ServerSettings()
    assert settings.webhook_wait_seconds <= 2.0
    assert settings.webhook_wait_seconds < SimConfig().webhook_timeout
    assert settings.webhook_wait_seconds < settings.write_wait_seconds


async def test_a_locked_database_answers_a_webhook_within_its_bound(tmp_path: Path) -> None:
    with sqlite_url(tmp_path) as url:
        db = Database(url, write_wait_seconds=5.0)
        committer = GroupCommitter(
            db, Journal(), lambda: datetime.now(UTC), on_hint=lambda: None, wait_seconds=0.5
        )
        path = sa.make_url(url).database
        assert path is not None
        outside = sqlite3.connect(path, isolation_level=None, timeout=10)
        outside.execute("BEGIN EXCLUSIVE")
        event = IncomingEvent("sim", "evt_1", "job_1", "0" * 64, "{}", datetime.now(UTC))
        started = time.monotonic()
        try:
            with pytest.raises(StorageUnavailable) as refused:
                await committer.submit(event)
            took = time.monotonic() - started
        finally:
            outside.execute("ROLLBACK")
            outside.close()
            db.dispose()
        assert took < 2.0, f"refused after {took:.1f} s"
        assert "0.5 s" in str(refused.value)
