"""Pruning what retention lets go: one batch of finished operations per transaction.

Guarantee: nothing in flight is touched, and an operation goes with all its rows or
not at all. A batch picks finished operations (``FINISHED``: an end state, no decision
pending, no completion work left, nothing scheduled) oldest first, deletes their
history, payloads, completion steps, escalations, webhook verdicts and events and then
the rows, leaves a tombstone for each and appends one record to the retention log
(``core.retention``), all in one transaction. On PostgreSQL the picked rows are locked
``SKIP LOCKED``, so a row a worker or a webhook holds is left for a later batch, and two
pruners' batches take turns (a transaction lock taken first); should two records still
claim one sequence number, the second fails and its batch is rolled back whole.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy.engine import Connection

from reconciler.core.chain import GENESIS
from reconciler.core.retention import (
    TOMBSTONE_FIELDS,
    Kept,
    key_digest,
    pruned_digest,
    pruned_message,
    record_hash,
    replayed_pruned_message,
    tombstones_digest,
)
from reconciler.core.states import END_STATES
from reconciler.storage.completion_steps import FINISHED as SETTLED_STEPS
from reconciler.storage.fastsql import AS_IS, Sql
from reconciler.storage.tables import (
    ESCALATIONS,
    EVENTS,
    HISTORY,
    LEASES,
    OPS,
    PAYLOAD_TABLE,
    RETENTION_HEAD,
    RETENTION_LOG,
    STEPS,
    TOMBSTONES,
    VERDICTS,
)

SWEEP_LEASE = "retention"
_ENDED = sorted(state.value for state in END_STATES)
_SETTLED_STEPS = sorted(status.value for status in SETTLED_STEPS)

# Finished: what may be pruned, the SQL twin of ``core.states.is_done`` plus "no work left".
# SQLite plans without statistics: its unary ``+`` keeps it off the state index and the due
# index (whose NULL range is every finished row) and on ``ix_operations_finished``. The
# steps are counted in a scalar subquery, one index probe per picked row: PostgreSQL made
# a NOT EXISTS an anti-join that read the whole steps table for every batch.
FINISHED = (
    "done_at IS NOT NULL AND done_at < ? AND [[state|+state]] IN (?*) AND NOT escalation_open "
    "AND NOT completion_pending AND [[next_poll_at|+next_poll_at]] IS NULL AND ("
    "SELECT count(*) FROM completion_steps s WHERE s.operation_id = operations.id "
    "AND NOT (s.status IN (?*))) = 0"
)
_FINISHED_PARAMS = ("done_at", "state", "completion_steps.status")
_FINISHED_PARAMS_ELSEWHERE = ("operations.done_at", "operations.state", "completion_steps.status")
_PICKED = (
    "id",
    "caller",
    "idempotency_key",
    "request_fingerprint",
    "provider",
    "state",
    "done_at",
    "remote_job_id",
    "history_head",
    "history_seq",
)
_PICK = Sql(
    "retention-pick",
    OPS,
    f"SELECT {', '.join(_PICKED)} FROM operations WHERE {FINISHED} "
    "ORDER BY done_at LIMIT ? [[FOR UPDATE SKIP LOCKED|]]",
    params=(*_FINISHED_PARAMS, AS_IS),
    returns=_PICKED,
)
_COUNT_FINISHED = Sql(
    "retention-count",
    OPS,
    f"SELECT count(*), sum(history_seq), min(done_at), max(done_at) FROM operations "
    f"WHERE {FINISHED}",
    params=_FINISHED_PARAMS,
    returns=(AS_IS, AS_IS, "done_at", "done_at"),
)


def _delete_of(name: str, table: Any, column: str = "operation_id") -> Sql:
    return Sql(
        f"retention-delete-{name}",
        table,
        f"DELETE FROM {table.name} WHERE {column} IN (?*)",
        params=(column,),
    )


# Children first (their foreign keys name the operation), the rows last.
_CHILDREN = (
    ("history", _delete_of("history", HISTORY)),
    ("operation_payloads", _delete_of("payloads", PAYLOAD_TABLE)),
    ("completion_steps", _delete_of("steps", STEPS)),
    ("escalations", _delete_of("escalations", ESCALATIONS)),
    ("webhook_verdicts", _delete_of("verdicts", VERDICTS)),
)
_DELETE_ROWS = _delete_of("operations", OPS, "id")
# A job's events (attached, or orphans of the same job) go with its operation.
_DELETE_JOB_EVENTS = Sql(
    "retention-delete-job-events",
    EVENTS,
    "DELETE FROM webhook_events WHERE provider = ? AND remote_job_id = ?",
    params=("provider", "remote_job_id"),
)
_COUNT_CHILDREN = {
    name: Sql(
        f"retention-count-{name}",
        table,
        f"SELECT count(*) FROM {table.name} WHERE operation_id IN "
        f"(SELECT id FROM operations WHERE {FINISHED})",
        params=_FINISHED_PARAMS_ELSEWHERE,
    )
    for name, table in (
        ("operation_payloads", PAYLOAD_TABLE),
        ("completion_steps", STEPS),
        ("escalations", ESCALATIONS),
        ("webhook_verdicts", VERDICTS),
    )
}
# The events ``_DELETE_JOB_EVENTS`` takes with the finished operations (a dry run).
_FINISHED_JOBS = (
    "(provider, remote_job_id) IN (SELECT provider, remote_job_id FROM operations "
    f"WHERE remote_job_id IS NOT NULL AND {FINISHED})"
)
_COUNT_JOB_EVENTS = Sql(
    "retention-count-job-events",
    EVENTS,
    f"SELECT count(*) FROM webhook_events WHERE {_FINISHED_JOBS}",
    params=_FINISHED_PARAMS_ELSEWHERE,
)
# What a reader of one tombstone (a retry's ``410``, the create's key check) needs: the
# audit's fields without the record that covers it.
TOMBSTONE_COLUMNS = tuple(f for f in TOMBSTONE_FIELDS if f != "record_seq")
_LEAVE_TOMBSTONE = Sql(
    "tombstone-insert",
    TOMBSTONES,
    f"INSERT INTO tombstones ({', '.join(TOMBSTONE_FIELDS)}) "
    f"VALUES ({', '.join(['?'] * len(TOMBSTONE_FIELDS))})",
    params=TOMBSTONE_FIELDS,
)
# PostgreSQL: prune batches take turns (a transaction lock, taken before any other), so two
# pruners neither pick the same rows nor race for the log's next record. SQLite serialises
# every write already.
_TAKE_TURN = Sql(
    "retention-turn",
    RETENTION_LOG,
    "SELECT pg_advisory_xact_lock(hashtextextended(?, 0))",
    params=(AS_IS,),
)
_LOG_COLUMNS = tuple(c.name for c in RETENTION_LOG.c)
_LOG_HEAD = Sql(
    "retention-log-head",
    RETENTION_LOG,
    "SELECT seq, hash FROM retention_log ORDER BY seq DESC LIMIT 1",
)
_LOG_APPEND = Sql(
    "retention-log-append",
    RETENTION_LOG,
    f"INSERT INTO retention_log ({', '.join(_LOG_COLUMNS)}) "
    f"VALUES ({', '.join(['?'] * len(_LOG_COLUMNS))})",
    params=_LOG_COLUMNS,
)
_SET_HEAD = Sql(
    "retention-head-set",
    RETENTION_HEAD,
    "INSERT INTO retention_head (name, seq, hash) VALUES ('retention', ?, ?) "
    "ON CONFLICT (name) DO UPDATE SET seq = excluded.seq, hash = excluded.hash",
    params=("seq", "hash"),
)
_HEAD = Sql(
    "retention-head",
    RETENTION_HEAD,
    "SELECT seq, hash FROM retention_head WHERE name = 'retention'",
    returns=("seq", "hash"),
)
_COVERED_TOMBSTONES = Sql(
    "tombstones-covered",
    TOMBSTONES,
    f"SELECT {', '.join(TOMBSTONE_FIELDS)} FROM tombstones WHERE record_seq IS NOT NULL",
    returns=TOMBSTONE_FIELDS,
)
_LOG = Sql(
    "retention-log",
    RETENTION_LOG,
    f"SELECT {', '.join(_LOG_COLUMNS)} FROM retention_log ORDER BY seq",
    returns=_LOG_COLUMNS,
)
# Events no operation keeps: orphans, ignored types, and those whose operation is gone.
_EXPIRED_EVENTS = (
    "FROM webhook_events WHERE provider = ? AND received_at < ? AND (operation_id IS NULL "
    "OR ignored OR NOT EXISTS "
    "(SELECT 1 FROM operations o WHERE o.id = webhook_events.operation_id))"
)
_DELETE_EVENTS = Sql(
    "retention-delete-events",
    EVENTS,
    f"DELETE FROM webhook_events WHERE id IN (SELECT id {_EXPIRED_EVENTS} LIMIT ?)",
    params=("provider", "received_at", AS_IS),
)
_COUNT_EVENTS = Sql(
    "retention-count-events",
    EVENTS,
    f"SELECT count(*) {_EXPIRED_EVENTS}",
    params=("provider", "received_at"),
)
# The same, less those the finished operations' prune takes first (orphans of their jobs).
_COUNT_EVENTS_LEFT = Sql(
    "retention-count-events-left",
    EVENTS,
    f"SELECT count(*) {_EXPIRED_EVENTS} AND NOT {_FINISHED_JOBS}",
    params=("provider", "received_at", *_FINISHED_PARAMS_ELSEWHERE),
)
# The providers with events, one index probe each (a DISTINCT would read the whole index).
_EVENT_PROVIDERS = Sql(
    "retention-event-providers",
    EVENTS,
    "WITH RECURSIVE p(provider) AS (SELECT min(provider) FROM webhook_events UNION ALL "
    "SELECT (SELECT min(provider) FROM webhook_events WHERE provider > p.provider) FROM p "
    "WHERE p.provider IS NOT NULL) SELECT provider FROM p WHERE provider IS NOT NULL",
)
# Tombstones left before the log covered them go uncounted; the others go a record's at a
# time, each expiry recorded (``_expire_covered``).
_DELETE_UNCOVERED_TOMBSTONES = Sql(
    "retention-delete-uncovered-tombstones",
    TOMBSTONES,
    "DELETE FROM tombstones WHERE operation_id IN (SELECT operation_id FROM tombstones "
    "WHERE record_seq IS NULL AND pruned_at < ? LIMIT ?)",
    params=("pruned_at", AS_IS),
)
_OLDEST_COVERED = Sql(
    "retention-oldest-tombstones",
    TOMBSTONES,
    "SELECT min(record_seq) FROM tombstones WHERE pruned_at < ? AND record_seq IS NOT NULL",
    params=("pruned_at",),
)
_TOMBSTONES_OF = Sql(
    "retention-tombstones-of",
    TOMBSTONES,
    f"SELECT {', '.join(TOMBSTONE_FIELDS)} FROM tombstones WHERE record_seq = ? "
    "ORDER BY operation_id LIMIT ?",
    params=("record_seq", AS_IS),
    returns=TOMBSTONE_FIELDS,
)
_DELETE_TOMBSTONES = _delete_of("tombstones", TOMBSTONES)
_COUNT_TOMBSTONES = Sql(
    "retention-count-tombstones",
    TOMBSTONES,
    "SELECT count(*) FROM tombstones WHERE pruned_at < ?",
    params=("pruned_at",),
)
TOMBSTONE_BY_KEY = Sql(
    "tombstone-by-key",
    TOMBSTONES,
    f"SELECT {', '.join(TOMBSTONE_COLUMNS)} FROM tombstones "
    "WHERE caller = ? AND key_digest = ? ORDER BY pruned_at DESC LIMIT 1",
    params=("caller", "key_digest"),
    returns=TOMBSTONE_COLUMNS,
)
_TOMBSTONE_OF = Sql(
    "tombstone-of",
    TOMBSTONES,
    f"SELECT {', '.join(TOMBSTONE_COLUMNS)} FROM tombstones WHERE operation_id = ?",
    params=("operation_id",),
    returns=TOMBSTONE_COLUMNS,
)
_LOG_TOTALS = Sql(
    "retention-log-totals",
    RETENTION_LOG,
    "SELECT count(*), sum(operations), max(at), max(done_until) FROM retention_log",
    returns=(AS_IS, AS_IS, "at", "done_until"),
)
_COUNT_ALL_TOMBSTONES = Sql("tombstones-count", TOMBSTONES, "SELECT count(*) FROM tombstones")
_TAKE_LEASE = Sql(
    "lease-take",
    LEASES,
    "INSERT INTO maintenance_leases (name, owner, expires_at) VALUES (?, ?, ?) "
    "ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at "
    "WHERE maintenance_leases.owner = excluded.owner OR maintenance_leases.expires_at <= ? "
    "RETURNING owner",
    params=("name", "owner", "expires_at", "expires_at"),
)
_GIVE_BACK = Sql(
    "lease-give-back",
    LEASES,
    "DELETE FROM maintenance_leases WHERE name = ? AND owner = ?",
    params=("name", "owner"),
)
_LEASE_OF = Sql(
    "lease-of",
    LEASES,
    "SELECT owner, expires_at FROM maintenance_leases WHERE name = ?",
    params=("name",),
    returns=("owner", "expires_at"),
)


@dataclass(frozen=True)
class Tombstone:
    operation_id: str
    caller: str
    key_digest: str | None
    request_fingerprint: str
    provider: str
    state: str
    done_at: datetime
    pruned_at: datetime

    def gone(self) -> str:
        return pruned_message(self.operation_id, self.state, self.done_at, self.pruned_at)

    def replayed(self, key: str) -> str:
        return replayed_pruned_message(
            key, self.operation_id, self.state, self.done_at, self.pruned_at
        )


@dataclass
class Removed:
    """Rows removed (or, for a dry run, that would be), by table."""

    tables: dict[str, int] = field(default_factory=dict)
    done_until: datetime | None = None

    def add(self, table: str, count: int) -> None:
        self.tables[table] = self.tables.get(table, 0) + count

    def merge(self, other: Removed) -> None:
        for table, count in other.tables.items():
            self.add(table, count)
        if other.done_until is not None:
            self.done_until = max(self.done_until or other.done_until, other.done_until)

    @property
    def operations(self) -> int:
        return self.tables.get("operations", 0)

    @property
    def removed(self) -> bool:
        """Whether any row went (a batch that removed nothing ends its kind's run)."""
        return any(count > 0 for count in self.tables.values())


def prune_batch(
    conn: Connection, cutoff: datetime, now: datetime, limit: int, actor: str, key: bytes | None
) -> Removed:
    """Prune up to ``limit`` finished operations done before ``cutoff``, in the caller's
    transaction: their rows, a tombstone each and one retention record."""
    if conn.dialect.name == "postgresql":
        _TAKE_TURN.run(conn, "reconciler-retention")
    picked = _PICK.rows(conn, cutoff, _ENDED, _SETTLED_STEPS, limit)
    removed = Removed()
    if not picked:
        return removed
    ids = [row[0] for row in picked]
    for table, delete in _CHILDREN:
        removed.add(table, int(delete.run(conn, ids).rowcount))
    jobs = [(row[4], row[7]) for row in picked if row[7] is not None]
    removed.add("webhook_events", _DELETE_JOB_EVENTS.many(conn, jobs) or 0)
    removed.add("operations", int(_DELETE_ROWS.run(conn, ids).rowcount))
    seq, prev = _log_head(conn)
    stones = [
        (op_id, caller, key_digest(idem), fingerprint, provider, state, done_at, now, seq)
        for op_id, caller, idem, fingerprint, provider, state, done_at, *_ in picked
    ]
    _LEAVE_TOMBSTONE.many(conn, stones)
    done = [row[6] for row in picked]
    removed.done_until = max(done)
    _append_record(
        conn,
        seq,
        prev,
        {
            "at": now,
            "actor": actor,
            "cutoff": cutoff,
            "operations": len(picked),
            "history_entries": removed.tables["history"],
            "done_from": min(done),
            "done_until": max(done),
            "digest": pruned_digest((row[0], row[8], row[9]) for row in picked),
            "tombstones": len(stones),
            "tombstones_digest": tombstones_digest(_as_fields(stones), key),
        },
        key,
    )
    return removed


def _as_fields(rows: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
    return [dict(zip(TOMBSTONE_FIELDS, row, strict=True)) for row in rows]


def _log_head(conn: Connection) -> tuple[int, str]:
    """The number the next record takes and the hash it links to."""
    head = _LOG_HEAD.first(conn)
    return (head[0] + 1, head[1]) if head is not None else (1, GENESIS)


def _append_record(
    conn: Connection, seq: int, prev: str, fields: dict[str, Any], key: bytes | None
) -> None:
    fields = {"tombstones": None, "tombstones_digest": None, "expired_of": None, **fields}
    fields.update(seq=seq, prev_hash=prev)
    fields["hash"] = record_hash(fields, prev, key)
    _LOG_APPEND.run(conn, *(fields[name] for name in _LOG_COLUMNS))
    _SET_HEAD.run(conn, seq, fields["hash"])


def count_finished(conn: Connection, cutoff: datetime) -> Removed:
    """What pruning every operation finished before ``cutoff`` would remove (a dry run)."""
    args = (cutoff, _ENDED, _SETTLED_STEPS)
    count, entries, _, until = _COUNT_FINISHED.first(conn, *args) or (0, 0, None, None)
    out = Removed(done_until=until)
    out.add("operations", int(count or 0))
    out.add("history", int(entries or 0))
    for table, sql in _COUNT_CHILDREN.items():
        out.add(table, int(sql.value(conn, *args) or 0))
    out.add("webhook_events", int(_COUNT_JOB_EVENTS.value(conn, *args) or 0))
    return out


def event_providers(conn: Connection) -> list[str]:
    return sorted(str(row[0]) for row in _EVENT_PROVIDERS.rows(conn))


def expire_events(conn: Connection, provider: str, cutoff: datetime, limit: int) -> int:
    """Delete up to ``limit`` of one provider's events that no operation keeps."""
    return int(_DELETE_EVENTS.run(conn, provider, cutoff, limit).rowcount)


def count_expired_events(
    conn: Connection, provider: str, cutoff: datetime, finished_before: datetime | None = None
) -> int:
    """The events ``expire_events`` would delete; ``finished_before``: after a prune of the
    operations finished before it, which takes their jobs' events first."""
    if finished_before is None:
        return int(_COUNT_EVENTS.value(conn, provider, cutoff) or 0)
    args = (finished_before, _ENDED, _SETTLED_STEPS)
    return int(_COUNT_EVENTS_LEFT.value(conn, provider, cutoff, *args) or 0)


def expire_tombstones(
    conn: Connection,
    cutoff: datetime,
    limit: int,
    now: datetime,
    actor: str,
    key: bytes | None,
) -> int:
    """Delete up to ``limit`` tombstones left before ``cutoff``: those the log does not
    cover first, then those of the oldest record that left some, recorded in the log."""
    gone = int(_DELETE_UNCOVERED_TOMBSTONES.run(conn, cutoff, limit).rowcount)
    if gone:
        return gone
    if conn.dialect.name == "postgresql":
        _TAKE_TURN.run(conn, "reconciler-retention")
    record = _OLDEST_COVERED.value(conn, cutoff)
    if record is None:
        return 0
    stones = _as_fields(_TOMBSTONES_OF.rows(conn, record, limit))
    _DELETE_TOMBSTONES.run(conn, [stone["operation_id"] for stone in stones])
    done = [stone["done_at"] for stone in stones]
    seq, prev = _log_head(conn)
    _append_record(
        conn,
        seq,
        prev,
        {
            "at": now,
            "actor": actor,
            "cutoff": cutoff,
            "operations": 0,
            "history_entries": 0,
            "done_from": min(done),
            "done_until": max(done),
            "digest": pruned_digest((stone["operation_id"], "", 0) for stone in stones),
            "tombstones": len(stones),
            "tombstones_digest": tombstones_digest(stones, key),
            "expired_of": record,
        },
        key,
    )
    return len(stones)


def count_expired_tombstones(conn: Connection, cutoff: datetime) -> int:
    return int(_COUNT_TOMBSTONES.value(conn, cutoff) or 0)


def tombstone_of(conn: Connection, operation_id: str) -> Tombstone | None:
    row = _TOMBSTONE_OF.first(conn, operation_id)
    return None if row is None else Tombstone(*row)


def retention_log(conn: Connection) -> list[Mapping[str, Any]]:
    return [dict(zip(_LOG_COLUMNS, row, strict=True)) for row in _LOG.rows(conn)]


def log_head(conn: Connection) -> tuple[int, str] | None:
    """The log's head as kept apart from it (``retention_head``)."""
    row = _HEAD.first(conn)
    return None if row is None else (int(row[0]), str(row[1]))


def kept_tombstones(conn: Connection, key: bytes | None) -> dict[int, Kept]:
    """The tombstones the log covers, counted and digested by the record that left them."""
    kept: dict[int, Kept] = {}
    for row in _COVERED_TOMBSTONES.rows(conn):
        fields = dict(zip(TOMBSTONE_FIELDS, row, strict=True))
        kept.setdefault(fields["record_seq"], Kept()).add(fields, key)
    return kept


@dataclass(frozen=True)
class Progress:
    """What retention has done so far, for operators (the console's providers page)."""

    prunes: int
    operations: int
    last_at: datetime | None
    done_until: datetime | None
    tombstones: int
    sweeping: tuple[str, datetime] | None  # who holds the sweep's lease now, and until when


def progress(conn: Connection, now: datetime) -> Progress:
    prunes, operations, last_at, until = _LOG_TOTALS.first(conn) or (0, 0, None, None)
    holder = lease_holder(conn, SWEEP_LEASE)
    return Progress(
        int(prunes or 0),
        int(operations or 0),
        last_at,
        until,
        int(_COUNT_ALL_TOMBSTONES.value(conn) or 0),
        holder if holder is not None and holder[1] > now else None,
    )


def take_lease(conn: Connection, name: str, owner: str, now: datetime, until: datetime) -> bool:
    """Take (or renew) the lease ``name`` until ``until``, unless another holds it now."""
    return _TAKE_LEASE.first(conn, name, owner, until, now) is not None


def give_back(conn: Connection, name: str, owner: str) -> None:
    _GIVE_BACK.run(conn, name, owner)


def lease_holder(conn: Connection, name: str) -> tuple[str, datetime] | None:
    row = _LEASE_OF.first(conn, name)
    return None if row is None else (str(row[0]), row[1])
