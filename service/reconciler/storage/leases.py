"""The lease columns of the operations table: claims, release and renewal, and the due
status reads the catch-up spreads.

Guarantee: each operation has one owner at a time. Lease claims are single conditional
statements (state rules in the write, not check-then-act): on PostgreSQL ``FOR UPDATE
SKIP LOCKED`` lets replicas claim disjoint batches without waiting on each other; on
SQLite the claim is one ``UPDATE ... WHERE id IN (...) AND <still free>`` inside a write
transaction, which SQLite serialises. The claim returns each row as it is once the lease
is ours (``RETURNING``, in the same statement): that is the reload after the claim, with
nothing between owning the row and reading it. Every other write of the row goes
through the journal (``storage.journal``), guarded by the lease.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from functools import cache
from typing import Any

from sqlalchemy.engine import Connection

from reconciler.core.completion_lanes import CALLBACK_PREFIX
from reconciler.core.records import OperationRecord
from reconciler.core.states import END_STATES, State
from reconciler.storage import commit_tail, payloads
from reconciler.storage.fastsql import AS_IS, Bound, Sql
from reconciler.storage.models import record_of_values
from reconciler.storage.operations import COLUMN_LIST, RECORD_RETURNS, records_of
from reconciler.storage.tables import OPS, OPS_COLUMNS

# The claim's: with the create request of those whose next step sends it.
_SENDS_REQUEST = f"state = '{State.CREATE_PENDING.value}'"
_CLAIMED_LIST = f"{COLUMN_LIST}[[, {payloads.inline(_SENDS_REQUEST)}|]]"
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

_CLAIM = Sql(
    "operations-claim",
    OPS,
    f"UPDATE operations SET lease_owner = ?, lease_expires_at = ? "
    f"WHERE id IN (?*) AND {_FREE} RETURNING {_CLAIMED_LIST}",
    params=("lease_owner", "lease_expires_at", "id", "lease_expires_at"),
    returns=RECORD_RETURNS,
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
    f"SELECT {COLUMN_LIST} FROM operations WHERE next_poll_at <= ? AND {_STATE} IN (?*) "
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
