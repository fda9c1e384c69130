"""Group commit for webhook deliveries: many requests, one transaction, each answered after it.

Guarantee: a provider gets 2xx only after its event is committed. Requests that
arrive while a commit is running share the next one: one writer takes everything
queued, writes it in one transaction (``storage.webhook_events.write_batch``; on
SQLite the transaction may carry other joined writes too, ``storage.writer``) and
resolves every waiting request at once. That keeps the per-request cost to an
enqueue, instead of a thread hop and a commit per request. The batch is written
on the database's writer (``storage.writer``), never on the event loop: a lock
held by another process then stalls only the writes, and each request waits at
most the write bound before it is answered 503 with ``Retry-After`` (nothing
acknowledged is lost: the provider delivers again, and the event id dedupes).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.engine import Connection

from reconciler.core.errors import ReconcilerError, StorageUnavailable
from reconciler.logs import OutageLog
from reconciler.storage.availability import explain
from reconciler.storage.database import Database
from reconciler.storage.journal import Journal
from reconciler.storage.webhook_events import IncomingEvent, Outcome, write_batch

log = logging.getLogger("reconciler.engine.group_commit")

MAX_BATCH = 512
# Loop turns the writer waits before taking a batch: requests whose bytes arrived in the
# same poll are still being parsed, and joining this commit is cheaper than starting the
# next (fewer, fuller batches; measured about 15 % more deliveries a second at 16 clients).
JOIN_TURNS = 4


@dataclass
class _Pending:
    event: IncomingEvent
    future: asyncio.Future[Outcome]


def _late(future: asyncio.Future[Outcome], bound: float) -> None:
    if not future.done():  # not yet written: the next batch leaves it out
        future.set_exception(
            StorageUnavailable(
                f"the event could not be stored within {bound:g} s; deliver it again later"
            )
        )


class GroupCommitter:
    """Queues events from many requests and commits them together on one writer thread."""

    def __init__(
        self,
        db: Database,
        journal: Journal,
        now: Callable[[], datetime],
        on_hint: Callable[[], None],
        *,
        wait_seconds: float | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.db = db
        # The longest a delivery waits for its commit (``server.webhook_wait_seconds``).
        self.wait_seconds = wait_seconds
        self.journal = journal
        self.now = now
        self.on_hint = on_hint
        self._queue: list[_Pending] = []
        self._flushing = False
        self._flusher: asyncio.Task[None] | None = None
        self.batches = 0
        # Every delivery in an outage fails: said when it starts, each minute, and at its end.
        self._outage = OutageLog(log, "webhook batches", monotonic)

    async def submit(self, event: IncomingEvent) -> Outcome:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Outcome] = loop.create_future()
        self._queue.append(_Pending(event, future))
        if not self._flushing:
            self._flushing = True
            self._flusher = loop.create_task(self._flush())
        bound = min(self.db.write_wait_seconds, self.wait_seconds or self.db.write_wait_seconds)
        # A timer on the loop, not wait_for(shield()): those two cost ~6 % of the CPU of
        # an ingested event. Past the bound the future fails; a batch leaves a done one out.
        timer = loop.call_later(bound, _late, future, bound)
        try:
            return await future
        finally:
            timer.cancel()

    async def _flush(self) -> None:
        try:
            for _ in range(JOIN_TURNS):
                await asyncio.sleep(0)
            while self._queue:
                batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
                batch = [p for p in batch if not p.future.done()]
                if not batch:
                    continue
                try:
                    outcomes = await self._written(batch)
                except Exception as exc:
                    self._fail(batch, exc)
                    continue
                self._outage.succeeded()
                hinted = False
                for pending, outcome in zip(batch, outcomes, strict=True):
                    if isinstance(outcome, Exception):
                        if not pending.future.done():
                            pending.future.set_exception(outcome)
                        continue
                    hinted = hinted or outcome is Outcome.HINTED
                    if not pending.future.done():
                        pending.future.set_result(outcome)
                if hinted:
                    self.on_hint()
                # Let the requests that arrived during the write in, so they share the next.
                await asyncio.sleep(0)
        finally:
            self._flushing = False

    def _fail(self, batch: list[_Pending], exc: Exception) -> None:
        if isinstance(exc, StorageUnavailable):
            # Expected of a database (locked, down, full): each sender is told to retry.
            self._outage.failed(
                "webhook batch of %d not stored (%s); answered 503 with Retry-After",
                len(batch),
                explain(exc),
            )
        else:
            log.error("webhook batch failed: %s", type(exc).__name__)
        error = (
            exc
            if isinstance(exc, ReconcilerError)
            else StorageUnavailable("the event could not be stored; retry later")
        )
        for pending in batch:
            if not pending.future.done():
                pending.future.set_exception(error)

    def _write(self, conn: Connection, batch: list[_Pending]) -> list[Outcome]:
        self.batches += 1
        return list(write_batch(conn, self.journal, [p.event for p in batch], self.now()))

    async def _written(self, batch: list[_Pending]) -> list[Outcome | Exception]:
        """The batch's outcomes; a batch that fails for one bad event is stored one by one
        (each its own write, which the writer may still join into one transaction)."""
        try:
            return list(await self.db.run_joined(self._write, batch, first=True))
        except StorageUnavailable:
            raise  # the database, not an event: every sender is told to retry
        except Exception as exc:
            if len(batch) == 1:
                return [exc]
            log.warning(
                "webhook batch of %d failed (%s); storing one by one",
                len(batch),
                type(exc).__name__,
            )
        # One bad event must not cost the others their commit.
        alone = await asyncio.gather(
            *(self.db.run_joined(self._write, [p], first=True) for p in batch),
            return_exceptions=True,
        )
        results: list[Outcome | Exception] = []
        for outcome in alone:
            if isinstance(outcome, BaseException) and not isinstance(outcome, Exception):
                raise outcome  # a cancellation is not an event's outcome
            results.extend([outcome] if isinstance(outcome, Exception) else outcome)
        return results

    def close(self) -> None:
        """Nothing to release: the batches ran on the database's writer."""
