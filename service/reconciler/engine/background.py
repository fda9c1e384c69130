"""The background half of a replica: flows, worker, scheduler and the notification listener."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta

from reconciler.engine.context import StepContext
from reconciler.engine.create_start import CreateStarts
from reconciler.engine.deps import EngineDeps
from reconciler.engine.hooks import load_hooks
from reconciler.engine.retention import RetentionSweep
from reconciler.engine.step_table import Steps
from reconciler.engine.steps.cancel import CancelStep
from reconciler.engine.steps.collect import CollectStep
from reconciler.engine.steps.complete import CompleteStep
from reconciler.engine.steps.create import CreateStep
from reconciler.engine.steps.poll import PollStep
from reconciler.engine.ticker import Scheduler
from reconciler.engine.trust import TrustKeeper
from reconciler.engine.worker import Worker
from reconciler.outbound.callbacks import CallbackClient

log = logging.getLogger("reconciler.engine.background")


class Background:
    def __init__(self, deps: EngineDeps, *, run_scheduler: bool = True) -> None:
        self.deps = deps
        self.ctx = StepContext(deps)
        settings = deps.settings
        hooks = load_hooks(settings.hooks, settings.source)
        self.callbacks = (
            CallbackClient(
                signing_key=deps.callback_key,
                allow_hosts=settings.callbacks.allow_hosts,
                clock=deps.clock,
                timeout_seconds=settings.callbacks.timeout_seconds,
                max_response_bytes=settings.callbacks.max_response_bytes,
                tracing=deps.tracing,
            )
            if deps.callback_key is not None
            else None
        )
        create = CreateStep(self.ctx)
        steps = Steps(
            create=create,
            poll=PollStep(self.ctx),
            cancel=CancelStep(self.ctx),
            collect=CollectStep(self.ctx),
            complete=CompleteStep(self.ctx, hooks, self.callbacks),
        )
        self.worker = Worker(self.ctx, steps, on_next_due=self._next_due)
        # Creates stored here start here (the app hands this to its doors while it runs
        # the scheduler; a test driving the ticks itself keeps every start to a claim).
        self.create_starts = CreateStarts(self.worker, create, settings.scheduler.lease_seconds)
        self.trust = TrustKeeper(self.ctx)
        self.retention = RetentionSweep(deps)
        self.scheduler = Scheduler(
            self.worker,
            settings.scheduler.tick_seconds,
            trust_sweep=self.trust.sweep,
            retention_sweep=self.retention.sweep if self.retention.enabled else None,
            retention_seconds=settings.retention.sweep_seconds,
        )
        self.run_scheduler = run_scheduler and settings.scheduler.enabled
        deps.notifier.on_wake(self._wake)

    def _wake(self) -> None:
        if self.run_scheduler:
            self.scheduler.wake()

    def _next_due(self, when: datetime) -> None:
        # Due times are in the service's clock; the scheduler runs on the wall clock.
        delay = (when - self.deps.clock.now()).total_seconds()
        self.scheduler.wake_at(datetime.now(tz=when.tzinfo) + timedelta(seconds=max(0.0, delay)))

    async def start(self) -> None:
        rt = self.deps
        rt.notifier.bind(asyncio.get_running_loop())
        if not rt.db.sqlite:
            rt.notifier.start_listener(rt.db.url, rt.db.is_own_backend)
        if self.run_scheduler:
            self.scheduler.start()

    async def stop(self) -> None:
        self.scheduler.shutdown()
        await self.worker.drain()
        await self.deps.notifier.stop()
        if self.callbacks is not None:
            await self.callbacks.aclose()
