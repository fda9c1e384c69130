"""What the operator console's inbox reads: open escalations, operations at risk, search.

Read-only. The at-risk filter is built from the thresholds and the counters in
``core.risk``, so every operation listed here gets at least one label from
``core.risk.risks`` (given its last escalation's reason). Search takes the start of an
operation id (with or without its ``op_``), a remote job id or a trace id.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from typing import Any

from sqlalchemy.engine import Connection

from reconciler.core import risk
from reconciler.core.states import State
from reconciler.core.vocabulary import EscalationReason
from reconciler.storage.escalations import ESCALATION_COLUMNS, escalation_of
from reconciler.storage.fastsql import AS_IS, Sql
from reconciler.storage.models import record_of_values
from reconciler.storage.tables import ESCALATIONS, OPS, OPS_COLUMNS

_OPS_LIST = ", ".join(f"operations.{c}" for c in OPS_COLUMNS)
_ESC_LIST = ", ".join(f"escalations.{c}" for c in ESCALATION_COLUMNS)
_ESC_RETURNS = tuple(f"escalations.{c}" for c in ESCALATION_COLUMNS)


def _epoch(column: str) -> str:
    """Seconds since the Unix epoch of a timestamp column (SQLite's julianday() counts
    from 4714 BC, whose Julian day the Unix epoch is 2440587.5)."""
    return f"[[extract(epoch from {column})|(julianday({column}) - 2440587.5) * 86400.0]]"


def _again_sql() -> str:
    """``core.risk.AGAIN``: the last (decided) escalation's reason, and its counter again."""
    cases = " OR ".join(
        f"(escalations.reason = '{reason.value}' AND operations.{column} > 0)"
        for reason, column in risk.AGAIN.items()
    )
    return f"(NOT operations.escalation_open AND ({cases}))"


def _at_risk_sql() -> str:
    """The rules of ``core.risk`` as one condition; its one mark is now (epoch seconds)."""
    deadline, created = _epoch("operations.deadline_at"), _epoch("operations.created_at")
    left, share, failures = risk.DEADLINE_LEFT, risk.BUDGET_USED, risk.TRANSPORT_USED
    return (
        f"(({deadline} > {created} AND ({deadline} - ?) * {left.denominator} "
        f"<= ({deadline} - {created}) * {left.numerator}) "
        "OR (max_status_requests > 0 AND status_requests_used * "
        f"{share.denominator} >= max_status_requests * {share.numerator}) "
        "OR (transport_failures_used > 0 AND transport_failures_used * "
        f"{failures.denominator} >= max_transport_failures * {failures.numerator}) "
        f"OR {_again_sql()})"
    )


ID_PREFIX = "op_"
_WATCHED = tuple(sorted(s.value for s in risk.WATCHED))
_PROVIDERS = Sql("providers-seen", OPS, "SELECT DISTINCT provider FROM operations")
_STAMP = Sql("inbox-stamp", ESCALATIONS, "SELECT max(id), count(decided_at) FROM escalations")


@dataclass(frozen=True)
class InboxFilter:
    state: State | None = None
    provider: str | None = None
    reason: EscalationReason | None = None
    query: str | None = None  # the start of an operation id, a remote job id or a trace id

    @property
    def narrows(self) -> bool:
        """True when the operator asked for something more specific than "what needs me"."""
        return self.state is not None or self.query is not None


@dataclass(frozen=True)
class Slice:
    """One page of a list, and how many there are in all."""

    items: list[Any]
    total: int
    # At risk: each operation's last escalation's reason, for those that had one.
    reasons: dict[str, str] = field(default_factory=dict)


_SHAPES: dict[str, str] = {
    # (the rows, their count, their order) for each list; {where} is the filter's.
    "escalated": (
        "FROM operations JOIN escalations ON escalations.id = operations.escalation_id "
        "WHERE escalations.decided_at IS NULL{where}"
    ),
    "at_risk": (
        "FROM operations LEFT JOIN escalations ON escalations.id = operations.escalation_id "
        f"WHERE operations.state IN (?*) AND {_at_risk_sql()}{{where}}"
    ),
    "matching": "FROM operations WHERE 1 = 1{where}",
    "matching_reason": (
        "FROM operations WHERE EXISTS (SELECT 1 FROM escalations "
        "WHERE escalations.operation_id = operations.id AND escalations.reason = ?){where}"
    ),
}
_ORDER = {
    "escalated": "escalations.created_at, escalations.id",
    "at_risk": "operations.deadline_at, operations.id",
    "matching": "operations.id DESC",
    "matching_reason": "operations.id DESC",
}
_LEAD: dict[str, tuple[str, ...]] = {
    "escalated": (),
    "at_risk": ("state", AS_IS),
    "matching": (),
    "matching_reason": ("escalations.reason",),
}


