"""Per-provider figures the console shows, read from the database (shared by all replicas).

Webhook events as stored (unique events, duplicate and conflicting deliveries,
orphans still waiting for their job) and status reads per completed operation;
for the charts, both by hour (completions and judged webhook verdicts), and the
verdicts a provider's trust state was counted from.
Rejected deliveries store nothing, so they are counted in ``metrics`` instead.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache

from sqlalchemy.engine import Connection

from reconciler.core.states import END_STATES
from reconciler.core.trust import Verdict
from reconciler.storage.fastsql import Sql
from reconciler.storage.tables import EVENTS, OPS, VERDICTS

# Buckets of status reads per completed operation: (label, lowest, highest).
READ_BUCKETS: tuple[tuple[str, int, int | None], ...] = (
    ("0", 0, 0),
    ("1", 1, 1),
    ("2", 2, 2),
    ("3-5", 3, 5),
    ("6-10", 6, 10),
    ("11+", 11, None),
)


# An ignored event (a type [webhook] types does not list) or one without a job id waits
# for no job, so it is not an orphan.
_WEBHOOK_COUNTS = Sql(
    "webhook-counts",
    EVENTS,
    "SELECT provider, count(*), coalesce(sum(duplicates), 0), coalesce(sum(conflicts), 0), "
    "count(CASE WHEN operation_id IS NULL AND remote_job_id IS NOT NULL AND NOT ignored "
    "THEN 1 END) FROM webhook_events GROUP BY provider",
)
_STATUS_READS = Sql(
    "status-reads-per-operation",
    OPS,
    "SELECT provider, status_requests_used, count(*) FROM operations WHERE state IN (?*) "
    "GROUP BY provider, status_requests_used",
    params=("state",),
)


@dataclass(frozen=True)
class WebhookCounts:
    events: int = 0  # unique verified events stored
    duplicates: int = 0  # further deliveries of a stored event id, same body
    conflicts: int = 0  # further deliveries of a stored event id with another body
    orphaned: int = 0  # events for a job no operation knows (yet)


@dataclass
class ReadCounts:
    completed: int = 0
    reads: int = 0
    most: int = 0
    buckets: dict[str, int] = field(default_factory=lambda: {b[0]: 0 for b in READ_BUCKETS})

    @property
    def mean(self) -> float | None:
        return self.reads / self.completed if self.completed else None


def webhook_counts(conn: Connection) -> dict[str, WebhookCounts]:
    return {
        str(p): WebhookCounts(int(n), int(dup), int(conf), int(orph))
        for p, n, dup, conf, orph in _WEBHOOK_COUNTS.rows(conn)
    }


def _bucket(reads: int) -> str:
    for label, low, high in READ_BUCKETS:
        if reads >= low and (high is None or reads <= high):
            return label
    return READ_BUCKETS[-1][0]  # pragma: no cover - the last bucket is open-ended


def status_reads(conn: Connection) -> dict[str, ReadCounts]:
    """Status requests used by each operation in an end state, per provider."""
    rows = _STATUS_READS.rows(conn, [s.value for s in END_STATES])
    found: dict[str, ReadCounts] = defaultdict(ReadCounts)
    for provider, used, count in rows:
        counts = found[str(provider)]
        counts.completed += int(count)
        counts.reads += int(used) * int(count)
        counts.most = max(counts.most, int(used))
        counts.buckets[_bucket(int(used))] += int(count)
    return dict(found)


# --- hourly figures for the providers page's charts ----------------------------------------

# Verdicts that are a judged completion (pending waits for its grace, excused counts nowhere).
JUDGED = (Verdict.WEBHOOK_FIRST, Verdict.LATE, Verdict.MISS)
# The verdicts that can move a trust state (late is neither held against it nor for it).
DECIDING = (Verdict.WEBHOOK_FIRST, Verdict.MISS)


def _bucket_case(column: str, edges: int) -> str:
    """Which of ``edges + 1`` consecutive windows ``column`` falls in: a CASE of ``edges`` marks."""
    whens = " ".join(f"WHEN {column} < ? THEN {i}" for i in range(edges))
    return f"CASE {whens} ELSE {edges} END"


@cache
def _hourly_reads_sql(edges: int) -> Sql:
    return Sql(
        "status-reads-hourly",
        OPS,
        f"SELECT provider, {_bucket_case('done_at', edges)} AS slot, count(*), "
        "coalesce(sum(status_requests_used), 0) FROM operations "
        "WHERE state IN (?*) AND done_at >= ? AND done_at < ? GROUP BY provider, slot",
        params=(*["done_at"] * edges, "state", "done_at", "done_at"),
    )


@cache
def _hourly_verdicts_sql(edges: int) -> Sql:
    return Sql(
        "verdicts-hourly",
        VERDICTS,
        f"SELECT provider, {_bucket_case('judged_at', edges)} AS slot, verdict, count(*) "
        "FROM webhook_verdicts WHERE verdict IN (?*) AND judged_at >= ? AND judged_at < ? "
        "GROUP BY provider, slot, verdict",
        params=(*["judged_at"] * edges, "verdict", "judged_at", "judged_at"),
    )


_DECIDING_VERDICTS = Sql(
    "verdicts-deciding",
    VERDICTS,
    "SELECT verdict, judged_at, operation_id FROM webhook_verdicts "
    "WHERE provider = ? AND verdict IN (?*) AND judged_at IS NOT NULL ORDER BY judged_at, id",
    params=("provider", "verdict"),
    returns=("verdict", "judged_at", "operation_id"),
)


@dataclass
class Hour:
    """One hour's completions and judged webhook verdicts of one provider."""

    start: datetime
    completed: int = 0
    reads: int = 0
    verdicts: dict[Verdict, int] = field(default_factory=dict)

    @property
    def reads_per_completed(self) -> float | None:
        return self.reads / self.completed if self.completed else None

    @property
    def judged(self) -> int:
        return sum(self.verdicts.values())

    @property
    def webhook_first_share(self) -> float | None:
        """As ``core.trust.share``: webhook-first among judged completions (late, missed)."""
        return self.verdicts.get(Verdict.WEBHOOK_FIRST, 0) / self.judged if self.judged else None


