"""Deciding an escalation (API and CLI alike): plan it in the core, write it in one transaction.

Guarantee: only the offered options, once. ``core.operator_decision`` refuses
anything else before a write; here the decision, the escalation's record and
the operation's move are written together, retried on a lost race.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.engine import Connection

from reconciler.core.operator_decision import DecisionRequest, plan_decision
from reconciler.core.vocabulary import HistoryKind
from reconciler.storage.completion_steps import reopen_given_up
from reconciler.storage.escalations import mark_decided, open_escalation
from reconciler.storage.journal import Entry, Journal
from reconciler.storage.models import Operation


def apply_decision(
    conn: Connection,
    journal: Journal,
    op: Operation,
    request: DecisionRequest,
    who: str,
    now: datetime,
    cancel_deadline_seconds: float,
) -> Operation:
    plan = plan_decision(op, open_escalation(conn, op), request, who, now, cancel_deadline_seconds)
    if plan.reopen_given_up_steps:
        reopen_given_up(conn, op)
    mark_decided(conn, plan.escalation_id, who, plan.record, now)
    cause = f"decision:{plan.action.value}"
    entry = Entry(
        kind=HistoryKind.DECISION,
        actor=who,
        cause=cause,
        detail={**plan.detail, **plan.record},
        delay_source=plan.delay_source,
    )
    if plan.target is None:
        return journal.write(conn, op, now=now, changes=plan.changes, entries=[entry])
    return journal.transition(
        conn,
        op,
        plan.target,
        actor=who,
        cause=cause,
        now=now,
        detail=plan.detail,
        changes=plan.changes,
        before=[entry],
    )
