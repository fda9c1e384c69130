"""Writing an escalation: the record, the operation's move, the history entry, one transaction.

The wording and the options come from the pure ``escalations`` module; this
module only gathers the facts from the operation and writes.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.engine import Connection

from reconciler.core import escalation
from reconciler.core.chain import Entry
from reconciler.core.records import EscalationRecord, OperationRecord, with_changes
from reconciler.core.states import END_STATES, State
from reconciler.core.vocabulary import EscalationReason, HistoryKind, TransportError
from reconciler.storage.after_commit import after_commit
from reconciler.storage.fastsql import Sql
from reconciler.storage.journal import Journal, Lease
from reconciler.storage.tables import ESCALATIONS

log = logging.getLogger("reconciler.storage.escalations")

ESCALATION_COLUMNS = tuple(c.name for c in ESCALATIONS.c)
_COLUMN_LIST = ", ".join(ESCALATION_COLUMNS)

_INSERT = Sql(
    "escalation-insert",
    ESCALATIONS,
    "INSERT INTO escalations (operation_id, reason, message, options, resume_state, created_at) "
    "VALUES (?, ?, ?, ?, ?, ?) RETURNING id",
    params=("operation_id", "reason", "message", "options", "resume_state", "created_at"),
)
_BY_IDS = Sql(
    "escalations-by-id",
    ESCALATIONS,
    f"SELECT {_COLUMN_LIST} FROM escalations WHERE id IN (?*)",
    params=("id",),
    returns=ESCALATION_COLUMNS,
)
_DECIDE = Sql(
    "escalation-decide",
    ESCALATIONS,
    "UPDATE escalations SET decided_at = ?, decided_by = ?, decision = ? "
    "WHERE id = ? AND decided_at IS NULL",
    params=("decided_at", "decided_by", "decision", "id"),
)
_OF_OPERATIONS = Sql(
    "escalations-of-operations",
    ESCALATIONS,
    f"SELECT {_COLUMN_LIST} FROM escalations WHERE operation_id IN (?*) ORDER BY id",
    params=("operation_id",),
    returns=ESCALATION_COLUMNS,
)
_OF_OPERATION = Sql(
    "escalations-of-operation",
    ESCALATIONS,
    f"SELECT {_COLUMN_LIST} FROM escalations WHERE operation_id = ? ORDER BY id",
    params=("operation_id",),
    returns=ESCALATION_COLUMNS,
)


def escalation_of(row: Sequence[Any]) -> EscalationRecord:
    """An escalation from its decoded row in ``ESCALATION_COLUMNS`` order."""
    return EscalationRecord(**dict(zip(ESCALATION_COLUMNS, row, strict=True)))


def escalate(
    conn: Connection,
    journal: Journal,
    op: OperationRecord,
    terms: escalation.ProviderTerms,
    reason: EscalationReason,
    detail: str,
    *,
    now: datetime,
    actor: str,
    lease: Lease | None = None,
    changes: Mapping[str, Any] | None = None,
    before: Sequence[Entry] = (),
    transport_error: TransportError | None = None,
) -> OperationRecord:
    """Stop automatic work on ``op`` and ask a person, with bounded options."""
    seen = with_changes(op, changes or {})  # the facts include what this very write records
    facts = escalation.facts_for(seen, terms.backoff, reason, detail, now, transport_error)
    state = State(op.state)
    options = escalation.options_for(
        reason,
        provider_can_cancel=terms.can_cancel,
        job_id_known=op.remote_job_id is not None,
        job_may_run=escalation.job_may_run(state),
    )
    message = escalation.render_message(facts, options)
    escalation_id = _INSERT.value(
        conn,
        op.id,
        reason.value,
        message,
        escalation.options_payload(facts, options),
        escalation.resume_state(op, reason).value,
        now,
    )
    entry = Entry(
        kind=HistoryKind.ESCALATION,
        actor=actor,
        cause=f"escalation:{reason.value}",
        detail={
            "reason": reason.value,
            "detail": detail,
            "options": [o.value for o in options],
            "escalation_id": escalation_id,
        },
    )
    all_changes: dict[str, Any] = {
        "escalation_id": escalation_id,
        "escalation_open": True,
        **(changes or {}),
    }
    # Said once the escalation is committed, never for a write that rolled back.
    after_commit(
        conn,
        lambda: log.warning(
            "operation %s escalated: %s",
            op.id,
            reason.value,
            extra={
                "operation_id": op.id,
                "reason": reason.value,
                "detail": detail,
                "options": [o.value for o in options],
            },
        ),
    )
    if state in END_STATES:
        # The outcome stands (e.g. a callback that cannot be delivered); only a person is asked.
        return journal.write(
            conn, op, now=now, changes=all_changes, entries=[*before, entry], lease=lease
        )
    target = escalation.stop_state(reason)
    if target is State.ESCALATED:
        all_changes.setdefault("next_poll_at", None)
    return journal.transition(
        conn,
        op,
        target,
        actor=actor,
        cause=f"escalation:{reason.value}",
        now=now,
        detail={"reason": reason.value, "detail": detail},
        changes=all_changes,
        before=before,
        entries=[entry],
        lease=lease,
    )


def open_escalation(conn: Connection, op: OperationRecord) -> EscalationRecord | None:
    if op.escalation_id is None:
        return None
    found = escalations_for(conn, [op.escalation_id]).get(op.escalation_id)
    return found if found is not None and found.decided_at is None else None


def escalations_for(conn: Connection, escalation_ids: Sequence[int]) -> dict[int, EscalationRecord]:
    if not escalation_ids:
        return {}
    found = [escalation_of(row) for row in _BY_IDS.rows(conn, list(escalation_ids))]
    return {e.id: e for e in found}


def mark_decided(
    conn: Connection, escalation_id: int, who: str, decision: dict[str, Any], now: datetime
) -> None:
    """Record the decision on its escalation; a decided one is never decided again."""
    _DECIDE.run(conn, now, who, decision, escalation_id)


def escalations_of(conn: Connection, operation_id: str) -> list[EscalationRecord]:
    """Every escalation of one operation, oldest first (decided ones with their decision)."""
    return [escalation_of(row) for row in _OF_OPERATION.rows(conn, operation_id)]


def escalations_by_operation(
    conn: Connection, operation_ids: Sequence[str]
) -> dict[str, list[EscalationRecord]]:
    """Every escalation of each of the operations, oldest first (one read for a page)."""
    found: dict[str, list[EscalationRecord]] = {op_id: [] for op_id in operation_ids}
    if not operation_ids:
        return found
    for row in _OF_OPERATIONS.rows(conn, list(operation_ids)):
        esc = escalation_of(row)
        found.setdefault(esc.operation_id, []).append(esc)
    return found
