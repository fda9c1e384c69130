"""Retention decisions: what a prune may remove, and the keyed account it leaves.

A finished operation (an end state, no decision pending, every completion step done
or given up) is pruned once ``done_at`` is older than the window; the SQL that picks
them is ``storage.retention``'s, the windows and the account are values here.

Each prune batch appends one record to a chain of its own, hashed like the history
(an HMAC with ``RECONCILER_AUDIT_KEY`` when it is set): how many operations and
history entries went, the span of their ``done_at``, and a digest of their ids and
chain heads. ``audit verify`` checks that chain, so an edited or deleted record, or a
forged one without the key, fails it as an edited history entry does.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from reconciler.core.canonical import canonical_json
from reconciler.core.chain import GENESIS
from reconciler.core.clock import isoformat

DAY_SECONDS = 86_400.0
RECORD_FIELDS = (
    "seq",
    "at",
    "actor",
    "cutoff",
    "operations",
    "history_entries",
    "done_from",
    "done_until",
    "digest",
)


def window(days: float) -> timedelta | None:
    """A retention window in days as a duration; 0 keeps forever (None)."""
    return timedelta(seconds=days * DAY_SECONDS) if days > 0 else None


@dataclass(frozen=True)
class RetentionPolicy:
    """How long each kind of row is kept; None keeps it forever."""

    operations: timedelta | None
    events: timedelta | None
    tombstones: timedelta | None

    @classmethod
    def of_days(cls, operations: float, events: float, tombstones: float) -> RetentionPolicy:
        return cls(window(operations), window(events), window(tombstones))

    @property
    def keeps_everything(self) -> bool:
        return self.operations is None and self.events is None and self.tombstones is None


@dataclass(frozen=True)
class Cutoffs:
    """The moments before which each kind is removed (None: not removed)."""

    operations: datetime | None
    events: datetime | None
    tombstones: datetime | None


def cutoffs(policy: RetentionPolicy, now: datetime) -> Cutoffs:
    def before(span: timedelta | None) -> datetime | None:
        return None if span is None else now - span

    return Cutoffs(before(policy.operations), before(policy.events), before(policy.tombstones))


def key_digest(key: str | None) -> str | None:
    """How a tombstone keeps an idempotency key: its SHA-256, never the key itself."""
    return None if key is None else hashlib.sha256(key.encode("utf-8")).hexdigest()


def pruned_digest(heads: Iterable[tuple[str, str, int]]) -> str:
    """One digest of the removed operations: each id with its chain head and length."""
    lines = sorted(f"{op_id} {head} {count}" for op_id, head, count in heads)
    return hashlib.sha256("\n".join(lines).encode("utf-8")).hexdigest()


def pruned_message(operation_id: str, state: str, done_at: datetime, pruned_at: datetime) -> str:
    """What a read of a pruned operation is told (410)."""
    return (
        f"operation {operation_id} ended {state} at {isoformat(done_at)} and was removed by "
        f"retention at {isoformat(pruned_at)}; its record and result are no longer kept"
    )


def replayed_pruned_message(
    key: str, operation_id: str, state: str, done_at: datetime, pruned_at: datetime
) -> str:
    """What a retry of a pruned operation's key and request is told (410): nothing started."""
    return (
        f"idempotency_key '{key}' named {pruned_message(operation_id, state, done_at, pruned_at)}"
        "; no new job was started. Use a new idempotency_key to start a new one"
    )


def record_hash(fields: Mapping[str, Any], prev_hash: str, key: bytes | None) -> str:
    material = {name: fields.get(name) for name in RECORD_FIELDS}
    for name, value in material.items():
        if isinstance(value, datetime):
            material[name] = isoformat(value)
    text = ("retention\n" + prev_hash + "\n" + canonical_json(material)).encode("utf-8")
    if key:
        return hmac.new(key, text, hashlib.sha256).hexdigest()
    return hashlib.sha256(text).hexdigest()


@dataclass(frozen=True)
class RecordFault:
    seq: int | None
    problem: str

    def describe(self) -> str:
        where = f"retention record {self.seq}" if self.seq is not None else "retention log"
        return f"{where}: {self.problem}"


@dataclass(frozen=True)
class RetentionSummary:
    """What the retention log says was removed, for ``audit verify``'s report."""

    records: int
    operations: int
    history_entries: int
    done_until: datetime | None
    last_at: datetime | None

    def describe(self) -> str:
        if self.records == 0:
            return "retention removed nothing"
        return (
            f"retention removed {self.operations} operations ({self.history_entries} history "
            f"entries) finished up to {isoformat(self.done_until)}, in {self.records} "
            f"prunes, the last at {isoformat(self.last_at)}"
        )


def verify_records(
    records: Sequence[Mapping[str, Any]], key: bytes | None
) -> tuple[RetentionSummary, RecordFault | None]:
    """Check the log (ordered by seq): numbering, links and hashes; and sum it up."""
    prev = GENESIS
    operations = entries = 0
    done_until: datetime | None = None
    last_at: datetime | None = None
    for expected, record in enumerate(records, start=1):
        seq = record["seq"]
        if seq != expected:
            fault = RecordFault(seq, f"sequence broken: expected record {expected}")
            return _summary(expected - 1, operations, entries, done_until, last_at), fault
        if record["prev_hash"] != prev:
            fault = RecordFault(seq, "does not link to the previous record")
            return _summary(expected - 1, operations, entries, done_until, last_at), fault
        if record_hash(record, prev, key) != record["hash"]:
            fault = RecordFault(seq, "content does not match its hash (edited)")
            return _summary(expected - 1, operations, entries, done_until, last_at), fault
        prev = record["hash"]
        operations += record["operations"]
        entries += record["history_entries"]
        until = record["done_until"]
        done_until = until if done_until is None else max(done_until, until)
        last_at = record["at"]
    return _summary(len(records), operations, entries, done_until, last_at), None


def _summary(
    records: int,
    operations: int,
    entries: int,
    done_until: datetime | None,
    last_at: datetime | None,
) -> RetentionSummary:
    return RetentionSummary(records, operations, entries, done_until, last_at)
