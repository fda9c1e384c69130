"""Retention decisions: what a prune may remove, and the keyed account it leaves.

A finished operation (an end state, no decision pending, every completion step done
or given up) is pruned once ``done_at`` is older than the window; the SQL that picks
them is ``storage.retention``'s, the windows and the account are values here.

Each prune batch appends one record to a chain of its own, hashed like the history
(an HMAC with ``RECONCILER_AUDIT_KEY`` when it is set): how many operations and
history entries went, the span of their ``done_at``, a digest of their ids and chain
heads, and the tombstones it left with their digest; expiring tombstones appends a
record of what went (``expired_of``). The log's head (last number and hash) is kept
apart, as an operation's row keeps its history's head. ``audit verify`` checks the
chain against that head and each record's tombstones against its count and digest, so
an edited or deleted record (the newest ones too), a deleted or edited tombstone, or a
forged record without the key fails it as an edited history entry does.

A tombstones digest is the sum (mod 2**256) of one hash per tombstone, so an expiry's
digest subtracts from its prune's: what is left must match what the log says is left.
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
# Hashed only when set: records from before the log covered tombstones have none.
COVERING_FIELDS = ("tombstones", "tombstones_digest", "expired_of")
TOMBSTONE_FIELDS = (
    "operation_id",
    "caller",
    "key_digest",
    "request_fingerprint",
    "provider",
    "state",
    "done_at",
    "pruned_at",
    "record_seq",
)
_DIGEST_MODULUS = 2**256


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


def _hashed(text: str, key: bytes | None) -> str:
    data = text.encode("utf-8")
    if key:
        return hmac.new(key, data, hashlib.sha256).hexdigest()
    return hashlib.sha256(data).hexdigest()


def _material(fields: Mapping[str, Any], names: Sequence[str]) -> dict[str, Any]:
    material = {name: fields.get(name) for name in names}
    for name, value in material.items():
        if isinstance(value, datetime):
            material[name] = isoformat(value)
    return material


def record_hash(fields: Mapping[str, Any], prev_hash: str, key: bytes | None) -> str:
    material = _material(fields, RECORD_FIELDS)
    for name in COVERING_FIELDS:
        if fields.get(name) is not None:
            material[name] = fields[name]
    return _hashed("retention\n" + prev_hash + "\n" + canonical_json(material), key)


def _tombstone_value(fields: Mapping[str, Any], key: bytes | None) -> int:
    text = "tombstone\n" + canonical_json(_material(fields, TOMBSTONE_FIELDS))
    return int(_hashed(text, key), 16)


def tombstones_digest(stones: Iterable[Mapping[str, Any]], key: bytes | None) -> str:
    """The digest of a set of tombstones (keyed like the log): their hashes' sum."""
    total = sum(_tombstone_value(stone, key) for stone in stones) % _DIGEST_MODULUS
    return f"{total:064x}"


@dataclass
class Kept:
    """The tombstones one record left that are still stored: how many, their digest."""

    count: int = 0
    digest: int = 0

    def add(self, fields: Mapping[str, Any], key: bytes | None) -> None:
        self.count += 1
        self.digest = (self.digest + _tombstone_value(fields, key)) % _DIGEST_MODULUS


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


def check_head(
    records: Sequence[Mapping[str, Any]], head: tuple[int, str] | None
) -> RecordFault | None:
    """The log's last record against the head kept apart (``seq``, ``hash``)."""
    if not records:
        if head is None:
            return None
        return RecordFault(
            None, f"holds no record, but its head names record {head[0]}: records were deleted"
        )
    last = records[-1]
    if head is None:
        return RecordFault(None, f"its head is missing (the log ends at record {last['seq']})")
    if head[0] > last["seq"]:
        missing = head[0] - last["seq"]
        return RecordFault(
            None,
            f"ends at record {last['seq']}, but its head names record {head[0]}: the newest "
            f"{missing} record{'s were' if missing > 1 else ' was'} deleted",
        )
    if (head[0], head[1]) != (last["seq"], last["hash"]):
        return RecordFault(last["seq"], "does not match the log's head (edited or replaced)")
    return None


def check_tombstones(
    records: Sequence[Mapping[str, Any]], kept: Mapping[int, Kept]
) -> RecordFault | None:
    """Each record's tombstones still stored (``kept``, by the record that left them)
    against what the log says is left of them: its count and digest less its expiries'."""
    left: dict[int, tuple[int, int]] = {}
    for record in records:
        count, digest = record.get("tombstones"), record.get("tombstones_digest")
        if count is None or digest is None:
            continue
        expired_of = record.get("expired_of")
        if expired_of is None:
            left[record["seq"]] = (count, int(digest, 16))
        elif expired_of in left:
            was = left[expired_of]
            left[expired_of] = (was[0] - count, (was[1] - int(digest, 16)) % _DIGEST_MODULUS)
    for seq in sorted(kept):
        if seq not in left:
            return RecordFault(
                seq, f"{kept[seq].count} tombstones name it, but the log holds no such prune"
            )
    for seq, (count, digest) in sorted(left.items()):
        found = kept.get(seq, Kept())
        if found.count < count:
            return RecordFault(
                seq,
                f"{count - found.count} of the {count} tombstones it left are missing "
                "(deleted outside retention: their keys would start new jobs)",
            )
        if found.count > count:
            return RecordFault(seq, f"{found.count - count} tombstones more than it left")
        if found.digest != digest:
            return RecordFault(seq, "its tombstones do not match their digest (one was edited)")
    return None


def verify_records(
    records: Sequence[Mapping[str, Any]], key: bytes | None
) -> tuple[RetentionSummary, RecordFault | None]:
    """Check the log (ordered by seq): numbering, links and hashes; and sum up its prunes
    (an expiry's record removes no operation)."""
    prev = GENESIS
    prunes = operations = entries = 0
    done_until: datetime | None = None
    last_at: datetime | None = None
    for expected, record in enumerate(records, start=1):
        seq = record["seq"]
        fault = None
        if seq != expected:
            fault = RecordFault(seq, f"sequence broken: expected record {expected}")
        elif record["prev_hash"] != prev:
            fault = RecordFault(seq, "does not link to the previous record")
        elif record_hash(record, prev, key) != record["hash"]:
            fault = RecordFault(seq, "content does not match its hash (edited)")
        if fault is not None:
            return _summary(prunes, operations, entries, done_until, last_at), fault
        prev = record["hash"]
        if record.get("expired_of") is not None:
            continue
        prunes += 1
        operations += record["operations"]
        entries += record["history_entries"]
        until = record["done_until"]
        done_until = until if done_until is None else max(done_until, until)
        last_at = record["at"]
    return _summary(prunes, operations, entries, done_until, last_at), None


def _summary(
    records: int,
    operations: int,
    entries: int,
    done_until: datetime | None,
    last_at: datetime | None,
) -> RetentionSummary:
    return RetentionSummary(records, operations, entries, done_until, last_at)
