"""The webhook_events table: verified events stored with their effect, one batch per commit.

Guarantee: a webhook only says when to look. In one transaction, for each event:
insert it (unique on provider + event id); a new event for a known job marks the
operation hinted (hinted time, next status read brought forward, delay source
``webhook_hint``, a history entry); an event for an unknown job is kept as an
orphan, attached when the job id is learned; a seen event id has no effect (a
different body under a seen id is counted as a conflict); an event of a type the
provider file does not list is kept flagged ``ignored`` and changes nothing. Every
event keeps its id, type, job id, the digest and size of its body and at most
``MAX_KEPT_BODY_BYTES`` of the body itself: a provider whose webhooks cover a whole
account sends orphans in normal operation, and they must not grow the database by
whatever size it chooses. Hints coalesce: while one is pending (``hinted_at``
set, its read not yet made), further events for the operation are stored but add
no history entry, and write the row only to move ``hinted_at`` when a read may be
in flight (the lease is held), so its answer is known to predate them; a flood of
signed events costs one entry per read, not one per event. Batching many requests into one commit is
``engine.group_commit``'s job.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from functools import cache
from typing import Any

from sqlalchemy.engine import Connection

from reconciler.core.chain import Entry
from reconciler.core.states import State
from reconciler.core.trust import TrustState
from reconciler.core.vocabulary import DelaySource, HistoryKind
from reconciler.storage.fastsql import AS_IS, Bound, Sql
from reconciler.storage.journal import Journal
from reconciler.storage.notify import WAKE_CHANNEL, notify_in_transaction
from reconciler.storage.tables import EVENTS, OPS
from reconciler.storage.trust import is_trusted

log = logging.getLogger("reconciler.webhooks")

INSERT_CHUNK = 256  # rows per multi-row INSERT: well inside SQLite's parameter limit
# States whose next status read a hint brings forward.
HINT_POLLS = frozenset({State.OBSERVING, State.CANCELLING})
HINT_NOTES = frozenset({State.ACCEPTED, State.CANCEL_REQUESTED, State.RESULT_COLLECTING})


class Outcome(StrEnum):
    HINTED = "hinted"
    ORPHAN = "orphan"
    RECORDED = "recorded"  # new event for an operation with nothing left to look at
    COALESCED = "coalesced"  # new event while a hint is pending: stored, no new entry
    DUPLICATE = "duplicate"
    CONFLICT = "conflict"
    # A verified event of a type the provider file does not list ([webhook] types): stored
    # flagged, so it neither hints nor attaches as an orphan later.
    IGNORED = "ignored"


@dataclass(frozen=True)
class IncomingEvent:
    provider: str
    event_id: str
    remote_job_id: str | None
    body_sha256: str  # of the whole body
    body: str | None  # what is kept of it: ``kept_body``
    received_at: datetime
    event_type: str | None = None
    body_size: int | None = None  # the whole body's bytes
    ignored: bool = False  # a type [webhook] types does not list: no hint, never attached


EVENT_COLUMNS = (
    "provider",
    "event_id",
    "received_at",
    "remote_job_id",
    "operation_id",
    "body_sha256",
    "body",
    "duplicates",
    "conflicts",
    "event_type",
    "body_size",
    "ignored",
)
# What an event keeps of its body: enough to read its ids and type by eye (an operator
# settling a create_unknown), never a whole body a provider chose the size of.
MAX_KEPT_BODY_BYTES = 4096


def kept_body(body: bytes) -> str:
    """The first ``MAX_KEPT_BODY_BYTES`` of a UTF-8 body, cut at a character boundary."""
    return body[:MAX_KEPT_BODY_BYTES].decode("utf-8", "ignore")


def _kept(text: str | None) -> str | None:
    """``kept_body`` for a body already decoded (every writer keeps the bound)."""
    if text is None or len(text) * 4 <= MAX_KEPT_BODY_BYTES:
        return text
    return kept_body(text.encode("utf-8", "surrogatepass"))


_ONE_ROW = f"({', '.join(['?'] * len(EVENT_COLUMNS))})"


@cache
def _insert_sql(rows: int) -> Sql:
    """Insert ``rows`` events unless their (provider, event id) is stored; returns the new."""
    return Sql(
        "events-insert-new",
        EVENTS,
        f"INSERT INTO webhook_events ({', '.join(EVENT_COLUMNS)}) "
        f"VALUES {', '.join([_ONE_ROW] * rows)} "
        "ON CONFLICT (provider, event_id) DO NOTHING RETURNING provider, event_id",
        params=EVENT_COLUMNS * rows,
    )


_STORED_BODY = Sql(
    "event-body",
    EVENTS,
    "SELECT body_sha256 FROM webhook_events WHERE provider = ? AND event_id = ?",
    params=("provider", "event_id"),
)
_COUNT_DUPLICATE = Sql(
    "event-duplicate",
    EVENTS,
    "UPDATE webhook_events SET duplicates = duplicates + 1 WHERE provider = ? AND event_id = ?",
    params=("provider", "event_id"),
)
_COUNT_CONFLICT = Sql(
    "event-conflict",
    EVENTS,
    "UPDATE webhook_events SET conflicts = conflicts + 1 WHERE provider = ? AND event_id = ?",
    params=("provider", "event_id"),
)
_LOCK_JOB = Sql(
    "job-lock", EVENTS, "SELECT pg_advisory_xact_lock(hashtextextended(?, 0))", params=(AS_IS,)
)
# One statement for the whole batch; the sorted subquery fixes the order the locks are taken in.
_LOCK_JOBS = Sql(
    "jobs-lock",
    EVENTS,
    "SELECT count(pg_advisory_xact_lock(hashtextextended(k, 0))) "
    "FROM (SELECT unnest(CAST(? AS text[])) AS k ORDER BY 1) AS jobs",
    params=(AS_IS,),
)
# The accept step's job lock with the provider's trust state, in one statement: the state
# read as the statement starts is as current as one read just before the lock.
_LOCK_JOB_READING_TRUST = Sql(
    "job-lock-trust",
    EVENTS,
    "SELECT pg_advisory_xact_lock(hashtextextended(?, 0)), "
    "(SELECT state FROM provider_health WHERE provider = ?)",
    params=(AS_IS, "provider_health.provider"),
    returns=(AS_IS, "provider_health.state"),
)
_ATTACH_ORPHANS = Sql(
    "orphans-attach",
    EVENTS,
    "UPDATE webhook_events SET operation_id = ? WHERE provider = ? AND remote_job_id = ? "
    "AND operation_id IS NULL AND NOT ignored",
    params=("operation_id", "provider", "remote_job_id"),
)
_ATTACHED = Sql(
    "events-attached",
    EVENTS,
    "SELECT event_id FROM webhook_events WHERE provider = ? AND remote_job_id = ? "
    "AND operation_id = ? AND NOT ignored ORDER BY received_at, id",
    params=("provider", "remote_job_id", "operation_id"),
    returns=("event_id",),
)


def _insert(conn: Connection, rows: list[tuple[Any, ...]]) -> set[tuple[str, str]]:
    """Insert what is new; the unique key decides, and only inserted rows come back."""
    inserted: set[tuple[str, str]] = set()
    for start in range(0, len(rows), INSERT_CHUNK):
        chunk = rows[start : start + INSERT_CHUNK]
        values = [value for row in chunk for value in row]
        found = _insert_sql(len(chunk)).rows(conn, *values)
        inserted.update((str(p), str(e)) for p, e in found)
    return inserted


def _record_repeats(conn: Connection, repeats: list[IncomingEvent]) -> dict[int, Outcome]:
    out: dict[int, Outcome] = {}
    for index, event in enumerate(repeats):
        stored = _STORED_BODY.value(conn, event.provider, event.event_id)
        conflict = stored is not None and stored != event.body_sha256
        (_COUNT_CONFLICT if conflict else _COUNT_DUPLICATE).run(
            conn, event.provider, event.event_id
        )
        out[index] = Outcome.CONFLICT if conflict else Outcome.DUPLICATE
    return out


def _job_key(provider: str, job_id: str) -> str:
    return f"{provider}\x1f{job_id}"


def lock_jobs(conn: Connection, jobs: Iterable[tuple[str, str]]) -> None:
    """Take this transaction's per-job lock for each ``(provider, job id)`` (PostgreSQL).

    Storing a job's events and learning its id (attaching orphans) hold the same lock, so
    one always sees the other's commit; otherwise an event committed alongside the create
    answer is missed by both and stays an orphan. SQLite serialises all writes already.
    """
    keys = sorted({_job_key(provider, job) for provider, job in jobs})
    if not keys or conn.dialect.name != "postgresql":
        return
    if len(keys) == 1:
        _LOCK_JOB.run(conn, keys[0])
    else:
        _LOCK_JOBS.run(conn, keys)


def _operations_for(conn: Connection, provider: str, job_ids: set[str]) -> list[_Head]:
    if not job_ids:
        return []
    rows = _HEADS.rows(conn, provider, sorted(job_ids))
    return [_Head(*row) for row in rows]


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
    hinted_at: datetime | None
    lease_expires_at: datetime | None


HEAD_NAMES = tuple(f.name for f in dataclasses.fields(_Head))
# PostgreSQL: the rows are locked, so the version read is the one updated.
_HEADS = Sql(
    "operation-heads-by-job",
    OPS,
    f"SELECT {', '.join(HEAD_NAMES)} FROM operations "
    "WHERE provider = ? AND remote_job_id IN (?*) [[FOR UPDATE|]]",
    params=("provider", "remote_job_id"),
    returns=HEAD_NAMES,
)


def _hinted_read(op: _Head, now: datetime) -> tuple[datetime, DelaySource]:
    """Bring the next status read forward to now, but never before the provider's Retry-After."""
    floor = op.retry_not_before
    if floor is None or floor <= now:
        return now, DelaySource.WEBHOOK_HINT
    at = floor if op.next_poll_at is None else min(floor, op.next_poll_at)
    return at, DelaySource.PROVIDER_RETRY_AFTER


