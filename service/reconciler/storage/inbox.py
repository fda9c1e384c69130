"""What the operator console's inbox reads: open escalations, operations at risk, search.

Read-only. The at-risk filter is built from the thresholds in ``core.risk``, so
every operation listed here gets at least one label from ``core.risk.risks``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from reconciler.core import risk
from reconciler.core.records import EscalationRecord
from reconciler.core.states import State
from reconciler.core.vocabulary import EscalationReason
from reconciler.storage.escalations import ESCALATIONS
from reconciler.storage.journal import OPS
from reconciler.storage.models import operation_record

# The Unix epoch as a Julian day number: SQLite's julianday() counts from elsewhere.
_UNIX_EPOCH_JULIAN = 2440587.5


@dataclass(frozen=True)
class InboxFilter:
    state: State | None = None
    provider: str | None = None
    reason: EscalationReason | None = None
    query: str | None = None  # an operation id, a remote job id or a trace id, exactly

    @property
    def narrows(self) -> bool:
        """True when the operator asked for something more specific than "what needs me"."""
        return self.state is not None or self.query is not None


@dataclass(frozen=True)
class Slice:
    """One page of a list, and how many there are in all."""

    items: list[Any]
    total: int


def _common(query: sa.Select[Any], f: InboxFilter) -> sa.Select[Any]:
    if f.state is not None:
        query = query.where(OPS.c.state == f.state.value)
    if f.provider is not None:
        query = query.where(OPS.c.provider == f.provider)
    if f.query is not None:
        query = query.where(
            sa.or_(OPS.c.id == f.query, OPS.c.remote_job_id == f.query, OPS.c.trace_id == f.query)
        )
    return query


def _count(conn: Connection, query: sa.Select[Any]) -> int:
    counted = sa.select(sa.func.count()).select_from(query.order_by(None).subquery())
    return int(conn.execute(counted).scalar_one())


def escalated(conn: Connection, f: InboxFilter, limit: int, offset: int) -> Slice:
    """Operations waiting for a decision, oldest escalation first: ``(Operation, Escalation)``."""
    query = sa.select(OPS, *[c.label(f"esc_{c.name}") for c in ESCALATIONS.c]).join(
        ESCALATIONS, ESCALATIONS.c.id == OPS.c.escalation_id
    )
    query = _common(query.where(ESCALATIONS.c.decided_at.is_(None)), f)
    if f.reason is not None:
        query = query.where(ESCALATIONS.c.reason == f.reason.value)
    total = _count(conn, query)
    rows = conn.execute(
        query.order_by(ESCALATIONS.c.created_at, ESCALATIONS.c.id).limit(limit).offset(offset)
    ).mappings()
    items = []
    for row in rows:
        op = operation_record({c.name: row[c.name] for c in OPS.c})
        esc = EscalationRecord(**{c.name: row[f"esc_{c.name}"] for c in ESCALATIONS.c})
        items.append((op, esc))
    return Slice(items, total)


def _epoch(conn: Connection, column: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
    if conn.dialect.name == "postgresql":
        return sa.extract("epoch", column)
    return (sa.func.julianday(column) - _UNIX_EPOCH_JULIAN) * 86400.0


def _at_risk_clause(conn: Connection, now: datetime) -> sa.ColumnElement[bool]:
    deadline, created = _epoch(conn, OPS.c.deadline_at), _epoch(conn, OPS.c.created_at)
    left, share = risk.DEADLINE_LEFT, risk.BUDGET_USED
    failures = risk.TRANSPORT_USED
    return sa.or_(
        sa.and_(
            deadline > created,
            (deadline - now.timestamp()) * left.denominator
            <= (deadline - created) * left.numerator,
        ),
        sa.and_(
            OPS.c.max_status_requests > 0,
            OPS.c.status_requests_used * share.denominator
            >= OPS.c.max_status_requests * share.numerator,
        ),
        sa.and_(
            OPS.c.transport_failures_used > 0,
            OPS.c.transport_failures_used * failures.denominator
            >= OPS.c.max_transport_failures * failures.numerator,
        ),
    )


def at_risk(conn: Connection, f: InboxFilter, now: datetime, limit: int, offset: int) -> Slice:
    """Running operations whose deadline, budget or failure allowance is nearly spent."""
    watched = [s.value for s in risk.WATCHED]
    query = sa.select(OPS).where(OPS.c.state.in_(watched), _at_risk_clause(conn, now))
    query = _common(query, f)
    total = _count(conn, query)
    rows = conn.execute(
        query.order_by(OPS.c.deadline_at, OPS.c.id).limit(limit).offset(offset)
    ).mappings()
    return Slice([operation_record(r) for r in rows], total)


def matching(conn: Connection, f: InboxFilter, limit: int, offset: int) -> Slice:
    """Every operation the filter matches, newest first."""
    query = _common(sa.select(OPS), f)
    if f.reason is not None:
        query = query.join(ESCALATIONS, ESCALATIONS.c.operation_id == OPS.c.id).where(
            ESCALATIONS.c.reason == f.reason.value
        )
        query = query.distinct()
    total = _count(conn, query)
    rows = conn.execute(query.order_by(OPS.c.id.desc()).limit(limit).offset(offset)).mappings()
    return Slice([operation_record(r) for r in rows], total)


def providers_seen(conn: Connection) -> list[str]:
    """Every provider name that has operations (a provider file may since have gone)."""
    return sorted(str(p) for p in conn.execute(sa.select(OPS.c.provider).distinct()).scalars())


def stamp(conn: Connection) -> str:
    """Changes whenever an operation escalates or an escalation is decided (any replica)."""
    newest, decided = conn.execute(
        sa.select(sa.func.max(ESCALATIONS.c.id), sa.func.count(ESCALATIONS.c.decided_at))
    ).one()
    return f"{newest or 0}.{decided or 0}"
