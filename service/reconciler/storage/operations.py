"""The operations table: reads, listing, and the lease columns (claims, release, renewal).

Guarantee: each operation has one owner at a time. State changes are not
written here but through the journal (``storage.journal``), the one write path.

Lease claims are single conditional statements (state rules in the write,
not check-then-act): on PostgreSQL ``FOR UPDATE SKIP LOCKED`` lets replicas
claim disjoint batches without waiting on each other; on SQLite the claim is
one ``UPDATE ... WHERE id IN (...) AND <still free>`` inside a write
transaction, which SQLite serialises. The claim returns each row as it is once
the lease is ours (``RETURNING``, in the same statement): that is the reload
after the claim, with nothing between owning the row and reading it.

The reads and lease writes of the worker's hot path are plain statements
(``storage.fastsql``) that yield plain records (``models.operation_record``).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from reconciler.core import ids
from reconciler.core.completion_lanes import CALLBACK_PREFIX
from reconciler.core.errors import InvalidRequest, NotFound
from reconciler.core.records import PAYLOADS, OperationRecord
from reconciler.core.states import END_STATES, State
from reconciler.core.strict_json import shown
from reconciler.storage import payloads
from reconciler.storage.fastsql import Raw, raw_for, run
from reconciler.storage.journal import OPS
from reconciler.storage.models import operation_record, record_of_values
from reconciler.storage.tokens import Principal

MAX_PAGE = 200
BAD_CURSOR = "cursor is not valid; pass the next_cursor of a previous page"
OPS_COLUMNS = tuple(c.name for c in OPS.c)
_COLUMN_LIST = ", ".join(OPS_COLUMNS)


def _with_parts(conn: Connection, rows: Sequence[Any]) -> list[OperationRecord]:
    """Records from rows, with the parts read beside the row (all but the request)."""
    parts = payloads.load(conn, [r["id"] for r in rows])
    return [operation_record(r, parts.get(r["id"])) for r in rows]


def records_of(conn: Connection, rows: Sequence[Sequence[Any]]) -> list[OperationRecord]:
    """Plain records from stored rows in ``OPS_COLUMNS`` order, with their parts."""
    if not rows:
        return []
    raw = raw_for(conn.dialect.name)
    decode = raw.row_decoder(OPS, OPS_COLUMNS)
    decoded = [decode(row) for row in rows]
    parts = payloads.load(conn, [values[0] for values in decoded])  # the id is the first column
    for values in decoded:
        found = parts.get(values[0])
        if found:
            values.extend([found.get(name) for name in PAYLOADS])
    return [record_of_values(values) for values in decoded]


def load_records(
    conn: Connection, operation_ids: Sequence[str], *, lock: bool = False
) -> list[OperationRecord]:
    """The operations with these ids (absent ones left out), in no particular order.

    ``lock`` (PostgreSQL): lock the rows for this transaction.
    """
    if not operation_ids:
        return []
    raw = raw_for(conn.dialect.name)
    where, params = raw.in_list("id", operation_ids)
    sql = f"SELECT {_COLUMN_LIST} FROM operations WHERE {where}"
    if lock and not raw.sqlite:
        sql += " FOR UPDATE"
    return records_of(conn, run(conn, sql, params).fetchall())


def get_operation(conn: Connection, operation_id: str) -> OperationRecord | None:
    found = load_records(conn, [operation_id])
    return found[0] if found else None


def load_operation(conn: Connection, operation_id: str) -> OperationRecord:
    """The operation, or ``NotFound``."""
    op = get_operation(conn, operation_id)
    if op is None:
        raise NotFound(f"operation {shown(operation_id)} does not exist")
    return op


def visible_operation(conn: Connection, operation_id: str, principal: Principal) -> OperationRecord:
    """The operation if this caller may see it; agents see their own only (else 404)."""
    op = get_operation(conn, operation_id)
    if op is None or (not principal.is_operator and op.caller != principal.name):
        raise NotFound(f"operation {shown(operation_id)} does not exist")
    return op


def find_by_key(conn: Connection, caller: str, key: str) -> OperationRecord | None:
    raw = raw_for(conn.dialect.name)
    sql = raw.statement(
        "find-by-key",
        lambda r: (
            f"SELECT {_COLUMN_LIST} FROM operations "
            f"WHERE caller = {r.mark} AND idempotency_key = {r.mark}"
        ),
    )
    found = records_of(conn, run(conn, sql, [caller, key]).fetchall())
    return found[0] if found else None


@dataclass(frozen=True)
class Page:
    items: list[OperationRecord]
    next_cursor: str | None


def encode_cursor(operation_id: str) -> str:
    return base64.urlsafe_b64encode(operation_id.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> str:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        value = base64.urlsafe_b64decode(padded.encode()).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise InvalidRequest(BAD_CURSOR) from None
    if not value.startswith("op_"):
        raise InvalidRequest(BAD_CURSOR)
    return value


def list_operations(
    conn: Connection,
    principal: Principal,
    *,
    state: State | None,
    provider: str | None,
    limit: int,
    cursor: str | None,
    done: bool | None = None,
) -> Page:
    """Newest first; the cursor is the last id of the previous page."""
    query = sa.select(OPS)
    if not principal.is_operator:
        query = query.where(OPS.c.caller == principal.name)
    if state is not None:
        query = query.where(OPS.c.state == state.value)
    if done is not None:
        ends = [s.value for s in END_STATES]
        query = query.where(OPS.c.state.in_(ends) if done else OPS.c.state.not_in(ends))
    if provider is not None:
        query = query.where(OPS.c.provider == provider)
    if cursor is not None:
        query = query.where(OPS.c.id < decode_cursor(cursor))
    rows = conn.execute(query.order_by(OPS.c.id.desc()).limit(limit + 1)).mappings().all()
    items = _with_parts(conn, rows[:limit])
    more = len(rows) > limit
    return Page(items, encode_cursor(items[-1].id) if more and items else None)


class Lanes(StrEnum):
    """Which completion lanes a share claims (``core.completion_lanes``)."""

    HOOKS = "hooks"  # the hooks lane, and completions with no lane yet
    CALLBACKS = "callbacks"  # every callback host's lane


@dataclass(frozen=True)
class ShareFilter:
    """Which operations one share of a worker may claim.

    ``completion=True``: operations whose completion handler is due (an end state with
    ``completion_pending``), whatever their provider; ``completion=False`` excludes them.
    ``provider`` narrows to one provider; ``lanes`` to the hooks or the callback lanes,
    leaving out the ``exclude`` ones (callback hosts whose share is full).
    """

    provider: str | None = None
    completion: bool | None = None
    lanes: Lanes | None = None
    exclude: tuple[str, ...] = ()


_END_VALUES = tuple(s.value for s in END_STATES)
_FREE = "(lease_expires_at IS NULL OR lease_expires_at <= {m})"


def _share_sql(raw: Raw, share: ShareFilter | None) -> tuple[str, list[Any]]:
    """The share's condition as SQL text and its parameters."""
    if share is None:
        return "", []
    sql, params = "", list[Any]()
    if share.provider is not None:
        sql += f" AND provider = {raw.mark}"
        params.append(share.provider)
    if share.completion is not None:
        ends, values = raw.in_list("state", _END_VALUES)
        completing = f"(completion_pending = {raw.mark} AND {ends})"
        sql += f" AND {completing}" if share.completion else f" AND NOT {completing}"
        params += [True, *values]
    if share.lanes is Lanes.HOOKS:
        sql += f" AND (completion_lane IS NULL OR completion_lane NOT LIKE {raw.mark})"
        params.append(f"{CALLBACK_PREFIX}%")
    elif share.lanes is Lanes.CALLBACKS:
        sql += f" AND completion_lane LIKE {raw.mark}"
        params.append(f"{CALLBACK_PREFIX}%")
        if share.exclude:
            where, lanes = raw.in_list("completion_lane", list(share.exclude))
            sql += f" AND NOT {where}"
            params += lanes
    return sql, params


