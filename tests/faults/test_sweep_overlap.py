"""A sweep turn that outlasts its interval is nothing wrong: the run due meanwhile returns
at once, and nothing is logged. APScheduler's own guard logged "skipped: maximum number
of running instances reached" as a warning each time."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC

import pytest
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from reconciler.engine.ticker import one_at_a_time
from tests.support.waiting import wait_until_async

pytestmark = pytest.mark.anyio


async def test_a_turn_still_running_when_the_next_is_due_logs_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = asyncio.Event()
    turns: list[int] = []

    async def turn() -> None:
        turns.append(1)
        await release.wait()

    scheduler = AsyncIOScheduler(timezone=UTC)
    guarded = one_at_a_time(scheduler, turn, 0.02, "turn")
    with caplog.at_level(logging.INFO, logger="apscheduler"):
        scheduler.start()
        try:
            await wait_until_async(lambda: guarded.overlapped >= 3, 30, "three runs due meanwhile")
        finally:
            release.set()
            scheduler.shutdown(wait=False)
    assert turns == [1]
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not warnings, [r.getMessage() for r in warnings]
