"""Storing verified webhook events with their effect, many requests per commit.

Each request is answered only after *its* event is committed, but requests
that arrive while a commit is running share the next one (group commit):
one writer thread takes everything queued, writes it in one transaction and
resolves every waiting request at once. That keeps the per-request cost to
an enqueue and one shared hop back to the event loop, instead of a thread
hop and an fsync per request.

In the transaction, for each event: insert it (unique on provider + event
id); a new event for a known job marks the operation hinted (hinted time,
next status read brought forward, delay source ``webhook_hint``, a history
entry); an event for an unknown job is kept as an orphan; a seen event id
has no effect (a different body under a seen id is counted as a conflict).
A webhook never completes an operation: it only says when to look.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from reconciler.db import Database
from reconciler.errors import ReconcilerError, StorageUnavailable
from reconciler.journal import OPS, Entry, Journal
from reconciler.models import Operation, WebhookEvent
from reconciler.notify import WAKE_CHANNEL, notify_in_transaction
from reconciler.states import State
from reconciler.vocabulary import DelaySource, HistoryKind

log = logging.getLogger("reconciler.webhooks")

EVENTS = WebhookEvent.__table__  # type: ignore[attr-defined]
MAX_BATCH = 512
ATTACH = (
    sa.update(EVENTS)
    .where(
        EVENTS.c.provider == sa.bindparam("b_provider"),
        EVENTS.c.event_id == sa.bindparam("b_event"),
    )
    .values(operation_id=sa.bindparam("b_op"))
)
# States whose next status read a hint brings forward.
HINT_POLLS = frozenset({State.OBSERVING, State.CANCELLING})
HINT_NOTES = frozenset({State.ACCEPTED, State.CANCEL_REQUESTED, State.RESULT_COLLECTING})


class Outcome(StrEnum):
    HINTED = "hinted"
    ORPHAN = "orphan"
    RECORDED = "recorded"  # new event for an operation with nothing left to look at
    DUPLICATE = "duplicate"
    CONFLICT = "conflict"


@dataclass(frozen=True)
class IncomingEvent:
    provider: str
    event_id: str
    remote_job_id: str | None
    body_sha256: str
    body: str | None
    received_at: datetime


def _insert(conn: Connection, rows: list[dict[str, Any]]) -> set[tuple[str, str]]:
    """Insert what is new; the unique key decides, and only inserted rows come back."""
    result = conn.execute(_INSERTS[conn.dialect.name], rows)
    return {(r.provider, r.event_id) for r in result}


# Built once: compiling a fresh multi-row INSERT per batch costs more than the insert.
_INSERTS = {
    name: dialect.insert(EVENTS)
    .on_conflict_do_nothing(index_elements=["provider", "event_id"])
    .returning(EVENTS.c.provider, EVENTS.c.event_id)
    for name, dialect in (("postgresql", postgresql), ("sqlite", sqlite))
}


def _record_repeats(conn: Connection, repeats: list[IncomingEvent]) -> dict[int, Outcome]:
    out: dict[int, Outcome] = {}
    for index, event in enumerate(repeats):
        stored = conn.execute(
            sa.select(EVENTS.c.body_sha256).where(
                EVENTS.c.provider == event.provider, EVENTS.c.event_id == event.event_id
            )
        ).scalar()
        conflict = stored is not None and stored != event.body_sha256
        column = EVENTS.c.conflicts if conflict else EVENTS.c.duplicates
        conn.execute(
            sa.update(EVENTS)
            .where(EVENTS.c.provider == event.provider, EVENTS.c.event_id == event.event_id)
            .values({column.name: column + 1})
        )
        out[index] = Outcome.CONFLICT if conflict else Outcome.DUPLICATE
    return out


# One statement for the whole batch; the sorted subquery fixes the order the locks are taken in.
_LOCK_JOBS = sa.text(
    "SELECT count(pg_advisory_xact_lock(hashtextextended(k, 0))) "
    "FROM (SELECT unnest(CAST(:keys AS text[])) AS k ORDER BY 1) AS jobs"
)


def lock_jobs(conn: Connection, jobs: Iterable[tuple[str, str]]) -> None:
    """Take this transaction's per-job lock for each ``(provider, job id)`` (PostgreSQL).

    Storing a job's events and learning its id (attaching orphans) hold the same lock, so
    one always sees the other's commit; otherwise an event committed alongside the create
    answer is missed by both and stays an orphan. SQLite serialises all writes already.
    """
    keys = sorted({f"{provider}\x1f{job}" for provider, job in jobs})
    if keys and conn.dialect.name == "postgresql":
        conn.execute(_LOCK_JOBS, {"keys": keys})


def _operations_for(conn: Connection, provider: str, job_ids: set[str]) -> list[Operation]:
    query = sa.select(*HEAD_COLUMNS).where(
        OPS.c.provider == provider, OPS.c.remote_job_id.in_(job_ids)
    )
    if conn.dialect.name == "postgresql":
        # Lock the rows so the version we read is the one we update (no StaleWrite mid-batch).
        query = query.with_for_update()
    return [cast(Operation, _Head(**r)) for r in conn.execute(query).mappings()]


@dataclass(slots=True)
class _Head:
    """Just what a hint needs of an operation row (reading whole rows costs more)."""

    id: str
    provider: str
    remote_job_id: str
    state: str
    version: int
    history_head: str
    history_seq: int
    next_poll_at: datetime | None
    retry_not_before: datetime | None


HEAD_COLUMNS = [OPS.c[f.name] for f in dataclasses.fields(_Head)]


def _hinted_read(op: Operation, now: datetime) -> tuple[datetime, DelaySource]:
    """Bring the next status read forward to now, but never before the provider's Retry-After."""
    floor = op.retry_not_before
    if floor is None or floor <= now:
        return now, DelaySource.WEBHOOK_HINT
    at = floor if op.next_poll_at is None else min(floor, op.next_poll_at)
    return at, DelaySource.PROVIDER_RETRY_AFTER


