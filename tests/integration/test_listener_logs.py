"""The notification listener logs one WARNING per PostgreSQL outage and says when it is back.

Before, it wrote a WARNING at every reconnect attempt: one a second for as long as the
database was down. The listener reaches PostgreSQL through a TCP proxy that the test
cuts and restores; the shared server is never touched.
"""

from __future__ import annotations

import asyncio
import logging

import pytest
import sqlalchemy as sa

from reconciler.engine import wakeups
from reconciler.engine.wakeups import Notifier
from tests.support.databases import PostgresFactory, need_postgres
from tests.support.faults import TcpProxy
from tests.support.waiting import wait_until_async

pytestmark = [pytest.mark.postgres, pytest.mark.anyio]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _lines(caplog: pytest.LogCaptureFixture, level: int, text: str) -> int:
    return len(
        [
            r
            for r in caplog.records
            if r.name == wakeups.log.name and r.levelno == level and text in r.getMessage()
        ]
    )


async def test_one_warning_per_outage_and_a_line_when_back(
    postgres_factory: PostgresFactory | None,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    factory = need_postgres(postgres_factory)
    url = sa.make_url(factory.clone())
    proxy = TcpProxy((url.host or "127.0.0.1", url.port or 5432))
    proxy.start()
    monkeypatch.setattr(wakeups, "RECONNECT_SECONDS", 0.05)
    caplog.set_level(logging.DEBUG, logger=wakeups.log.name)
    dsn = url.set(drivername="postgresql", port=proxy.port).render_as_string(hide_password=False)
    notifier = Notifier()
    task = asyncio.get_running_loop().create_task(notifier.listen(dsn))
    try:
        proxy.stop()
        await wait_until_async(
            lambda: _lines(caplog, logging.DEBUG, "still down") >= 20, 20, "20 retries"
        )
        assert _lines(caplog, logging.WARNING, "lost its connection") == 1
        proxy.start()
        await wait_until_async(
            lambda: _lines(caplog, logging.INFO, "reconnected after") == 1, 20, "recovery"
        )
        proxy.stop()  # a second outage gets its own warning
        await wait_until_async(
            lambda: _lines(caplog, logging.WARNING, "lost its connection") == 2, 20, "the 2nd"
        )
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        proxy.stop()
        factory.release(url.render_as_string(hide_password=False))