def _hint(
    op: _Head, events: list[IncomingEvent], now: datetime
) -> tuple[Outcome, Mapping[str, Any] | None, list[Entry]]:
    """What a batch of new events means for one operation (values only; no writes)."""
    state = State(op.state)
    if state not in HINT_POLLS and state not in HINT_NOTES:
        return Outcome.RECORDED, None, []
    if op.hinted_at is not None:
        reading = op.lease_expires_at is not None and op.lease_expires_at > now
        return Outcome.COALESCED, ({"hinted_at": now} if reading else None), []
    polls = state in HINT_POLLS
    # Operations whose read is not due to a hint keep their schedule unchanged.
    at, source = _hinted_read(op, now) if polls else (None, None)
    changes: dict[str, Any] = {
        "hinted_at": now,
        "next_poll_at": at,
        "delay_source": source.value if source is not None else None,
    }
    first = events[0]
    detail: dict[str, Any] = {"event_id": first.event_id, "body_sha256": first.body_sha256}
    if len(events) > 1:
        detail["coalesced"] = len(events) - 1  # the batch's other events for this operation
    entry = Entry(
        kind=HistoryKind.HINT,
        actor=f"provider:{op.provider}",
        cause=f"webhook:{first.event_id}",
        detail=detail,
        delay_source=source,
        at=first.received_at,
    )
    return Outcome.HINTED, changes, [entry]


