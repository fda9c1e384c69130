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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from functools import cache
from typing import Any

from sqlalchemy.engine import Connection

from reconciler.core import ids
from reconciler.core.completion_lanes import CALLBACK_PREFIX
from reconciler.core.errors import Gone, InvalidRequest, NotFound
from reconciler.core.records import FIELDS, PAYLOADS, OperationRecord
from reconciler.core.retention import key_digest
from reconciler.core.states import END_STATES, REOPENABLE, State
from reconciler.core.strict_json import shown
from reconciler.storage import commit_tail, payloads
from reconciler.storage.fastsql import AS_IS, Bound, Sql
from reconciler.storage.models import record_of_values
from reconciler.storage.retention import (
    TOMBSTONE_BY_KEY,
    TOMBSTONE_COLUMNS,
    Tombstone,
    tombstone_of,
)
from reconciler.storage.tables import OPS, OPS_COLUMNS
from reconciler.storage.tokens import Principal

MAX_PAGE = 200
BAD_CURSOR = "cursor is not valid; pass the next_cursor of a previous page"
_COLUMN_LIST = ", ".join(OPS_COLUMNS)
# A whole record: the row's columns, and on PostgreSQL its parts in the same statement.
_RECORD_LIST = f"{_COLUMN_LIST}[[, {payloads.inline()}|]]"
# The claim's: with the create request of those whose next step sends it.
_SENDS_REQUEST = f"state = '{State.CREATE_PENDING.value}'"
_CLAIMED_LIST = f"{_COLUMN_LIST}[[, {payloads.inline(_SENDS_REQUEST)}|]]"
_RECORD_RETURNS = (*OPS_COLUMNS, *payloads.INLINE_RETURNS)
# Free to claim: never leased, or the lease ran out.
_FREE = "(lease_expires_at IS NULL OR lease_expires_at <= ?)"
# The due reads are found by ``next_poll_at`` (``ix_operations_due``: the few rows due, not
# the many in flight). SQLite keeps no statistics, so its planner prefers an equality or
# IN on another indexed column (``state``, ``provider``) to that range, and then reads
# every row in that state or of that provider: a tick grew with the work in flight. A
# unary plus hides the column from SQLite's planner; PostgreSQL plans from its statistics
# and has no unary plus on text.
_STATE = "[[state|+state]]"
_PROVIDER = "[[provider|+provider]]"
STATUS_READ_STATES = (State.OBSERVING, State.CANCELLING)
IN_FLIGHT = tuple(s.value for s in State if s not in END_STATES)