@cache
def _list_sql(
    shape: str, state: bool, provider: bool, query: bool, reason: bool
) -> tuple[Sql, Sql]:
    """One inbox list for one shape of filter: its page and its count."""
    where, params = "", list(_LEAD[shape])
    if state:
        where += " AND operations.state = ?"
        params.append("state")
    if provider:
        where += " AND operations.provider = ?"
        params.append("provider")
    if query:
        # substr, not LIKE: ids hold "_", which LIKE reads as a wildcard (and SQLite's LIKE
        # ignores case); each mark's length is the next one's value.
        where += (
            " AND (substr(operations.id, 1, ?) = ? OR substr(operations.id, 1, ?) = ?"
            " OR substr(operations.remote_job_id, 1, ?) = ?"
            " OR substr(operations.trace_id, 1, ?) = ?)"
        )
        params += [AS_IS, "id", AS_IS, "id", AS_IS, "remote_job_id", AS_IS, "trace_id"]
    if reason:
        where += " AND escalations.reason = ?"
        params.append("escalations.reason")
    source = _SHAPES[shape].format(where=where)
    columns, returns = _OPS_LIST, OPS_COLUMNS
    if shape == "escalated":
        columns, returns = f"{_OPS_LIST}, {_ESC_LIST}", (*OPS_COLUMNS, *_ESC_RETURNS)
    elif shape == "at_risk":  # its join has the last escalation's reason at hand
        columns, returns = f"{_OPS_LIST}, escalations.reason", (*OPS_COLUMNS, "escalations.reason")
    page = Sql(
        f"inbox-{shape}",
        OPS,
        f"SELECT {columns} {source} ORDER BY {_ORDER[shape]} LIMIT ? OFFSET ?",
        params=(*params, AS_IS, AS_IS),
        returns=returns,
    )
    count = Sql(f"inbox-{shape}-count", OPS, f"SELECT count(*) {source}", params=params)
    return page, count


def _values(f: InboxFilter) -> list[Any]:
    values: list[Any] = []
    if f.state is not None:
        values.append(f.state.value)
    if f.provider is not None:
        values.append(f.provider)
    if f.query is not None:
        with_prefix = f.query if f.query.startswith(ID_PREFIX) else ID_PREFIX + f.query
        for text in (f.query, with_prefix, f.query, f.query):
            values += [len(text), text]
    return values


def _slice(
    conn: Connection,
    shape: str,
    f: InboxFilter,
    lead: Sequence[Any],
    limit: int,
    offset: int,
    *,
    reason: bool = False,
) -> tuple[list[Sequence[Any]], int]:
    page, count = _list_sql(
        shape, f.state is not None, f.provider is not None, f.query is not None, reason
    )
    values = [*lead, *_values(f)]
    if reason and f.reason is not None:
        values.append(f.reason.value)
    total = int(count.value(conn, *values))
    return page.rows(conn, *values, limit, offset), total


def escalated(conn: Connection, f: InboxFilter, limit: int, offset: int) -> Slice:
    """Operations waiting for a decision, oldest escalation first: ``(Operation, Escalation)``."""
    rows, total = _slice(conn, "escalated", f, (), limit, offset, reason=f.reason is not None)
    width = len(OPS_COLUMNS)
    items = [(record_of_values(row[:width]), escalation_of(row[width:])) for row in rows]
    return Slice(items, total)


def at_risk(conn: Connection, f: InboxFilter, now: datetime, limit: int, offset: int) -> Slice:
    """Running operations whose deadline, budget or failure allowance is nearly spent."""
    rows, total = _slice(conn, "at_risk", f, (_WATCHED, now.timestamp()), limit, offset)
    width = len(OPS_COLUMNS)
    items = [record_of_values(row[:width]) for row in rows]
    reasons = {op.id: str(row[width]) for op, row in zip(items, rows, strict=True) if row[width]}
    return Slice(items, total, reasons)


def matching(conn: Connection, f: InboxFilter, limit: int, offset: int) -> Slice:
    """Every operation the filter matches, newest first."""
    if f.reason is None:
        rows, total = _slice(conn, "matching", f, (), limit, offset)
    else:
        rows, total = _slice(conn, "matching_reason", f, (f.reason.value,), limit, offset)
    return Slice([record_of_values(row) for row in rows], total)


def providers_seen(conn: Connection) -> list[str]:
    """Every provider name that has operations (a provider file may since have gone)."""
    return sorted(str(row[0]) for row in _PROVIDERS.rows(conn))


def stamp(conn: Connection) -> str:
    """Changes whenever an operation escalates or an escalation is decided (any replica)."""
    row = _STAMP.first(conn)
    newest, decided = row if row is not None else (0, 0)
    return f"{newest or 0}.{decided or 0}"