def _first_sightings(events: Sequence[IncomingEvent]) -> list[int]:
    """Indexes of each event id's first occurrence in the batch."""
    first: dict[tuple[str, str], int] = {}
    for index, event in enumerate(events):
        first.setdefault((event.provider, event.event_id), index)
    return sorted(first.values())


def _known_operations(
    conn: Connection, events: Sequence[IncomingEvent], indexes: Sequence[int]
) -> dict[tuple[str, str], _Head]:
    """The operations the events' job ids name, locked for this transaction."""
    by_provider: dict[str, set[str]] = defaultdict(set)
    for i in indexes:
        job = events[i].remote_job_id
        if job is not None and not events[i].ignored:
            by_provider[events[i].provider].add(job)
    lock_jobs(conn, [(p, j) for p, jobs in by_provider.items() for j in jobs])
    found: dict[tuple[str, str], _Head] = {}
    for provider, jobs in by_provider.items():
        for op in _operations_for(conn, provider, jobs):
            found[(provider, op.remote_job_id or "")] = op
    return found


def _hint_writes(
    events: Sequence[IncomingEvent],
    new: Sequence[int],
    ops: Mapping[tuple[str, str], _Head],
    outcomes: list[Outcome | None],
    now: datetime,
) -> tuple[list[tuple[_Head, Mapping[str, Any], Sequence[Entry]]], ...]:
    """The hint writes for the new events, grouped by operation; sets each new outcome."""
    by_op: dict[str, list[int]] = defaultdict(list)
    for i in new:
        job = events[i].remote_job_id
        op = ops.get((events[i].provider, job)) if job is not None else None
        if events[i].ignored:
            outcomes[i] = Outcome.IGNORED
        elif op is None:
            outcomes[i] = Outcome.ORPHAN
        else:
            by_op[op.id].append(i)
    polls: list[tuple[_Head, Mapping[str, Any], Sequence[Entry]]] = []
    notes: list[tuple[_Head, Mapping[str, Any], Sequence[Entry]]] = []
    by_id = {op.id: op for op in ops.values()}
    for op_id, indexes in by_op.items():
        op = by_id[op_id]
        outcome, changes, entries = _hint(op, [events[i] for i in indexes], now)
        if changes is not None and changes.get("next_poll_at") is not None:
            polls.append((op, changes, entries))
        elif changes is not None:
            notes.append((op, {"hinted_at": changes["hinted_at"]}, entries))
        for i in indexes:
            outcomes[i] = outcome
    return polls, notes


