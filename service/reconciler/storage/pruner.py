"""A prune: batches of ``storage.retention``, each in a transaction of its own, under the
sweep's lease, until nothing is left to remove or the turn's time is up.

The background sweep (``engine.retention``, on the event loop, each batch queued with the
service's own writes) and ``reconciler db prune`` (``Pruner.run``, here) drive the same
pieces: ``steps`` lists the kinds of batch, and each step is run again until it removes
nothing. At most one prune runs at a time across replicas, and a run killed between two
batches leaves whole operations only (each batch commits alone) and a lease that lapses.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TypeVar

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
# One kind of batch: removes up to a batch of rows in the caller's transaction.
Step = Callable[[Connection], Removed]


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

    # --- the pieces (each a whole write transaction, to run wherever the caller writes) ---

    def take_lease(self) -> None:
        """Take or renew the lease; ``LeaseHeld`` when another holds it."""
        now = self.now()
        until = now + timedelta(seconds=self.lease_seconds)
        with self.db.write() as conn:
            if retention.take_lease(conn, retention.SWEEP_LEASE, self.owner, now, until):
                return
            held = retention.lease_holder(conn, retention.SWEEP_LEASE) or ("another", until)
        raise LeaseHeld(*held)

    def give_back(self) -> None:
        with self.db.write() as conn:
            retention.give_back(conn, retention.SWEEP_LEASE, self.owner)

    def providers(self) -> list[str]:
        """The providers with webhook events (their expiry is a step each)."""
        with self.db.read() as conn:
            return retention.event_providers(conn)

    def steps(self, cutoffs: Cutoffs, providers: Sequence[str]) -> list[Step]:
        """The kinds of batch the cutoffs call for, finished operations first."""
        found: list[Step] = []
        operations, events, tombstones = cutoffs.operations, cutoffs.events, cutoffs.tombstones
        actor = f"retention:{self.owner}"
        if operations is not None:
            found.append(
                lambda conn: retention.prune_batch(
                    conn, operations, self.now(), self.batch_size, actor, self.key
                )
            )
        if events is not None:
            for provider in providers:
                found.append(self._events_of(provider, events))
        if tombstones is not None:
            found.append(
                lambda conn: Removed(
                    {
                        "tombstones": retention.expire_tombstones(
                            conn, tombstones, self.batch_size, self.now(), actor, self.key
                        )
                    }
                )
            )
        return found

    def _events_of(self, provider: str, before: datetime) -> Step:
        def expire(conn: Connection) -> Removed:
            count = retention.expire_events(conn, provider, before, self.batch_size)
            return Removed({"webhook_events": count})

        return expire

    def batch(self, step: Step) -> Removed:
        """One batch of ``step`` in a transaction of its own (taken again after a collision
        with another pruner on the retention log)."""
        for attempt in range(CONFLICT_ATTEMPTS):
            try:
                with self.db.write() as conn:
                    return step(conn)
            except Conflict:
                if attempt == CONFLICT_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

    # --- a whole run, here and now (``reconciler db prune``) -------------------------------

    def run(self, cutoffs: Cutoffs) -> Removed:
        """Prune everything the cutoffs allow, flat out; ``LeaseHeld`` when another holds
        the lease."""
        self.take_lease()
        total = Removed()
        try:
            renewed = self.now()
            providers = self.providers() if cutoffs.events is not None else []
            for step in self.steps(cutoffs, providers):
                while (batch := self.batch(step)).removed:
                    total.merge(batch)
                    # Renewed once half of it is spent, not per batch: a transaction of its
                    # own per batch cost a tenth of the sweep's speed (bench/retention.py).
                    if (self.now() - renewed).total_seconds() > self.lease_seconds / 2:
                        self.take_lease()
                        renewed = self.now()
        finally:
            self.give_back()
        return total


def dry_run(db: Database, cutoffs: Cutoffs) -> Removed:
    """What a run with these cutoffs would remove now, counted, nothing deleted."""
    out = Removed()
    with db.read() as conn:
        if cutoffs.operations is not None:
            out.merge(retention.count_finished(conn, cutoffs.operations))
        if cutoffs.events is not None:
            for provider in retention.event_providers(conn):
                left = retention.count_expired_events(
                    conn, provider, cutoffs.events, cutoffs.operations
                )
                out.add("webhook_events", left)
        if cutoffs.tombstones is not None:
            out.add("tombstones", retention.count_expired_tombstones(conn, cutoffs.tombstones))
    return out
