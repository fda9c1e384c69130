"""A tick still running when the service stops ends quietly.

The loop cancels what is still running at a stop; APScheduler logs a cancelled
coroutine job as a job that raised, with its traceback, which an operator reads as
a crash. The ticker's runs end without one once the scheduler is shut down, and a
cancellation while it runs is still passed on.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from reconciler.engine.ticker import Scheduler


class BlockingWorker:
    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def tick(self) -> int:
        self.entered.set()
        await self.release.wait()
        return 1


def _running_job_tasks(before: set[asyncio.Task[Any]]) -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if t not in before and not t.done()]


def test_a_tick_cancelled_by_the_stop_logs_no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    asyncio.run(_stop_while_a_tick_runs(caplog))


async def _stop_while_a_tick_runs(caplog: pytest.LogCaptureFixture) -> None:
    worker = BlockingWorker()
    before = asyncio.all_tasks()
    scheduler = Scheduler(worker, tick_seconds=60)  # type: ignore[arg-type]
    caplog.set_level(logging.DEBUG)
    scheduler.start()
    await asyncio.wait_for(worker.entered.wait(), 10)
    running = _running_job_tasks(before)
    assert running, "the tick runs as a task of the loop"
    scheduler.shutdown()
    for task in running:
        task.cancel()
    await asyncio.gather(*running, return_exceptions=True)
    await asyncio.sleep(0)  # the executor's done-callback runs on the next turn
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]
    assert not [r for r in caplog.records if "raised an exception" in r.getMessage()]


def test_a_tick_the_stop_cancels_before_it_starts_logs_no_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The run is submitted in the turn of the loop the stop comes in: the shutdown
    cancels it before any code of ours runs, so only the executor can keep it quiet."""
    asyncio.run(_stop_before_the_tick_starts(caplog))


async def _stop_before_the_tick_starts(caplog: pytest.LogCaptureFixture) -> None:
    worker = BlockingWorker()
    scheduler = Scheduler(worker, tick_seconds=60)  # type: ignore[arg-type]
    caplog.set_level(logging.DEBUG)
    scheduler.start()  # the first tick is due now: the scheduler submits it on a later turn
    assert scheduler._scheduler is not None
    executor = scheduler._scheduler._lookup_executor("default")
    submitted: list[asyncio.Future[Any]] = []
    submit = executor._do_submit_job

    def noting(job: Any, run_times: Any) -> None:
        submit(job, run_times)
        submitted.extend(executor._pending_futures)

    executor._do_submit_job = noting
    scheduler.shutdown()  # APScheduler's shutdown, too, runs on a later turn: after the submit
    for _ in range(10):
        await asyncio.sleep(0)
    assert submitted and all(f.cancelled() for f in submitted), "submitted, cancelled unstarted"
    assert not worker.entered.is_set()
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]


def test_a_tick_cancelled_while_the_scheduler_runs_is_passed_on() -> None:
    asyncio.run(_cancel_while_running())


async def _cancel_while_running() -> None:
    worker = BlockingWorker()
    scheduler = Scheduler(worker, tick_seconds=60)  # type: ignore[arg-type]
    scheduler._scheduler = object()  # type: ignore[assignment]  # running, as far as the guard sees
    task = asyncio.ensure_future(scheduler._tick())
    await asyncio.wait_for(worker.entered.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
