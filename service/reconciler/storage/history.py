"""The history table as read: an operation's entries oldest first (whole or by page), its last hint.

Guarantee: the history is append-only and hash-chained; entries are appended only
by the journal (``storage.journal``), in the transaction of the change they record.
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from reconciler.core.records import HistoryRecord
from reconciler.core.vocabulary import HistoryKind
from reconciler.storage.fastsql import raw_for, run
from reconciler.storage.journal import HISTORY


def history_of(conn: Connection, operation_id: str) -> list[HistoryRecord]:
    rows = conn.execute(
        sa.select(HISTORY).where(HISTORY.c.operation_id == operation_id).order_by(HISTORY.c.seq)
    ).mappings()
    return [HistoryRecord(**dict(r)) for r in rows]


def history_page(
    conn: Connection, operation_id: str, after_seq: int, limit: int
) -> tuple[list[HistoryRecord], int | None]:
    """Up to ``limit`` entries after ``after_seq``, oldest first, and the seq to go on from."""
    rows = conn.execute(
        sa.select(HISTORY)
        .where(HISTORY.c.operation_id == operation_id, HISTORY.c.seq > after_seq)
        .order_by(HISTORY.c.seq)
        .limit(limit + 1)
    ).mappings()
    entries = [HistoryRecord(**dict(r)) for r in rows]
    more = len(entries) > limit
    entries = entries[:limit]
    return entries, (entries[-1].seq if more and entries else None)


def last_hint_at(conn: Connection, operation_id: str) -> datetime | None:
    raw = raw_for(conn.dialect.name)
    sql = raw.statement(
        "last-hint",
        lambda r: (
            f"SELECT at FROM history WHERE operation_id = {r.mark} AND kind = {r.mark} "
            "ORDER BY seq DESC LIMIT 1"
        ),
    )
    row = run(conn, sql, [operation_id, HistoryKind.HINT.value]).fetchone()
    return raw.read_time(row[0]) if row is not None else None


def last_read_before(conn: Connection, operation_id: str, before: datetime) -> datetime | None:
    """When the operation's last status answer recorded before ``before`` was written."""
    value = conn.execute(
        sa.select(sa.func.max(HISTORY.c.at)).where(
            HISTORY.c.operation_id == operation_id,
            HISTORY.c.kind == HistoryKind.OBSERVATION.value,
            HISTORY.c.cause == "status_read",
            HISTORY.c.at < before,
        )
    ).scalar()
    return value if isinstance(value, datetime) else None


def notes_with_cause(conn: Connection, operation_id: str, cause: str) -> list[dict[str, object]]:
    """The details of an operation's notes with this cause, oldest first."""
    rows = conn.execute(
        sa.select(HISTORY.c.detail)
        .where(
            HISTORY.c.operation_id == operation_id,
            HISTORY.c.kind == HistoryKind.NOTE.value,
            HISTORY.c.cause == cause,
        )
        .order_by(HISTORY.c.seq)
    )
    return [dict(r.detail or {}) for r in rows]


def last_of(
    conn: Connection, operation_id: str, kinds: tuple[HistoryKind, ...], causes: tuple[str, ...]
) -> HistoryRecord | None:
    """The operation's latest entry of one of ``kinds`` with one of ``causes``."""
    row = (
        conn.execute(
            sa.select(HISTORY)
            .where(
                HISTORY.c.operation_id == operation_id,
                HISTORY.c.kind.in_([k.value for k in kinds]),
                HISTORY.c.cause.in_(causes),
            )
            .order_by(HISTORY.c.seq.desc())
            .limit(1)
        )
        .mappings()
        .first()
    )
    return HistoryRecord(**dict(row)) if row is not None else None
