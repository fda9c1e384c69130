"""The history table as read: an operation's entries oldest first (whole or by page), its last hint.

Guarantee: the history is append-only and hash-chained; entries are appended only
by the journal (``storage.journal``), in the transaction of the change they record.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.engine import Connection

from reconciler.core.records import HistoryRecord
from reconciler.core.vocabulary import HistoryKind
from reconciler.storage.fastsql import AS_IS, Sql
from reconciler.storage.tables import HISTORY

ENTRY_COLUMNS = tuple(c.name for c in HISTORY.c)
_COLUMN_LIST = ", ".join(ENTRY_COLUMNS)

_OF_OPERATION = Sql(
    "history-of",
    HISTORY,
    f"SELECT {_COLUMN_LIST} FROM history WHERE operation_id = ? ORDER BY seq",
    params=("operation_id",),
    returns=ENTRY_COLUMNS,
)
_PAGE = Sql(
    "history-page",
    HISTORY,
    f"SELECT {_COLUMN_LIST} FROM history WHERE operation_id = ? AND seq > ? ORDER BY seq LIMIT ?",
    params=("operation_id", "seq", AS_IS),
    returns=ENTRY_COLUMNS,
)
LAST_HINT = Sql(
    "history-last-hint",
    HISTORY,
    "SELECT at FROM history WHERE operation_id = ? AND kind = ? ORDER BY seq DESC LIMIT 1",
    params=("operation_id", "kind"),
    returns=("at",),
)
_LAST_READ_BEFORE = Sql(
    "history-last-read-before",
    HISTORY,
    "SELECT max(at) FROM history WHERE operation_id = ? AND kind = ? AND cause = ? AND at < ?",
    params=("operation_id", "kind", "cause", "at"),
    returns=("at",),
)
_NOTES = Sql(
    "history-notes",
    HISTORY,
    "SELECT detail FROM history WHERE operation_id = ? AND kind = ? AND cause = ? ORDER BY seq",
    params=("operation_id", "kind", "cause"),
    returns=("detail",),
)
_LAST_OF = Sql(
    "history-last-of",
    HISTORY,
    f"SELECT {_COLUMN_LIST} FROM history WHERE operation_id = ? AND kind IN (?*) "
    "AND cause IN (?*) ORDER BY seq DESC LIMIT 1",
    params=("operation_id", "kind", "cause"),
    returns=ENTRY_COLUMNS,
)


def _entry(row: Sequence[Any]) -> HistoryRecord:
    return HistoryRecord(**dict(zip(ENTRY_COLUMNS, row, strict=True)))


def history_of(conn: Connection, operation_id: str) -> list[HistoryRecord]:
    return [_entry(row) for row in _OF_OPERATION.rows(conn, operation_id)]


def history_page(
    conn: Connection, operation_id: str, after_seq: int, limit: int
) -> tuple[list[HistoryRecord], int | None]:
    """Up to ``limit`` entries after ``after_seq``, oldest first, and the seq to go on from."""
    entries = [_entry(row) for row in _PAGE.rows(conn, operation_id, after_seq, limit + 1)]
    more = len(entries) > limit
    entries = entries[:limit]
    return entries, (entries[-1].seq if more and entries else None)


def last_hint_at(conn: Connection, operation_id: str) -> datetime | None:
    value = LAST_HINT.value(conn, operation_id, HistoryKind.HINT.value)
    return value if isinstance(value, datetime) else None


def last_read_before(conn: Connection, operation_id: str, before: datetime) -> datetime | None:
    """When the operation's last status answer recorded before ``before`` was written."""
    value = _LAST_READ_BEFORE.value(
        conn, operation_id, HistoryKind.OBSERVATION.value, "status_read", before
    )
    return value if isinstance(value, datetime) else None


def notes_with_cause(conn: Connection, operation_id: str, cause: str) -> list[dict[str, object]]:
    """The details of an operation's notes with this cause, oldest first."""
    rows = _NOTES.rows(conn, operation_id, HistoryKind.NOTE.value, cause)
    return [dict(row[0] or {}) for row in rows]


def last_of(
    conn: Connection, operation_id: str, kinds: tuple[HistoryKind, ...], causes: tuple[str, ...]
) -> HistoryRecord | None:
    """The operation's latest entry of one of ``kinds`` with one of ``causes``."""
    row = _LAST_OF.first(conn, operation_id, [k.value for k in kinds], list(causes))
    return _entry(row) if row is not None else None
