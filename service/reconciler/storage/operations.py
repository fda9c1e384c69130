"""The operations table's reads: a record by id or by idempotency key, the list's pages,
counts by state, and what a create checks under its caller's lock.

State changes are not written here but through the journal (``storage.journal``), the
one write path; the lease columns are written by the claims (``storage.leases``).

The reads of the worker's hot path are plain statements (``storage.fastsql``) that
yield plain records (``models.operation_record``); on PostgreSQL a record's parts come
in the same statement.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

from sqlalchemy.engine import Connection

from reconciler.core import ids
from reconciler.core.errors import Gone, InvalidRequest, NotFound
from reconciler.core.principal import Principal
from reconciler.core.records import FIELDS, PAYLOADS, OperationRecord
from reconciler.core.retention import key_digest
from reconciler.core.states import END_STATES, REOPENABLE, State
from reconciler.core.strict_json import shown
from reconciler.storage import payloads
from reconciler.storage.fastsql import AS_IS, Sql
from reconciler.storage.models import record_of_values
from reconciler.storage.retention import (
    TOMBSTONE_BY_KEY,
    TOMBSTONE_COLUMNS,
    Tombstone,
    tombstone_of,
)
from reconciler.storage.tables import OPS, OPS_COLUMNS

BAD_CURSOR = "cursor is not valid; pass the next_cursor of a previous page"
COLUMN_LIST = ", ".join(OPS_COLUMNS)
# A whole record: the row's columns, and on PostgreSQL its parts in the same statement.
_RECORD_LIST = f"{COLUMN_LIST}[[, {payloads.inline()}|]]"
RECORD_RETURNS = (*OPS_COLUMNS, *payloads.INLINE_RETURNS)
IN_FLIGHT = tuple(s.value for s in State if s not in END_STATES)

_BY_IDS = Sql(
    "operations-by-id",
    OPS,
    f"SELECT {_RECORD_LIST} FROM operations WHERE id IN (?*)",
    params=("id",),
    returns=RECORD_RETURNS,
)
_BY_IDS_LOCKED = Sql(
    "operations-by-id-locked",
    OPS,
    f"SELECT {_RECORD_LIST} FROM operations WHERE id IN (?*) [[FOR UPDATE|]]",
    params=("id",),
    returns=RECORD_RETURNS,
)
_BY_KEY = Sql(
    "operation-by-key",
    OPS,
    f"SELECT {COLUMN_LIST} FROM operations WHERE caller = ? AND idempotency_key = ?",
    params=("caller", "idempotency_key"),
    returns=OPS_COLUMNS,
)
# PostgreSQL: the operation with the key and the latest tombstone of one with it, in one
# statement (a create asks for both; each side may be missing, so both join one row).
_BY_KEY_OR_STONE = Sql(
    "operation-or-tombstone-by-key",
    OPS,
    f"SELECT {', '.join(f'operations.{c}' for c in OPS_COLUMNS)}, {payloads.inline()}, "
    f"{', '.join(f'stone.{c}' for c in TOMBSTONE_COLUMNS)} FROM (SELECT 1) AS one "
    "LEFT JOIN operations ON operations.caller = ? AND operations.idempotency_key = ? "
    f"LEFT JOIN LATERAL ({TOMBSTONE_BY_KEY.text}) AS stone ON true",
    params=(
        "caller",
        "idempotency_key",
        *(f"tombstones.{p}" for p in TOMBSTONE_BY_KEY.params),
    ),
    returns=(*RECORD_RETURNS, *(f"tombstones.{c}" for c in TOMBSTONE_COLUMNS)),
)
_COUNT_BY_STATE = Sql(
    "operations-per-state", OPS, "SELECT state, count(*) FROM operations GROUP BY state"
)
_COUNT_IN_STATES = Sql(
    "operations-in-states",
    OPS,
    "SELECT state, count(*) FROM operations WHERE state IN (?*) GROUP BY state",
    params=("state",),
)
_LOCK_CALLER = Sql(
    "caller-lock", OPS, "SELECT pg_advisory_xact_lock(hashtextextended(?, 0))", params=(AS_IS,)
)
_COUNT_IN_FLIGHT = Sql(
    "in-flight-count",
    OPS,
    "SELECT count(*) FROM operations WHERE caller = ? AND state IN (?*)",
    params=("caller", "state"),
)
_CREATED_SINCE = Sql(
    "created-since",
    OPS,
    "SELECT created_at FROM operations WHERE caller = ? AND id >= ? ORDER BY id DESC LIMIT ?",
    params=("caller", "id", AS_IS),
    returns=("created_at",),
)


# An end state its open escalation may reopen.
_REOPENABLE_OPEN = "(escalation_open = ? AND state IN (?*))"
# A decision is pending: ``escalated``, or a reopenable end state with its escalation open
# (``core.states.awaits_decision``, as a condition on the row).
_AWAITING = f"(state = ? OR {_REOPENABLE_OPEN})"
# Nothing more will happen without a new request (``core.states.is_done``).
_DONE = f"(state IN (?*) AND NOT {_REOPENABLE_OPEN})"
# Both read the same three parameters, in this order.
_STATE_OPEN_PARAMS = ("state", "escalation_open", "state")


@cache
def _page_sql(
    operator: bool,
    state: bool,
    done: bool | None,
    awaiting: bool | None,
    provider: bool,
    after: bool,
) -> Sql:
    """A page of the operations list, for one shape of filter (newest first)."""
    where, params = ["1 = 1"], list[str]()
    for on, condition, columns in (
        (not operator, "caller = ?", ("caller",)),
        (state, "state = ?", ("state",)),
        (done is True, _DONE, _STATE_OPEN_PARAMS),
        (done is False, f"NOT {_DONE}", _STATE_OPEN_PARAMS),
        (awaiting is True, _AWAITING, _STATE_OPEN_PARAMS),
        (awaiting is False, f"NOT {_AWAITING}", _STATE_OPEN_PARAMS),
        (provider, "provider = ?", ("provider",)),
        (after, "id < ?", ("id",)),
    ):
        if on:
            where.append(condition)
            params.extend(columns)
    return Sql(
        "operations-page",
        OPS,
        f"SELECT {_RECORD_LIST} FROM operations WHERE {' AND '.join(where)} "
        "ORDER BY id DESC LIMIT ?",
        params=(*params, AS_IS),
        returns=RECORD_RETURNS,
    )


def records_of(conn: Connection, rows: Sequence[Sequence[Any]]) -> list[OperationRecord]:
    """Records from decoded rows in ``OPS_COLUMNS`` order (``records.COLUMNS``), with their
    parts after the columns, as the record's fields run: read here unless the rows carry
    them already (``_RECORD_LIST`` on PostgreSQL)."""
    if not rows:
        return []
    if len(rows[0]) == len(FIELDS):
        return [record_of_values(row) for row in rows]
    parts = payloads.load(conn, [row[0] for row in rows])  # the id is the first column
    built = []
    for row in rows:
        found = parts.get(row[0])
        values = (*row, *[found.get(name) for name in PAYLOADS]) if found else row
        built.append(record_of_values(values))
    return built


def load_records(
    conn: Connection, operation_ids: Sequence[str], *, lock: bool = False
) -> list[OperationRecord]:
    """The operations with these ids (absent ones left out), in no particular order.

    ``lock`` (PostgreSQL): lock the rows for this transaction.
    """
    if not operation_ids:
        return []
    return records_of(conn, (_BY_IDS_LOCKED if lock else _BY_IDS).rows(conn, operation_ids))


_TRACE_OF_JOB = Sql(
    "operation-trace-by-job",
    OPS,
    "SELECT id, trace_id, traceparent FROM operations WHERE provider = ? AND remote_job_id = ?",
    params=("provider", "remote_job_id"),
    returns=("id", "trace_id", "traceparent"),
)


def trace_of_job(
    conn: Connection, provider: str, job_id: str
) -> tuple[str, str, str | None] | None:
    """The id, ``trace_id`` and ``traceparent`` of the operation a provider's job id names."""
    row = _TRACE_OF_JOB.first(conn, provider, job_id)
    return (row[0], row[1], row[2]) if row is not None else None


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
    """The operation if this caller may see it; agents see their own only (else 404). One
    that retention pruned is ``Gone`` (410) while its tombstone lasts."""
    op = get_operation(conn, operation_id)
    if op is not None and (principal.is_operator or op.caller == principal.name):
        return op
    if op is None:
        stone = tombstone_of(conn, operation_id)
        if stone is not None and (principal.is_operator or stone.caller == principal.name):
            raise Gone(stone.gone())
    raise NotFound(f"operation {shown(operation_id)} does not exist")


