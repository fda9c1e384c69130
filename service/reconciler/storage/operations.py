"""The operations table: reads, listing, and the lease columns (claims, release, renewal).

Guarantee: each operation has one owner at a time. State changes are not
written here but through the journal (``storage.journal``), the one write path.

Lease claims are single conditional statements (state rules in the write,
not check-then-act): on PostgreSQL ``FOR UPDATE SKIP LOCKED`` lets replicas
claim disjoint batches without waiting on each other; on SQLite the claim is
one ``UPDATE ... WHERE id IN (...) AND <still free>`` inside a write
transaction, which SQLite serialises.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from reconciler.core import ids
from reconciler.core.states import END_STATES, State
from reconciler.errors import InvalidRequest, NotFound
from reconciler.storage import payloads
from reconciler.storage.journal import OPS
from reconciler.storage.models import Operation, operation_record
from reconciler.storage.tokens import Principal

MAX_PAGE = 200
BAD_CURSOR = "cursor is not valid; pass the next_cursor of a previous page"


def _with_parts(conn: Connection, rows: Sequence[Any]) -> list[Operation]:
    """Records from rows, with the parts read beside the row (all but the request)."""
    parts = payloads.load(conn, [r["id"] for r in rows])
    return [operation_record(r, parts.get(r["id"])) for r in rows]


def get_operation(conn: Connection, operation_id: str) -> Operation | None:
    row = conn.execute(sa.select(OPS).where(OPS.c.id == operation_id)).mappings().first()
    return _with_parts(conn, [row])[0] if row is not None else None


def load_operation(conn: Connection, operation_id: str) -> Operation:
    """The operation, or ``NotFound``."""
    op = get_operation(conn, operation_id)
    if op is None:
        raise NotFound(f"operation {operation_id} does not exist")
    return op


def visible_operation(conn: Connection, operation_id: str, principal: Principal) -> Operation:
    """The operation if this caller may see it; agents see their own only (else 404)."""
    op = get_operation(conn, operation_id)
    if op is None or (not principal.is_operator and op.caller != principal.name):
        raise NotFound(f"operation {operation_id} does not exist")
    return op


def find_by_key(conn: Connection, caller: str, key: str) -> Operation | None:
    row = (
        conn.execute(sa.select(OPS).where(OPS.c.caller == caller, OPS.c.idempotency_key == key))
        .mappings()
        .first()
    )
    return _with_parts(conn, [row])[0] if row is not None else None


@dataclass(frozen=True)
class Page:
    items: list[Operation]
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


@dataclass(frozen=True)
class Claim:
    operation_id: str
    taken_over_from: str | None  # a previous holder whose lease expired (it stopped or hung)


def claim_due(
    conn: Connection, owner: str, now: datetime, lease_seconds: float, limit: int
) -> list[Claim]:
    """Lease up to ``limit`` due operations to ``owner``, earliest due first.

    The candidates are locked as they are read (PostgreSQL: ``FOR UPDATE SKIP LOCKED``;
    SQLite: the write transaction is ``BEGIN IMMEDIATE``), and the lease is re-checked in
    the UPDATE itself, so two claimers can never both win a row.
    """
    free = sa.or_(OPS.c.lease_expires_at.is_(None), OPS.c.lease_expires_at <= now)
    due = (
        sa.select(OPS.c.id, OPS.c.lease_owner)
        .where(OPS.c.next_poll_at <= now, free)
        .order_by(OPS.c.next_poll_at)
        .limit(limit)
    )
    if conn.dialect.name == "postgresql":
        due = due.with_for_update(skip_locked=True)
    candidates = {r.id: r.lease_owner for r in conn.execute(due)}
    if not candidates:
        return []
    result = conn.execute(
        sa.update(OPS)
        .where(OPS.c.id.in_(list(candidates)), free)
        .values(lease_owner=owner, lease_expires_at=now + timedelta(seconds=lease_seconds))
        .returning(OPS.c.id, OPS.c.next_poll_at)
    )
    rows = sorted(result.all(), key=lambda r: r.next_poll_at)
    return [Claim(r.id, candidates[r.id]) for r in rows]


def release(conn: Connection, operation_ids: Sequence[str], owner: str) -> None:
    """Give leases back (only those still ours)."""
    if not operation_ids:
        return
    conn.execute(
        sa.update(OPS)
        .where(OPS.c.id.in_(list(operation_ids)), OPS.c.lease_owner == owner)
        .values(lease_owner=None, lease_expires_at=None)
    )


def extend_lease(
    conn: Connection, operation_id: str, owner: str, now: datetime, lease_seconds: float
) -> bool:
    """Push a held, unexpired lease forward; False if it is no longer ours."""
    result = conn.execute(
        sa.update(OPS)
        .where(OPS.c.id == operation_id, OPS.c.lease_owner == owner, OPS.c.lease_expires_at > now)
        .values(lease_expires_at=now + timedelta(seconds=lease_seconds))
    )
    return result.rowcount == 1


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