_BY_IDS = Sql(
    "operations-by-id",
    OPS,
    f"SELECT {_RECORD_LIST} FROM operations WHERE id IN (?*)",
    params=("id",),
    returns=_RECORD_RETURNS,
)
_BY_IDS_LOCKED = Sql(
    "operations-by-id-locked",
    OPS,
    f"SELECT {_RECORD_LIST} FROM operations WHERE id IN (?*) [[FOR UPDATE|]]",
    params=("id",),
    returns=_RECORD_RETURNS,
)
_BY_KEY = Sql(
    "operation-by-key",
    OPS,
    f"SELECT {_COLUMN_LIST} FROM operations WHERE caller = ? AND idempotency_key = ?",
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
    returns=(*_RECORD_RETURNS, *(f"tombstones.{c}" for c in TOMBSTONE_COLUMNS)),
)
_CLAIM = Sql(
    "operations-claim",
    OPS,
    f"UPDATE operations SET lease_owner = ?, lease_expires_at = ? "
    f"WHERE id IN (?*) AND {_FREE} RETURNING {_CLAIMED_LIST}",
    params=("lease_owner", "lease_expires_at", "id", "lease_expires_at"),
    returns=_RECORD_RETURNS,
)
_STATUS_READ_OVERDUE = Sql(
    "status-read-overdue",
    OPS,
    f"SELECT id FROM operations WHERE next_poll_at < ? AND {_STATE} IN (?*) AND {_FREE} "
    "AND (delay_source IS NULL OR NOT (delay_source IN (?*))) ORDER BY next_poll_at LIMIT 1",
    params=("next_poll_at", "state", "lease_expires_at", "delay_source"),
)
_STATUS_READS_DUE = Sql(
    "status-reads-due",
    OPS,
    f"SELECT {_COLUMN_LIST} FROM operations WHERE next_poll_at <= ? AND {_STATE} IN (?*) "
    f"AND {_FREE} AND (delay_source IS NULL OR NOT (delay_source IN (?*))) "
    "ORDER BY next_poll_at LIMIT ? [[FOR UPDATE SKIP LOCKED|]]",
    params=("next_poll_at", "state", "lease_expires_at", "delay_source", AS_IS),
    returns=OPS_COLUMNS,
)
_RELEASE = Sql(
    "operations-release",
    OPS,
    "UPDATE operations SET lease_owner = NULL, lease_expires_at = NULL "
    "WHERE id IN (?*) AND lease_owner = ? RETURNING id, next_poll_at",
    params=("id", "lease_owner"),
    returns=("id", "next_poll_at"),
)
_EXTEND_LEASE = Sql(
    "lease-extend",
    OPS,
    "UPDATE operations SET lease_expires_at = ? "
    "WHERE id = ? AND lease_owner = ? AND lease_expires_at > ?",
    params=("lease_expires_at", "id", "lease_owner", "lease_expires_at"),
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
_ENDED_STATES = sorted(state.value for state in END_STATES)
_FLIGHT_STATES = sorted(state.value for state in State if state not in END_STATES)
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
        returns=_RECORD_RETURNS,
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
_REOPENABLE_VALUES = tuple(s.value for s in REOPENABLE)


@cache
def _due_sql(provider: bool, completion: bool | None, lanes: Lanes | None, exclude: bool) -> Sql:
    """The due candidates one shape of share may claim, earliest first, locked as read."""
    where, params = [f"next_poll_at <= ? AND {_FREE}"], ["next_poll_at", "lease_expires_at"]
    if provider:
        where.append(f"{_PROVIDER} = ?")
        params.append("provider")
    if completion is not None:
        completing = f"(completion_pending = ? AND {_STATE} IN (?*))"
        where.append(completing if completion else f"NOT {completing}")
        params += ["completion_pending", "state"]
    if lanes is Lanes.HOOKS:
        where.append("(completion_lane IS NULL OR completion_lane NOT LIKE ?)")
        params.append(AS_IS)
    elif lanes is Lanes.CALLBACKS:
        where.append("completion_lane LIKE ?")
        params.append(AS_IS)
        if exclude:
            where.append("NOT completion_lane IN (?*)")
            params.append("completion_lane")
    return Sql(
        "claim-due",
        OPS,
        f"SELECT id, lease_owner, completion_lane, next_poll_at FROM operations "
        f"WHERE {' AND '.join(where)} ORDER BY next_poll_at LIMIT ? [[FOR UPDATE SKIP LOCKED|]]",
        params=(*params, AS_IS),
        returns=(AS_IS, AS_IS, AS_IS, "next_poll_at"),
    )


@cache
def _due_together(parts: tuple[Sql, ...]) -> Sql:
    """PostgreSQL: several shares' ``_due_sql`` as one statement, each row led by the
    number of its share, in share order, earliest due first within each."""
    ctes = ", ".join(f"share_{i} AS ({sql.text})" for i, sql in enumerate(parts))
    picks = " UNION ALL ".join(f"SELECT {i}, * FROM share_{i}" for i in range(len(parts)))
    return Sql(
        "claim-due-together",
        OPS,
        f"WITH {ctes} {picks} ORDER BY 1, 5",
        params=[p for sql in parts for p in sql.params],
        returns=(AS_IS, AS_IS, AS_IS, AS_IS, "next_poll_at"),
    )


def _due_of(share: ShareFilter | None, now: datetime, limit: int) -> tuple[Sql, list[Any]]:
    """One share's ``_due_sql`` and its values."""
    share = share or ShareFilter()
    sql = _due_sql(share.provider is not None, share.completion, share.lanes, bool(share.exclude))
    values: list[Any] = [now, now]
    if share.provider is not None:
        values.append(share.provider)
    if share.completion is not None:
        values += [True, _END_VALUES]
    if share.lanes is not None:
        values.append(f"{CALLBACK_PREFIX}%")
    if share.lanes is Lanes.CALLBACKS and share.exclude:
        values.append(share.exclude)
    return sql, [*values, limit]


# Given the due candidates (id, lane), earliest first: the ids to claim.
Pick = Callable[[list[tuple[str, str]]], list[str]]


@dataclass(frozen=True)
class Ask:
    """One share's part of a claim: how many at most, which rows, how to choose among them
    (``Pick``: per-host caps; None: the earliest)."""

    limit: int
    share: ShareFilter | None = None
    pick: Pick | None = None


Claimed = list[tuple[OperationRecord, str | None]]


def claim_records(
    conn: Connection,
    owner: str,
    now: datetime,
    lease_seconds: float,
    limit: int,
    share: ShareFilter | None = None,
    pick: Pick | None = None,
) -> Claimed:
    """Lease up to ``limit`` due operations to ``owner``, earliest due first.

    Returns each claimed operation as stored once the lease is ours, with the previous
    holder of an expired lease (None if it was free). The candidates are locked as they
    are read (PostgreSQL: ``FOR UPDATE SKIP LOCKED``; SQLite: the write transaction is
    ``BEGIN IMMEDIATE``), and the lease is re-checked in the UPDATE itself, so two
    claimers can never both win a row. ``share`` limits the claim to what one share of
    the worker can start now; ``pick`` chooses among the candidates (per-host caps).
    """
    return claim_shares(conn, owner, now, lease_seconds, {"": Ask(limit, share, pick)})[""]


def claim_shares(
    conn: Connection, owner: str, now: datetime, lease_seconds: float, asks: Mapping[str, Ask]
) -> dict[str, Claimed]:
    """``claim_records`` for several shares at once (their filters are disjoint). On
    PostgreSQL every share's candidates are one statement and every lease one more: a
    claim is two round trips, not two a share. SQLite reads share by share."""
    found: dict[str, list[Any]] = {}
    if conn.dialect.name == "postgresql" and len(asks) > 1:
        parts = [_due_of(ask.share, now, ask.limit) for ask in asks.values()]
        keys = list(asks)
        together = _due_together(tuple(sql for sql, _ in parts))
        for index, *row in together.rows(conn, *[v for _, values in parts for v in values]):
            found.setdefault(keys[index], []).append(row)
    else:
        for key, ask in asks.items():
            sql, values = _due_of(ask.share, now, ask.limit)
            found[key] = sql.rows(conn, *values)
    share_of: dict[str, str] = {}
    previous: dict[str, str | None] = {}
    for key, rows in found.items():
        pick = asks[key].pick
        chosen = set(pick([(r[0], r[2] or "") for r in rows])) if pick is not None else None
        for row in rows:
            if chosen is None or row[0] in chosen:
                share_of[row[0]] = key
                previous[row[0]] = row[1]
    out: dict[str, Claimed] = {key: [] for key in asks}
    if not previous:
        return out
    until = now + timedelta(seconds=lease_seconds)
    ops = records_of(conn, _CLAIM.rows(conn, owner, until, list(previous), now))
    ops.sort(key=lambda op: op.next_poll_at or now)
    for op in ops:
        out[share_of[op.id]].append((op, previous[op.id]))
    return out


def any_status_read_due_before(
    conn: Connection, now: datetime, before: datetime, skip_sources: Sequence[str]
) -> bool:
    """Whether any status read unleased at ``now`` was due before ``before`` (one probe).

    The same rows as ``due_status_reads`` but only asks for the most overdue one: the
    catch-up looks at them all only when there is one long overdue.
    """
    states = [s.value for s in STATUS_READ_STATES]
    return _STATUS_READ_OVERDUE.first(conn, before, states, now, list(skip_sources)) is not None


def due_status_reads(
    conn: Connection, now: datetime, skip_sources: Sequence[str], limit: int
) -> list[OperationRecord]:
    """Unleased operations whose next status read is due, except those ``skip_sources`` set.

    For the catch-up spread (``engine.catch_up``), which reschedules them in the same
    transaction; on PostgreSQL rows another replica holds locked are skipped.
    """
    states = [s.value for s in STATUS_READ_STATES]
    rows = _STATUS_READS_DUE.rows(conn, now, states, now, list(skip_sources), limit)
    return [record_of_values(row) for row in rows]


_RELEASE_KIND = "release"


def release_at_commit(conn: Connection, operation_id: str, owner: str) -> None:
    """Give a lease back as this transaction ends: on PostgreSQL with every other lease
    it gives back, in one statement (``commit_tail``); on SQLite at once. For a step's
    last write, which needs no answer: the row's next due time is in the record."""
    if conn.dialect.name == "postgresql":
        commit_tail.gather(conn, _RELEASE_KIND, (owner, operation_id))
    else:
        release(conn, [operation_id], owner)


def _release_gathered(gathered: list[tuple[str, str]]) -> list[Bound]:
    by_owner: dict[str, list[str]] = {}
    for owner, op_id in gathered:
        by_owner.setdefault(owner, []).append(op_id)
    return [Bound(_RELEASE, (leased, owner)) for owner, leased in by_owner.items()]


commit_tail.sends(_RELEASE_KIND, _release_gathered)


def release(conn: Connection, operation_ids: Sequence[str], owner: str) -> dict[str, Any]:
    """Give leases back (only those still ours); returns the released ones' next due times."""
    if not operation_ids:
        return {}
    return {op_id: at for op_id, at in _RELEASE.rows(conn, operation_ids, owner)}


def extend_lease(
    conn: Connection, operation_id: str, owner: str, now: datetime, lease_seconds: float
) -> bool:
    """Push a held, unexpired lease forward; False if it is no longer ours."""
    until = now + timedelta(seconds=lease_seconds)
    return bool(_EXTEND_LEASE.run(conn, until, operation_id, owner, now).rowcount == 1)


def count_by_state(conn: Connection, *, ended: bool | None = None) -> dict[str, int]:
    """Operations by state: all, or only the ended ones (``ended``), or only those in flight
    (a range of ``ix_operations_state_id`` per state, as long as what is in flight)."""
    if ended is None:
        rows = _COUNT_BY_STATE.rows(conn)
    else:
        states = _ENDED_STATES if ended else _FLIGHT_STATES
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
