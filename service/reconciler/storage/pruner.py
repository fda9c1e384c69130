"""One prune run: batches of ``storage.retention`` in transactions of their own, under the
sweep's lease, until nothing is left to remove or the run's time is up.

The background sweep (``engine.retention``) and ``reconciler db prune`` both run this;
so at most one of them prunes at a time across replicas, and a run killed between two
batches leaves whole operations only (each batch commits alone) and a lease that lapses.

How a transaction is run is the caller's (``transact``): the command opens its own, the
sweep queues each batch behind the service's other writes (``Database.run_write``), so
that on SQLite, whose one write lock is not handed out in turn, a webhook's write waits
for at most one batch, never for a whole run of them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar, cast

from sqlalchemy.engine import Connection

from reconciler.core.errors import Conflict
from reconciler.core.retention import Cutoffs
from reconciler.storage import retention
from reconciler.storage.database import Database
from reconciler.storage.retention import Removed

T = TypeVar("T")

PRUNED_TABLES = (
    "operations",
    "history",
    "operation_payloads",
    "completion_steps",
    "escalations",
    "webhook_verdicts",
    "webhook_events",
    "tombstones",
)
# Two pruners that read one log head: the loser's batch is rolled back and taken again.
CONFLICT_ATTEMPTS = 5
# Runs one write transaction: hands ``fn`` a connection in one and returns its result.
Transact = Callable[[Callable[[Connection], T]], T]


class LeaseHeld(Exception):
    """Another replica (or command) holds the sweep's lease now."""

    def __init__(self, owner: str, until: datetime) -> None:
        super().__init__(f"a retention sweep by {owner} holds the lease until {until:%H:%M:%S}Z")
        self.owner = owner
        self.until = until


@dataclass
class Pruner:
    db: Database
    now: Callable[[], datetime]
    owner: str
    key: bytes | None
    batch_size: int = 100
    lease_seconds: float = 30.0
    max_seconds: float | None = None  # a run stops after this long (the sweep's turn)
    on_batch: Callable[[Removed], None] | None = None
    transact: Transact[Any] | None = None  # default: a transaction of ``db`` opened here
    # After each batch, a pause this many times as long as the batch took: the sweep shares
    # its process (and the GIL, and on SQLite the one write lock) with live work.
    pause_ratio: float = 0.0

    def _in_transaction(self, fn: Callable[[Connection], T]) -> T:
        if self.transact is not None:
            return cast(T, self.transact(fn))
        with self.db.write() as conn:
            return fn(conn)

    def run(self, cutoffs: Cutoffs) -> Removed:
        """Prune everything the cutoffs allow (within ``max_seconds``); raise ``LeaseHeld``
        when another holds the lease."""
        self._take_lease()
        started = renewed = batch_started = time.monotonic()
        total = Removed()
        try:
            for batch in self._batches(cutoffs):
                if self.pause_ratio:
                    time.sleep((time.monotonic() - batch_started) * self.pause_ratio)
                total.merge(batch)
                if self.on_batch is not None:
                    self.on_batch(batch)
                if self.max_seconds is not None and time.monotonic() - started > self.max_seconds:
                    break
                # Renewed once half of it is spent, not per batch: a transaction of its own
                # per batch cost a tenth of the sweep's speed (bench/retention.py).
                if time.monotonic() - renewed > self.lease_seconds / 2:
                    self._take_lease()
                    renewed = time.monotonic()
                batch_started = time.monotonic()
        finally:
            self._in_transaction(
                lambda conn: retention.give_back(conn, retention.SWEEP_LEASE, self.owner)
            )
        return total

    def _take_lease(self) -> None:
        now = self.now()
        until = now + timedelta(seconds=self.lease_seconds)

        def take(conn: Connection) -> tuple[str, datetime] | None:
            if retention.take_lease(conn, retention.SWEEP_LEASE, self.owner, now, until):
                return None
            return retention.lease_holder(conn, retention.SWEEP_LEASE) or ("another", until)

        held = self._in_transaction(take)
        if held is not None:
            raise LeaseHeld(*held)

    def _batches(self, cutoffs: Cutoffs) -> Iterator[Removed]:
        if cutoffs.operations is not None:
            while (batch := self._operations(cutoffs.operations)).operations:
                yield batch
        events = cutoffs.events
        if events is not None:
            with self.db.read() as conn:
                providers = retention.event_providers(conn)
            for provider in providers:

                def expire(conn: Connection, provider: str = provider) -> int:
                    assert events is not None
                    return retention.expire_events(conn, provider, events, self.batch_size)

                while count := self._write(expire):
                    yield Removed({"webhook_events": count})
        tombstones = cutoffs.tombstones
        if tombstones is not None:

            def lapse(conn: Connection) -> int:
                assert tombstones is not None
                return retention.expire_tombstones(conn, tombstones, self.batch_size)

            while count := self._write(lapse):
                yield Removed({"tombstones": count})

    def _operations(self, cutoff: datetime) -> Removed:
        def batch(conn: Connection) -> Removed:
            return retention.prune_batch(
                conn, cutoff, self.now(), self.batch_size, f"retention:{self.owner}", self.key
            )

        return self._write(batch)

    def _write(self, fn: Callable[[Connection], T]) -> T:
        for attempt in range(CONFLICT_ATTEMPTS):
            try:
                return self._in_transaction(fn)
            except Conflict:
                if attempt == CONFLICT_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")


def dry_run(db: Database, cutoffs: Cutoffs) -> Removed:
    """What a run with these cutoffs would remove now, counted, nothing deleted."""
    out = Removed()
    with db.read() as conn:
        if cutoffs.operations is not None:
            out.merge(retention.count_finished(conn, cutoffs.operations))
        if cutoffs.events is not None:
            for provider in retention.event_providers(conn):
                out.add(
                    "webhook_events",
                    retention.count_expired_events(conn, provider, cutoffs.events),
                )
        if cutoffs.tombstones is not None:
            out.add("tombstones", retention.count_expired_tombstones(conn, cutoffs.tombstones))
    return out
