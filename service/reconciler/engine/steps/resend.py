"""When a create may be sent again to a provider that takes no idempotency key.

Guarantee: with ``idempotency = "none"`` and no ``[lookup]``, a create that may have
made a job is never resent on the service's own: it escalates ``create_unknown``.
A further attempt goes out only on evidence kept in the history: the last attempt
certainly made no job (it was never delivered, or the provider refused to take it),
or an operator decided ``resend`` since (``core.create.allows_resend`` judges it; this
module reads it).
"""

from __future__ import annotations

from sqlalchemy.engine import Connection

from reconciler.core.chain import Entry
from reconciler.core.create import RESEND_DECISION, allows_resend
from reconciler.core.records import OperationRecord
from reconciler.core.vocabulary import HistoryKind
from reconciler.storage.database import Database
from reconciler.storage.history import last_of

_CAUSES = ("create_response", RESEND_DECISION)


def _evidence(conn: Connection, op: OperationRecord, actor: str) -> Entry | None:
    last = last_of(conn, op.id, (HistoryKind.OBSERVATION, HistoryKind.DECISION), _CAUSES)
    if last is None or not allows_resend(last.cause, last.detail, op.create_attempts):
        return None
    if last.cause == RESEND_DECISION:
        return Entry(
            kind=HistoryKind.NOTE,
            actor=last.actor,
            cause="create_resend_authorized",
            detail={"decided_at_seq": last.seq, "warning": "a duplicate job may result"},
        )
    return Entry(
        kind=HistoryKind.NOTE,
        actor=actor,
        cause="create_resend_safe",
        detail={"after_seq": last.seq},
    )


def resend_allowed(db: Database, op: OperationRecord, actor: str) -> Entry | None:
    """The history entry that allows one more create of ``op``, or None: escalate.

    An operator's ``resend`` is recorded with the operator as its actor; the worker's own
    finding (``actor``) that the last attempt made no job, with the worker."""
    with db.read() as conn:
        return _evidence(conn, op, actor)
