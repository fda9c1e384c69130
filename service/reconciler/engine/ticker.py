"""The APScheduler 3.x loop that tells the worker when to look.

One interval job ticks every ``tick_seconds`` (a second keeps webhook trust, see
``engine.trust``); a wake-up (a webhook hint, a
new operation, a finished step that knows its next due time) moves that
job's next run forward instead of adding jobs, so bursts of wake-ups
coalesce into one tick.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from apscheduler.executors.asyncio import AsyncIOExecutor
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from reconciler.engine.worker import Worker

log = logging.getLogger("reconciler.engine.ticker")

JOB_ID = "reconciler-tick"
TRUST_JOB_ID = "reconciler-webhook-trust"
RETENTION_JOB_ID = "reconciler-retention"
# Wake-ups closer together than this are merged; it bounds tick rate under hint floods.
MIN_GAP = timedelta(milliseconds=2)
# A planned run that has not started this long after its time may have been skipped (all
# instances busy): ask the scheduler again rather than trust it.
TRUST_PLANNED = timedelta(milliseconds=50)


class StopQuietExecutor(AsyncIOExecutor):  # type: ignore[misc]
    """APScheduler's asyncio executor, which takes a cancelled run for the end of a stop.

    APScheduler shuts down on a later turn of the loop than the stop asks it to; a run it
    submits in between is cancelled by that shutdown before it starts, so no handler of
    ours sees it. The stock executor logged that as a job that raised, with a traceback
    an operator reads as a crash. Nothing else cancels a run (``Scheduler._unless_stopped``
    passes on any cancellation while the scheduler runs, which lands here too).
    """

    def _run_job_error(self, job_id: str, exc: BaseException, traceback: Any = None) -> None:
        if isinstance(exc, asyncio.CancelledError):
            log.debug("a scheduled run of %s was cancelled by the stop", job_id)
            self._run_job_success(job_id, [])  # the count of running instances, no event
            return
        super()._run_job_error(job_id, exc, traceback)


class OneAtATime:
    """A job's runs, one at a time: a run due while the last one still goes returns at once
    (``overlapped`` counts them). APScheduler's own guard (``max_instances=1``) logged a
    warning for each, though a sweep turn that outlasts its interval is nothing wrong."""

    def __init__(self, run: Callable[[], Awaitable[Any]]) -> None:
        self._run = run
        self._running = False
        self.overlapped = 0

    async def run(self) -> Any:
        if self._running:
            self.overlapped += 1
            return None
        self._running = True
        try:
            return await self._run()
        finally:
            self._running = False


def one_at_a_time(
    scheduler: AsyncIOScheduler, run: Callable[[], Awaitable[Any]], seconds: float, job_id: str
) -> OneAtATime:
    """An interval job that never overlaps itself and runs once after a missed stretch."""
    guarded = OneAtATime(run)
    scheduler.add_job(
        guarded.run,  # a coroutine function: the scheduler awaits it on the loop
        "interval",
        seconds=seconds,
        id=job_id,
        max_instances=2,  # the second returns at once: see OneAtATime
        coalesce=True,
        misfire_grace_time=None,
    )
    return guarded


class Scheduler:
    def __init__(
        self,
        worker: Worker,
        tick_seconds: float,
        trust_sweep: Callable[[], Awaitable[Any]] | None = None,
        retention_sweep: Callable[[], Awaitable[Any]] | None = None,
        retention_seconds: float = 60.0,
    ) -> None:
        self.worker = worker
        self.tick_seconds = tick_seconds
        self.trust_sweep = trust_sweep
        self.retention_sweep = retention_sweep
        self.retention_seconds = retention_seconds
        self._scheduler: AsyncIOScheduler | None = None
        # The latest moment the tick job will run next, as far as this object moved it: a
        # wake-up before then needs no call into the scheduler (thousands come per second).
        self._planned: datetime | None = None

    async def _tick(self) -> int:
        # The interval job's next run is at most one interval from this one.
        self._planned = datetime.now(UTC) + timedelta(seconds=self.tick_seconds)
        result = await self._unless_stopped(self.worker.tick)
        return 0 if result is None else int(result)

    async def _sweep(self) -> Any:
        assert self.trust_sweep is not None
        return await self._unless_stopped(self.trust_sweep)

    async def _prune(self) -> Any:
        assert self.retention_sweep is not None
        return await self._unless_stopped(self.retention_sweep)

    async def _unless_stopped(self, run: Callable[[], Awaitable[Any]]) -> Any:
        try:
            return await run()
        except asyncio.CancelledError:
            if self._scheduler is not None:
                raise
            # A run still going when the service stops is cancelled with the loop; the
            # scheduler would log that as a job's traceback, though nothing went wrong
            # (the worker's writes are transactions: the next start takes over).
            log.debug("a scheduled run was cancelled by the stop")
            return None

    def start(self) -> None:
        scheduler = AsyncIOScheduler(timezone=UTC, executors={"default": StopQuietExecutor()})
        scheduler.add_job(
            self._tick,
            "interval",
            seconds=self.tick_seconds,
            id=JOB_ID,
            max_instances=4,  # tick() guards itself; overlapping calls only set a flag
            coalesce=True,
            misfire_grace_time=None,
            next_run_time=datetime.now(UTC),
        )
        if self.trust_sweep is not None:
            # Webhook trust is kept on the same cadence: pending completions are judged
            # within a tick of their grace ending, and an outage's stretched waits are
            # withdrawn within a tick of the miss.
            one_at_a_time(scheduler, self._sweep, self.tick_seconds, TRUST_JOB_ID)
        if self.retention_sweep is not None:
            # One turn at a time per replica; replicas take turns through the sweep's lease.
            one_at_a_time(scheduler, self._prune, self.retention_seconds, RETENTION_JOB_ID)
        scheduler.start()
        self._scheduler = scheduler

    def wake(self) -> None:
        """Run a tick now."""
        self.wake_at(datetime.now(UTC))

    def wake_at(self, when: datetime) -> None:
        """Make sure a tick runs no later than ``when`` (real time)."""
        scheduler = self._scheduler
        if scheduler is None or not scheduler.running:
            return
        now = datetime.now(UTC)
        when = max(when, now)
        planned = self._planned
        if planned is not None and planned <= when + MIN_GAP and now <= planned + TRUST_PLANNED:
            return  # a run is due by then already
        job = scheduler.get_job(JOB_ID)
        if job is None:
            return
        current = job.next_run_time
        if current is not None and current <= when + MIN_GAP:
            self._planned = current
            return
        job.modify(next_run_time=when)
        self._planned = when

    def shutdown(self) -> None:
        if self._scheduler is not None and self._scheduler.running:
            self._scheduler.shutdown(wait=False)
        self._scheduler = None
