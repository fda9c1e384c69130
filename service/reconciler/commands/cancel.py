"""Recording an agent's or operator's intent to cancel, in one transaction.

Guarantee: sending a cancel is not "cancelled". The intent is recorded here;
a worker sends the provider's cancel call once, and only the provider's own
terminal state ends the operation.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta

from sqlalchemy.engine import Connection

from reconciler.core.chain import Entry
from reconciler.core.errors import Conflict
from reconciler.core.principal import Principal
from reconciler.core.records import OperationRecord
from reconciler.core.states import END_STATES, State
from reconciler.core.vocabulary import HistoryKind
from reconciler.providers.spec import ProviderSpec, cancel_deadline_seconds
from reconciler.storage import operations as store
from reconciler.storage.database import Database, retry_stale
from reconciler.storage.journal import Journal
from reconciler.storage.notify import WAKE_CHANNEL, notify_in_transaction


def cancel(
    db: Database,
    journal: Journal,
    providers: Mapping[str, ProviderSpec],
    operation_id: str,
    who: Principal,
    reason: str | None,
    now: datetime,
) -> OperationRecord:
    """Record the intent on the caller's own operation (operators: any), retried on a race."""

    def once() -> OperationRecord:
        with db.write() as conn:
            op = store.visible_operation(conn, operation_id, who)
            spec = providers.get(op.provider)
            return request_cancel(
                conn,
                journal,
                op,
                f"{who.scope.value}:{who.name}",
                reason,
                now,
                cancel_deadline_seconds(spec),
                can_cancel=spec is None or spec.cancel is not None,
            )

    return retry_stale(once)


def request_cancel(
    conn: Connection,
    journal: Journal,
    op: OperationRecord,
    who: str,
    reason: str | None,
    now: datetime,
    cancel_deadline_seconds: float,
    can_cancel: bool = True,
) -> OperationRecord:
    """Record the intent to cancel. Never claims ``cancelled``: only the provider can.

    * job running (accepted/observing) → ``cancel_requested``; a worker sends the call once;
    * create not yet sent → ``cancelled`` at once (nothing exists remotely);
    * create sent but job id unknown → the intent is held and applied when the id arrives;
    * already asked, or already done → unchanged (idempotent).
    """
    state = State(op.state)
    if state in END_STATES or op.cancel_requested_at is not None:
        return op
    if not can_cancel:
        raise Conflict(
            f"provider '{op.provider}' has no cancel action in its provider file; the job "
            "cannot be stopped from here"
        )
    intent = {
        "cancel_requested_at": now,
        "cancel_requested_by": who,
        "cancel_reason": reason,
        "cancel_deadline_at": now + timedelta(seconds=cancel_deadline_seconds),
    }
    cause = f"cancel_request:{who}"
    detail = {"reason": reason}
    if state in (State.ACCEPTED, State.OBSERVING, State.RESULT_TIMED_OUT):
        op = journal.transition(
            conn,
            op,
            State.CANCEL_REQUESTED,
            actor=who,
            cause=cause,
            now=now,
            detail=detail,
            changes={**intent, "next_poll_at": now, "delay_source": None},
        )
    elif state is State.CREATE_PENDING and op.create_attempts == 0:
        op = journal.transition(
            conn,
            op,
            State.CANCELLED,
            actor=who,
            cause=cause,
            now=now,
            detail={**detail, "note": "cancelled before the create call was sent"},
            changes=intent,
        )
    else:
        note = Entry(
            kind=HistoryKind.NOTE,
            actor=who,
            cause=cause,
            detail={
                **detail,
                "note": f"cancel held: state {state.value} has no job id to cancel "
                "yet; it is applied once the job id is known",
            },
        )
        op = journal.write(conn, op, now=now, changes=intent, entries=[note])
    notify_in_transaction(conn, WAKE_CHANNEL)
    return op
