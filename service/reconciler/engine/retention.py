"""The retention sweep: an APScheduler job on every replica, pruning on one at a time.

Each run takes the sweep's lease (``storage.pruner``); a replica that finds it held
skips its turn. A run prunes for at most ``SWEEP_TURN_SECONDS`` (then the lease is
given back and the next turn, on any replica, goes on), one batch per transaction, so
a backlog after retention is first switched on drains over several turns and never
holds the database for long.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import anyio.from_thread
import anyio.to_thread
from sqlalchemy.engine import Connection

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
# tenth, to 48 ms, still pruning about 470 operations a second (bench/lag.py --backlog).
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

    def _queued(self, fn: Callable[[Connection], Any]) -> Any:
        """One transaction, queued with the service's other writes (from the run's thread)."""
        db = self.deps.db

        def write() -> Any:
            with db.write() as conn:
                return fn(conn)

        return anyio.from_thread.run(db.run_write, write)

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
            max_seconds=SWEEP_TURN_SECONDS,
            on_batch=lambda batch: rt.metrics.pruned(batch.tables),
            transact=self._queued,
            pause_ratio=PAUSE_RATIO,
        )
        try:
            removed = await anyio.to_thread.run_sync(
                pruner.run, cutoffs(self.policy, rt.clock.now())
            )
        except LeaseHeld:
            rt.metrics.retention_sweeps.labels("skipped").inc()
            return Removed()
        except StorageError as exc:
            rt.metrics.retention_sweeps.labels("failed").inc()
            self._outage.failed("retention sweep skipped: %s", explain(exc))
            return Removed()
        self._outage.succeeded()
        rt.metrics.retention_sweeps.labels("pruned" if removed.tables else "idle").inc()
        if removed.tables:
            log.info(
                "retention pruned %s",
                ", ".join(f"{count} {table}" for table, count in sorted(removed.tables.items())),
                extra={"done_until": isoformat(removed.done_until)},
            )
        return removed