def _due_sql(raw: Raw, share_sql: str) -> str:
    free = _FREE.format(m=raw.mark)
    lock = "" if raw.sqlite else " FOR UPDATE SKIP LOCKED"
    return (
        f"SELECT id, lease_owner, completion_lane FROM operations "
        f"WHERE next_poll_at <= {raw.mark} AND {free}"
        f"{share_sql} ORDER BY next_poll_at LIMIT {raw.mark}{lock}"
    )


# Given the due candidates (id, lane), earliest first: the ids to claim.
Pick = Callable[[list[tuple[str, str]]], list[str]]


def claim_records(
    conn: Connection,
    owner: str,
    now: datetime,
    lease_seconds: float,
    limit: int,
    share: ShareFilter | None = None,
    pick: Pick | None = None,
) -> list[tuple[OperationRecord, str | None]]:
    """Lease up to ``limit`` due operations to ``owner``, earliest due first.

    Returns each claimed operation as stored once the lease is ours, with the previous
    holder of an expired lease (None if it was free). The candidates are locked as they
    are read (PostgreSQL: ``FOR UPDATE SKIP LOCKED``; SQLite: the write transaction is
    ``BEGIN IMMEDIATE``), and the lease is re-checked in the UPDATE itself, so two
    claimers can never both win a row. ``share`` limits the claim to what one share of
    the worker can start now; ``pick`` chooses among the candidates (per-host caps).
    """
    raw = raw_for(conn.dialect.name)
    share_sql, share_params = _share_sql(raw, share)
    stamp = raw.time(now)
    due = raw.statement(("claim-due", share_sql), lambda r: _due_sql(r, share_sql))
    rows = run(conn, due, [stamp, stamp, *share_params, limit]).fetchall()
    candidates = {row[0]: row[1] for row in rows}
    if pick is not None:
        chosen = set(pick([(row[0], row[2] or "") for row in rows]))
        candidates = {k: v for k, v in candidates.items() if k in chosen}
    if not candidates:
        return []
    where, ids = raw.in_list("id", list(candidates))
    free = _FREE.format(m=raw.mark)
    sql = (
        f"UPDATE operations SET lease_owner = {raw.mark}, lease_expires_at = {raw.mark} "
        f"WHERE {where} AND {free} RETURNING {_COLUMN_LIST}"
    )
    until = raw.time(now + timedelta(seconds=lease_seconds))
    ops = records_of(conn, run(conn, sql, [owner, until, *ids, stamp]).fetchall())
    ops.sort(key=lambda op: op.next_poll_at or now)
    return [(op, candidates[op.id]) for op in ops]