def find_key(
    conn: Connection, caller: str, key: str
) -> tuple[OperationRecord | None, Tombstone | None]:
    """The caller's operation with this idempotency key, and else the tombstone of the
    last one retention pruned (``Gone`` for a key reused); on PostgreSQL in one statement."""
    if conn.dialect.name != "postgresql":
        found = records_of(conn, _BY_KEY.rows(conn, caller, key))
        if found:
            return found[0], None
        stone = TOMBSTONE_BY_KEY.first(conn, caller, key_digest(key))
        return None, None if stone is None else Tombstone(*stone)
    row = _BY_KEY_OR_STONE.first(conn, caller, key, caller, key_digest(key))
    assert row is not None  # the one row the statement always has
    width = len(FIELDS)
    if row[0] is not None:
        return record_of_values(row[:width]), None
    stone = row[width:]
    return None, None if stone[0] is None else Tombstone(*stone)


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
    awaiting_decision: bool | None = None,
) -> Page:
    """Newest first; the cursor is the last id of the previous page. ``done`` and
    ``awaiting_decision`` are conditions on the rows, so a page is full whatever they leave
    out."""
    sql = _page_sql(
        principal.is_operator,
        state is not None,
        done,
        awaiting_decision,
        provider is not None,
        cursor is not None,
    )
    values: list[Any] = [] if principal.is_operator else [principal.name]
    if state is not None:
        values.append(state.value)
    if done is not None:
        values += [_END_VALUES, True, _REOPENABLE_VALUES]
    if awaiting_decision is not None:
        values += [State.ESCALATED.value, True, _REOPENABLE_VALUES]
    if provider is not None:
        values.append(provider)
    if cursor is not None:
        values.append(decode_cursor(cursor))
    rows = sql.rows(conn, *values, limit + 1)
    items = records_of(conn, rows[:limit])
    more = len(rows) > limit
    return Page(items, encode_cursor(items[-1].id) if more and items else None)


