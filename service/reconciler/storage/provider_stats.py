"""Per-provider figures the console shows, read from the database (shared by all replicas).

Webhook events as stored (unique events, duplicate and conflicting deliveries,
orphans still waiting for their job) and status reads per completed operation.
Rejected deliveries store nothing, so they are counted in ``metrics`` instead.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from sqlalchemy.engine import Connection

from reconciler.core.states import END_STATES
from reconciler.storage.fastsql import Sql
from reconciler.storage.journal import OPS
from reconciler.storage.webhook_events import EVENTS

# Buckets of status reads per completed operation: (label, lowest, highest).
READ_BUCKETS: tuple[tuple[str, int, int | None], ...] = (
    ("0", 0, 0),
    ("1", 1, 1),
    ("2", 2, 2),
    ("3-5", 3, 5),
    ("6-10", 6, 10),
    ("11+", 11, None),
)


# An event stored without a job id (a type [webhook] types does not list) is for no job,
# so it is not an orphan waiting for one.
_WEBHOOK_COUNTS = Sql(
    "webhook-counts",
    EVENTS,
    "SELECT provider, count(*), coalesce(sum(duplicates), 0), coalesce(sum(conflicts), 0), "
    "count(CASE WHEN operation_id IS NULL AND remote_job_id IS NOT NULL THEN 1 END) "
    "FROM webhook_events GROUP BY provider",
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