STATUS_READ_STATES = (State.OBSERVING, State.CANCELLING)


def any_status_read_due_before(
    conn: Connection, now: datetime, before: datetime, skip_source: str
) -> bool:
    """Whether any status read unleased at ``now`` was due before ``before`` (one probe).

    The same rows as ``due_status_reads`` but only asks for the most overdue one: the
    catch-up looks at them all only when there is one long overdue.
    """
    raw = raw_for(conn.dialect.name)
    states, params = raw.in_list("state", [s.value for s in STATUS_READ_STATES])
    sql = raw.statement(
        ("status-read-overdue", states),
        lambda r: (
            f"SELECT id FROM operations WHERE next_poll_at < {r.mark} AND {states} "
            f"AND {_FREE.format(m=r.mark)} "
            f"AND (delay_source IS NULL OR delay_source != {r.mark}) LIMIT 1"
        ),
    )
    params = [raw.time(before), *params, raw.time(now), skip_source]
    return run(conn, sql, params).fetchone() is not None


def due_status_reads(
    conn: Connection, now: datetime, skip_source: str, limit: int
) -> list[OperationRecord]:
    """Unleased operations whose next status read is due, except those ``skip_source`` set.

    For the catch-up spread (``engine.catch_up``), which reschedules them in the same
    transaction; on PostgreSQL rows another replica holds locked are skipped.
    """
    free = sa.or_(OPS.c.lease_expires_at.is_(None), OPS.c.lease_expires_at <= now)
    query = (
        sa.select(OPS)
        .where(
            OPS.c.next_poll_at <= now,
            OPS.c.state.in_([s.value for s in STATUS_READ_STATES]),
            free,
            sa.or_(OPS.c.delay_source.is_(None), OPS.c.delay_source != skip_source),
        )
        .order_by(OPS.c.next_poll_at)
        .limit(limit)
    )
    if conn.dialect.name == "postgresql":
        query = query.with_for_update(skip_locked=True)
    return [operation_record(r) for r in conn.execute(query).mappings()]