_END_VALUES = tuple(s.value for s in END_STATES)
_REOPENABLE_VALUES = tuple(s.value for s in REOPENABLE)


def count_by_state(conn: Connection, *, ended: bool | None = None) -> dict[str, int]:
    """Operations by state: all, or only the ended ones (``ended``), or only those in flight
    (a range of ``ix_operations_state_id`` per state, as long as what is in flight)."""
    if ended is None:
        rows = _COUNT_BY_STATE.rows(conn)
    else:
        states = _END_VALUES if ended else IN_FLIGHT
        rows = _COUNT_IN_STATES.rows(conn, states)
    return {str(state): int(count) for state, count in rows}


def lock_caller(conn: Connection, caller: str) -> None:
    """Serialise one agent's creates for this transaction, so its quotas are exact.

    PostgreSQL: a transaction-scoped advisory lock on the caller; SQLite serialises every
    write transaction already.
    """
    if conn.dialect.name == "postgresql":
        _LOCK_CALLER.run(conn, f"quota\x1f{caller}")


def count_in_flight(conn: Connection, caller: str) -> int:
    """The caller's operations not yet in an end state (an index range per state)."""
    return int(_COUNT_IN_FLIGHT.value(conn, caller, IN_FLIGHT))


def created_since(conn: Connection, caller: str, since: datetime, limit: int) -> list[datetime]:
    """Creation times of the caller's operations from ``since`` on, oldest first (at most
    ``limit``). Operation ids sort by creation time, so this is a range of the caller index."""
    rows = _CREATED_SINCE.rows(conn, caller, ids.operation_id_floor(since), limit)
    return sorted(row[0] for row in rows)