def _hint(
    op: Operation, events: list[IncomingEvent], now: datetime
) -> tuple[Outcome, Mapping[str, Any] | None, list[Entry]]:
    """What a batch of new events means for one operation (values only; no writes)."""
    state = State(op.state)
    if state not in HINT_POLLS and state not in HINT_NOTES:
        return Outcome.RECORDED, None, []
    polls = state in HINT_POLLS
    # Operations whose read is not due to a hint keep their schedule unchanged.
    at, source = _hinted_read(op, now) if polls else (None, None)
    changes: dict[str, Any] = {
        "hinted_at": now,
        "next_poll_at": at,
        "delay_source": source.value if source is not None else None,
    }
    entries = [
        Entry(
            kind=HistoryKind.HINT,
            actor=f"provider:{op.provider}",
            cause=f"webhook:{event.event_id}",
            detail={"event_id": event.event_id, "body_sha256": event.body_sha256},
            delay_source=source,
            at=event.received_at,
        )
        for event in events
    ]
    return Outcome.HINTED, changes, entries


def _store_new(
    conn: Connection, events: Sequence[IncomingEvent], outcomes: list[Outcome | None]
) -> None:
    """Insert first sightings; mark repeats (inside the batch or already stored)."""
    first: dict[tuple[str, str], int] = {}
    for index, event in enumerate(events):
        first.setdefault((event.provider, event.event_id), index)
    rows = [
        {
            "provider": e.provider,
            "event_id": e.event_id,
            "received_at": e.received_at,
            "remote_job_id": e.remote_job_id,
            "operation_id": None,
            "body_sha256": e.body_sha256,
            "body": e.body,
            "duplicates": 0,
            "conflicts": 0,
        }
        for i, e in enumerate(events)
        if first[(e.provider, e.event_id)] == i
    ]
    inserted = _insert(conn, rows) if rows else set()
    repeats = [
        i
        for i, e in enumerate(events)
        if first[(e.provider, e.event_id)] != i or (e.provider, e.event_id) not in inserted
    ]
    for index, outcome in _record_repeats(conn, [events[i] for i in repeats]).items():
        outcomes[repeats[index]] = outcome


def _by_job(
    events: Sequence[IncomingEvent], outcomes: list[Outcome | None]
) -> dict[tuple[str, str], list[int]]:
    """New events grouped by (provider, job id); new events without a job id are orphans."""
    by_job: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, event in enumerate(events):
        if outcomes[i] is not None:
            continue
        if event.remote_job_id is None:
            outcomes[i] = Outcome.ORPHAN
        else:
            by_job[(event.provider, event.remote_job_id)].append(i)
    return by_job