def release(conn: Connection, operation_ids: Sequence[str], owner: str) -> dict[str, Any]:
    """Give leases back (only those still ours); returns the released ones' next due times."""
    if not operation_ids:
        return {}
    raw = raw_for(conn.dialect.name)
    where, ids = raw.in_list("id", operation_ids)
    sql = (
        "UPDATE operations SET lease_owner = NULL, lease_expires_at = NULL "
        f"WHERE {where} AND lease_owner = {raw.mark} RETURNING id, next_poll_at"
    )
    rows = run(conn, sql, [*ids, owner]).fetchall()
    return {op_id: raw.read_time(at) for op_id, at in rows}


def extend_lease(
    conn: Connection, operation_id: str, owner: str, now: datetime, lease_seconds: float
) -> bool:
    """Push a held, unexpired lease forward; False if it is no longer ours."""
    raw = raw_for(conn.dialect.name)
    m = raw.mark
    sql = (
        f"UPDATE operations SET lease_expires_at = {m} "
        f"WHERE id = {m} AND lease_owner = {m} AND lease_expires_at > {m}"
    )
    until = raw.time(now + timedelta(seconds=lease_seconds))
    cursor = run(conn, sql, [until, operation_id, owner, raw.time(now)])
    return bool(cursor.rowcount == 1)


def count_by_state(conn: Connection) -> dict[str, int]:
    rows = conn.execute(sa.select(OPS.c.state, sa.func.count()).group_by(OPS.c.state))
    return {str(state): int(count) for state, count in rows}


_LOCK_CALLER = sa.text("SELECT pg_advisory_xact_lock(hashtextextended(:key, 0))")
IN_FLIGHT = tuple(s.value for s in State if s not in END_STATES)


def lock_caller(conn: Connection, caller: str) -> None:
    """Serialise one agent's creates for this transaction, so its quotas are exact.

    PostgreSQL: a transaction-scoped advisory lock on the caller; SQLite serialises every
    write transaction already.
    """
    if conn.dialect.name == "postgresql":
        conn.execute(_LOCK_CALLER, {"key": f"quota\x1f{caller}"})


def count_in_flight(conn: Connection, caller: str) -> int:
    """The caller's operations not yet in an end state (an index range per state)."""
    query = (
        sa.select(sa.func.count())
        .select_from(OPS)
        .where(OPS.c.caller == caller, OPS.c.state.in_(IN_FLIGHT))
    )
    return int(conn.execute(query).scalar_one())


def created_since(conn: Connection, caller: str, since: datetime, limit: int) -> list[datetime]:
    """Creation times of the caller's operations from ``since`` on, oldest first (at most
    ``limit``). Operation ids sort by creation time, so this is a range of the caller index."""
    query = (
        sa.select(OPS.c.created_at)
        .where(OPS.c.caller == caller, OPS.c.id >= ids.operation_id_floor(since))
        .order_by(OPS.c.id.desc())
        .limit(limit)
    )
    return sorted(conn.execute(query).scalars())
