"""The retention sweep: an APScheduler job on every replica, pruning on one at a time.

Each turn takes the sweep's lease (``storage.pruner``); a replica that finds it held
skips its turn. A turn prunes for at most ``SWEEP_TURN_SECONDS`` (then the lease is
given back and the next turn, on any replica, goes on), one batch per transaction, so a
backlog after retention is first switched on drains over several turns.

The turn runs on the event loop: each batch is queued with the service's own writes
(``Database.run_write``), so a webhook's write waits for at most one batch, and after
each batch the sweep pauses ``PAUSE_RATIO`` times as long as the batch took. Stopping the
service cancels the turn between two batches; the lease then lapses.
"""

from __future__ import annotations

import asyncio
import logging

from reconciler.core.clock import isoformat
from reconciler.core.errors import StorageError
from reconciler.core.retention import RetentionPolicy, cutoffs
from reconciler.engine.deps import EngineDeps
from reconciler.logs import OutageLog
from reconciler.storage.availability import explain
from reconciler.storage.pruner import LeaseHeld, Pruner
from reconciler.storage.retention import Removed

log = logging.getLogger("reconciler.engine.retention")

SWEEP_TURN_SECONDS = 10.0
# The sweep works at most a tenth of the time (a pause of nine times each batch's
# length): it shares the process, the GIL and, on SQLite, the one write lock and the WAL
# with live work. Draining a 200,000-operation backlog flat out took the SQLite service's
# hint-to-completion p99 from 11.8 ms to 506 ms; at a quarter of the time, to 88 ms; at a
# tenth, to 29-49 ms, still pruning about 470 operations a second (bench/lag.py --backlog).
# A sweep that keeps up with the day's work prunes a minute's worth a turn, unnoticed.
PAUSE_RATIO = 9.0


class RetentionSweep:
    def __init__(self, deps: EngineDeps) -> None:
        self.deps = deps
        settings = deps.settings.retention
        self.policy = RetentionPolicy.of_days(
            settings.operations_days, settings.events_days, settings.tombstones_days
        )
        self._outage = OutageLog(log, "retention sweep", deps.clock.monotonic)

    @property
    def enabled(self) -> bool:
        return not self.policy.keeps_everything

    async def sweep(self) -> Removed:
        """One turn: prune what the windows allow now, unless another replica is at it."""
        rt = self.deps
        pruner = Pruner(
            rt.db,
            rt.clock.now,
            rt.worker_id,
            rt.journal.key,
            batch_size=rt.settings.retention.batch_size,
            lease_seconds=rt.settings.scheduler.lease_seconds,
        )
        try:
            await rt.db.run_write(pruner.take_lease)
        except LeaseHeld:
            rt.metrics.retention_sweeps.labels("skipped").inc()
            return Removed()
        except StorageError as exc:
            return self._failed(exc)
        try:
            removed = await self._turn(pruner)
            await rt.db.run_write(pruner.give_back)
        except (LeaseHeld, StorageError) as exc:
            return self._failed(exc)
        self._outage.succeeded()
        rt.metrics.retention_sweeps.labels("pruned" if removed.removed else "idle").inc()
        if removed.removed:
            log.info(
                "retention pruned %s",
                ", ".join(f"{count} {table}" for table, count in sorted(removed.tables.items())),
                extra={"done_until": isoformat(removed.done_until)},
            )
        return removed

    async def _turn(self, pruner: Pruner) -> Removed:
        rt = self.deps
        clock = rt.clock.monotonic
        started = renewed = clock()
        total = Removed()
        limits = cutoffs(self.policy, rt.clock.now())
        providers = await rt.db.run(pruner.providers) if limits.events is not None else []
        for step in pruner.steps(limits, providers):
            while True:
                began = clock()
                batch = await rt.db.run_write(pruner.batch, step)
                if not batch.removed:
                    break
                total.merge(batch)
                rt.metrics.pruned(batch.tables)
                await asyncio.sleep((clock() - began) * PAUSE_RATIO)
                if clock() - started > SWEEP_TURN_SECONDS:
                    return total
                # Renewed once half of it is spent, not per batch (bench/retention.py).
                if clock() - renewed > pruner.lease_seconds / 2:
                    await rt.db.run_write(pruner.take_lease)
                    renewed = clock()
        return total

    def _failed(self, exc: Exception) -> Removed:
        self.deps.metrics.retention_sweeps.labels("failed").inc()
        if isinstance(exc, LeaseHeld):
            log.warning("retention sweep stopped: %s", exc)
        else:
            self._outage.failed("retention sweep skipped: %s", explain(exc))
        return Removed()