def hourly(conn: Connection, starts: Sequence[datetime], end: datetime) -> dict[str, list[Hour]]:
    """Per provider, one ``Hour`` per window ``[starts[i], starts[i+1])`` (the last up to ``end``).

    Completions are operations in an end state by ``done_at``; verdicts are judged
    completions by ``judged_at``. Two grouped reads, whatever the number of hours.
    """
    if not starts:
        return {}
    edges = list(starts[1:])
    found: dict[str, list[Hour]] = {}

    def hours_of(provider: str) -> list[Hour]:
        if provider not in found:
            found[provider] = [Hour(s) for s in starts]
        return found[provider]

    reads = _hourly_reads_sql(len(edges)).rows(
        conn, *edges, [s.value for s in END_STATES], starts[0], end
    )
    for provider, slot, count, used in reads:
        hour = hours_of(str(provider))[int(slot)]
        hour.completed += int(count)
        hour.reads += int(used)
    judged = _hourly_verdicts_sql(len(edges)).rows(
        conn, *edges, [v.value for v in JUDGED], starts[0], end
    )
    for provider, slot, verdict, count in judged:
        hour = hours_of(str(provider))[int(slot)]
        hour.verdicts[Verdict(verdict)] = hour.verdicts.get(Verdict(verdict), 0) + int(count)
    return found


def deciding_verdicts(conn: Connection, provider: str) -> list[tuple[Verdict, datetime, str]]:
    """The provider's judged webhook-first completions and misses in the order judged.

    What its trust state was counted from (``core.trust.count``), for replaying its
    transitions: a pass over the provider's verdicts, so read only when needed.
    """
    rows = _DECIDING_VERDICTS.rows(conn, provider, [v.value for v in DECIDING])
    return [(Verdict(v), at, str(op)) for v, at, op in rows]
