"""Deciding an escalation (API and CLI alike): plan it in the core, write it in one transaction.

Guarantee: only the offered options, once. ``core.operator_decision`` refuses
anything else before a write; here the decision, the escalation's record and
the operation's move are written together, retried on a lost race.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from sqlalchemy.engine import Connection

from reconciler.core.chain import Entry
from reconciler.core.operator_decision import DecisionRequest, plan_decision
from reconciler.core.principal import Principal, require_operator
from reconciler.core.records import OperationRecord
from reconciler.core.vocabulary import HistoryKind
from reconciler.providers.spec import ProviderSpec, cancel_deadline_seconds
from reconciler.storage import operations as store
from reconciler.storage.completion_steps import reopen_given_up
from reconciler.storage.database import Database, retry_stale
from reconciler.storage.escalations import mark_decided, open_escalation
from reconciler.storage.journal import Journal
from reconciler.storage.notify import CHANGE_CHANNEL, WAKE_CHANNEL, notify_in_transaction


def decide(
    db: Database,
    journal: Journal,
    providers: Mapping[str, ProviderSpec],
    operation_id: str,
    who: Principal,
    request: DecisionRequest,
    now: datetime,
) -> OperationRecord:
    """An operator's decision on an operation's open escalation, retried on a race."""
    require_operator(who)

    def once() -> OperationRecord:
        with db.write() as conn:
            op = store.load_operation(conn, operation_id)
            spec = providers.get(op.provider)
            return apply_decision(
                conn,
                journal,
                op,
                request,
                f"operator:{who.name}",
                now,
                cancel_deadline_seconds(spec),
            )

    return retry_stale(once)


def apply_decision(
    conn: Connection,
    journal: Journal,
    op: OperationRecord,
    request: DecisionRequest,
    who: str,
    now: datetime,
    cancel_deadline_seconds: float,
) -> OperationRecord:
    plan = plan_decision(op, open_escalation(conn, op), request, who, now, cancel_deadline_seconds)
    if plan.reopen_given_up_steps:
        reopen_given_up(conn, op)
    mark_decided(conn, plan.escalation_id, who, plan.record, now)
    # The row says so in the same write: whether the operation is done follows the decision.
    changes = {**plan.changes, "escalation_open": False}
    cause = f"decision:{plan.action.value}"
    entry = Entry(
        kind=HistoryKind.DECISION,
        actor=who,
        cause=cause,
        detail={**plan.detail, **plan.record},
        delay_source=plan.delay_source,
    )
    # Workers and waiters on every replica learn of it when (and only if) it commits.
    notify_in_transaction(conn, WAKE_CHANNEL)
    if plan.target is None:
        after = journal.write(conn, op, now=now, changes=changes, entries=[entry])
        notify_in_transaction(conn, CHANGE_CHANNEL, op.id)
        return after
    return journal.transition(
        conn,
        op,
        plan.target,
        actor=who,
        cause=cause,
        now=now,
        detail=plan.detail,
        changes=changes,
        before=[entry],
    )