def write_batch(
    conn: Connection, journal: Journal, events: Sequence[IncomingEvent], now: datetime
) -> list[Outcome]:
    """Store a batch of verified events and their effects; one outcome per event, in order."""
    outcomes: list[Outcome | None] = [None] * len(events)
    firsts = _first_sightings(events)
    ops = _known_operations(conn, events, firsts)
    rows = []
    for i in firsts:
        e = events[i]
        job = e.remote_job_id
        op = ops.get((e.provider, job)) if job is not None and not e.ignored else None
        rows.append(
            (
                e.provider,
                e.event_id,
                e.received_at,
                job,
                op.id if op is not None else None,
                e.body_sha256,
                _kept(e.body),
                0,
                0,
                e.event_type,
                e.body_size,
                e.ignored,
            )
        )
    inserted = _insert(conn, rows)
    new = [i for i in firsts if (events[i].provider, events[i].event_id) in inserted]
    fresh = set(new)
    repeats = [i for i in range(len(events)) if i not in fresh]
    for index, outcome in _record_repeats(conn, [events[i] for i in repeats]).items():
        outcomes[repeats[index]] = outcome
    polls, notes = _hint_writes(events, new, ops, outcomes, now)
    journal.write_many(conn, polls, now=now)
    journal.write_many(conn, notes, now=now)
    if polls or notes:
        notify_in_transaction(conn, WAKE_CHANNEL)
    return [o if o is not None else Outcome.DUPLICATE for o in outcomes]


def lock_job_for_accept(conn: Connection, provider: str, job_id: str, *, trust: bool) -> bool:
    """The accept step's lock on its job, taken before its write: an event that committed
    while it waited is seen by that write's attach (``attach_orphans``), and one that
    comes after waits, then finds the job's operation. Returns, when ``trust``, whether
    the provider's webhooks are trusted now (PostgreSQL: read in the lock's statement)."""
    if trust and conn.dialect.name == "postgresql":
        row = _LOCK_JOB_READING_TRUST.first(conn, _job_key(provider, job_id), provider)
        return row is not None and row[1] == TrustState.TRUSTED.value
    lock_jobs(conn, [(provider, job_id)])
    return trust and is_trusted(conn, provider)


def attach_orphans(provider: str, job_id: str, operation_id: str) -> Bound:
    """Events that arrived before the job id was known become this operation's: written
    with the accept (``Journal.write``'s ``Checked``: whether there were any), under
    ``lock_job_for_accept``. Their ids are then ``attached_events``."""
    return Bound(_ATTACH_ORPHANS, (operation_id, provider, job_id))


def attached_events(conn: Connection, provider: str, job_id: str, operation_id: str) -> list[str]:
    """The ids of the job's events attached to an operation, oldest first."""
    return [str(row[0]) for row in _ATTACHED.rows(conn, provider, job_id, operation_id)]
