"""Writing an escalation: the record, the operation's move, the history entry, one transaction.

The wording and the options come from the pure ``escalations`` module; this
module only gathers the facts from the operation and writes.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from reconciler.core import escalation
from reconciler.core.records import EscalationRecord, OperationRecord, with_changes
from reconciler.core.states import END_STATES, State
from reconciler.core.vocabulary import EscalationReason, HistoryKind, TransportError
from reconciler.storage.journal import Entry, Journal, Lease
from reconciler.storage.models import Escalation

log = logging.getLogger("reconciler.storage.escalations")

ESCALATIONS = Escalation.__table__  # type: ignore[attr-defined]


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
    options = escalation.options_for(
        reason,
        provider_can_cancel=terms.can_cancel,
        job_id_known=op.remote_job_id is not None,
    )
    message = escalation.render_message(facts, options)
    log.warning(
        "operation %s escalated: %s",
        op.id,
        reason.value,
        extra={
            "operation_id": op.id,
            "reason": reason.value,
            "detail": detail,
            "options": [o.value for o in options],
        },
    )
    escalation_id = conn.execute(
        sa.insert(ESCALATIONS)
        .values(
            operation_id=op.id,
            reason=reason.value,
            message=message,
            options=escalation.options_payload(facts, options),
            resume_state=escalation.resume_state(op, reason).value,
            created_at=now,
        )
        .returning(ESCALATIONS.c.id)
    ).scalar_one()
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
    all_changes: dict[str, Any] = {"escalation_id": escalation_id, **(changes or {})}
    state = State(op.state)
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
    row = (
        conn.execute(sa.select(ESCALATIONS).where(ESCALATIONS.c.id == op.escalation_id))
        .mappings()
        .first()
    )
    if row is None or row["decided_at"] is not None:
        return None
    return EscalationRecord(**dict(row))


def escalations_for(conn: Connection, escalation_ids: Sequence[int]) -> dict[int, EscalationRecord]:
    if not escalation_ids:
        return {}
    rows = conn.execute(sa.select(ESCALATIONS).where(ESCALATIONS.c.id.in_(list(escalation_ids))))
    return {r.id: EscalationRecord(**dict(r._mapping)) for r in rows}


def mark_decided(
    conn: Connection, escalation_id: int, who: str, decision: dict[str, Any], now: datetime
) -> None:
    """Record the decision on its escalation; a decided one is never decided again."""
    conn.execute(
        sa.update(ESCALATIONS)
        .where(ESCALATIONS.c.id == escalation_id, ESCALATIONS.c.decided_at.is_(None))
        .values(decided_at=now, decided_by=who, decision=decision)
    )


def escalations_of(conn: Connection, operation_id: str) -> list[EscalationRecord]:
    """Every escalation of one operation, oldest first (decided ones with their decision)."""
    rows = conn.execute(
        sa.select(ESCALATIONS)
        .where(ESCALATIONS.c.operation_id == operation_id)
        .order_by(ESCALATIONS.c.id)
    )
    return [EscalationRecord(**dict(r._mapping)) for r in rows]