def _apply_hints(
    conn: Connection,
    journal: Journal,
    events: Sequence[IncomingEvent],
    outcomes: list[Outcome | None],
    now: datetime,
) -> bool:
    """Hint the operations that new events name; the rest are orphans. True if any hint."""
    by_job = _by_job(events, outcomes)
    lock_jobs(conn, by_job)
    by_provider: dict[str, set[str]] = defaultdict(set)
    for provider, job in by_job:
        by_provider[provider].add(job)
    polls: list[tuple[Operation, Mapping[str, Any], Sequence[Entry]]] = []
    notes: list[tuple[Operation, Mapping[str, Any], Sequence[Entry]]] = []
    attach: list[dict[str, Any]] = []
    for provider, jobs in by_provider.items():
        for op in _operations_for(conn, provider, jobs):
            indexes = by_job.pop((provider, op.remote_job_id or ""), [])
            outcome, changes, entries = _hint(op, [events[i] for i in indexes], now)
            if changes is not None and changes["next_poll_at"] is not None:
                polls.append((op, changes, entries))
            elif changes is not None:
                notes.append((op, {"hinted_at": changes["hinted_at"]}, entries))
            for i in indexes:
                outcomes[i] = outcome
                attach.append(
                    {"b_provider": provider, "b_event": events[i].event_id, "b_op": op.id}
                )
    journal.write_many(conn, polls, now=now)
    journal.write_many(conn, notes, now=now)
    if attach:
        conn.execute(ATTACH, attach)
    for indexes in by_job.values():
        for i in indexes:
            outcomes[i] = Outcome.ORPHAN
    return bool(polls or notes)


def write_batch(
    conn: Connection, journal: Journal, events: Sequence[IncomingEvent], now: datetime
) -> list[Outcome]:
    """Store a batch of verified events and their effects; one outcome per event, in order."""
    outcomes: list[Outcome | None] = [None] * len(events)
    _store_new(conn, events, outcomes)
    if _apply_hints(conn, journal, events, outcomes, now):
        notify_in_transaction(conn, WAKE_CHANNEL)
    return [o if o is not None else Outcome.DUPLICATE for o in outcomes]


@dataclass
class _Pending:
    event: IncomingEvent
    future: asyncio.Future[Outcome]


class GroupCommitter:
    """Queues events from many requests and commits them together on one writer thread."""

    def __init__(
        self,
        db: Database,
        journal: Journal,
        now: Callable[[], datetime],
        on_hint: Callable[[], None],
    ) -> None:
        self.db = db
        self.journal = journal
        self.now = now
        self.on_hint = on_hint
        self._queue: list[_Pending] = []
        self._flushing = False
        self._flusher: asyncio.Task[None] | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="webhook-commit")
        self._lock = threading.Lock()
        self.batches = 0

    async def submit(self, event: IncomingEvent) -> Outcome:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Outcome] = loop.create_future()
        self._queue.append(_Pending(event, future))
        if not self._flushing:
            self._flushing = True
            self._flusher = loop.create_task(self._flush(loop))
        return await future

    async def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            while self._queue:
                batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
                try:
                    outcomes = await loop.run_in_executor(self._executor, self._write, batch)
                except Exception as exc:
                    self._fail(batch, exc)
                    continue
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
        finally:
            self._flushing = False

    def _fail(self, batch: list[_Pending], exc: Exception) -> None:
        log.error("webhook batch failed: %s", type(exc).__name__)
        error = (
            exc
            if isinstance(exc, ReconcilerError)
            else StorageUnavailable("the event could not be stored; retry later")
        )
        for pending in batch:
            if not pending.future.done():
                pending.future.set_exception(error)

    def _write(self, batch: list[_Pending]) -> list[Outcome | Exception]:
        events = [p.event for p in batch]
        self.batches += 1
        try:
            with self.db.write() as conn:
                return list(write_batch(conn, self.journal, events, self.now()))
        except Exception as exc:
            if len(events) == 1:
                return [exc]
            log.warning(
                "webhook batch of %d failed (%s); storing one by one",
                len(events),
                type(exc).__name__,
            )
        # One bad event must not cost the others their commit.
        results: list[Outcome | Exception] = []
        for event in events:
            try:
                with self.db.write() as conn:
                    results.extend(write_batch(conn, self.journal, [event], self.now()))
            except Exception as exc:
                results.append(exc)
        return results

    def close(self) -> None:
        self._executor.shutdown(wait=True)
