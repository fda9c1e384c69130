"""The history hash chain: pure functions over entry values (the entries a write appends,
``Entry``, chained on by ``chained``; a stored chain checked by ``verify_chain``).

Each entry's hash covers its own fields and the previous entry's hash, so an
edit, a deletion in the middle or a reordering breaks the chain; the
operation row keeps the head and the count, so deleting the newest entries
breaks the link between row and chain. With a key (``RECONCILER_AUDIT_KEY``)
the hash is an HMAC, so someone with write access to the database but not
the key cannot rebuild a consistent chain after tampering.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from reconciler.core.canonical import canonical_json
from reconciler.core.clock import isoformat
from reconciler.core.states import State
from reconciler.core.vocabulary import DelaySource, HistoryKind

GENESIS = ""
HASHED_FIELDS = (
    "operation_id",
    "seq",
    "at",
    "kind",
    "actor",
    "from_state",
    "to_state",
    "cause",
    "delay_source",
    "detail",
)


def entry_hash(fields: Mapping[str, Any], prev_hash: str, key: bytes | None) -> str:
    material = {name: fields.get(name) for name in HASHED_FIELDS}
    at = material["at"]
    if isinstance(at, datetime):
        material["at"] = isoformat(at)
    text = (prev_hash + "\n" + canonical_json(material)).encode("utf-8")
    if key:
        return hmac.new(key, text, hashlib.sha256).hexdigest()
    return hashlib.sha256(text).hexdigest()


@dataclass(frozen=True)
class Entry:
    """A history entry to append (``at``: None for the time of the write)."""

    kind: HistoryKind
    actor: str
    cause: str
    detail: Mapping[str, Any] | None = None
    delay_source: DelaySource | None = None
    from_state: State | None = None
    to_state: State | None = None
    at: datetime | None = None


def chained(
    operation_id: str,
    head: str,
    seq: int,
    entries: Sequence[Entry],
    now: datetime,
    key: bytes | None,
) -> tuple[list[dict[str, Any]], str, int]:
    """The rows of ``entries``, each hashed on from the one before, the first from ``head``
    (``GENESIS`` for a new chain) at ``seq + 1``; with the new head and seq."""
    rows = []
    for entry in entries:
        seq += 1
        fields = {
            "operation_id": operation_id,
            "seq": seq,
            "at": entry.at or now,
            "kind": entry.kind.value,
            "actor": entry.actor,
            "from_state": entry.from_state.value if entry.from_state else None,
            "to_state": entry.to_state.value if entry.to_state else None,
            "cause": entry.cause,
            "delay_source": entry.delay_source.value if entry.delay_source else None,
            "detail": dict(entry.detail) if entry.detail is not None else None,
        }
        digest = entry_hash(fields, head, key)
        rows.append({**fields, "prev_hash": head, "hash": digest})
        head = digest
    return rows, head, seq


@dataclass(frozen=True)
class ChainFault:
    entry_id: int | None
    operation_id: str
    seq: int | None
    problem: str

    def describe(self) -> str:
        where = f"history entry {self.entry_id}" if self.entry_id is not None else "operation"
        seq = f", seq {self.seq}" if self.seq is not None else ""
        return f"{where} (operation {self.operation_id}{seq}): {self.problem}"


def verify_chain(
    operation_id: str,
    entries: Iterable[Mapping[str, Any]],
    head: str,
    count: int,
    key: bytes | None,
) -> ChainFault | None:
    """Check one operation's entries (ordered by seq) against the row's head and count."""
    prev = GENESIS
    expected_seq = 1
    last: Mapping[str, Any] | None = None
    for entry in entries:
        if entry["seq"] != expected_seq:
            return ChainFault(
                entry["id"],
                operation_id,
                entry["seq"],
                f"sequence broken: expected seq {expected_seq}",
            )
        if entry["prev_hash"] != prev:
            return ChainFault(
                entry["id"], operation_id, entry["seq"], "does not link to the previous entry"
            )
        if entry_hash(entry, prev, key) != entry["hash"]:
            return ChainFault(
                entry["id"], operation_id, entry["seq"], "content does not match its hash (edited)"
            )
        prev = entry["hash"]
        expected_seq += 1
        last = entry
    if expected_seq - 1 != count or prev != head:
        entry_id = last["id"] if last is not None else None
        seq = last["seq"] if last is not None else None
        return ChainFault(
            entry_id,
            operation_id,
            seq,
            f"chain ends at seq {expected_seq - 1} but the operation records "
            f"{count} entries (entries deleted or head altered)",
        )
    return None
