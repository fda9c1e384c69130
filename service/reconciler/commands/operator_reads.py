"""What an operator reads of operations, for the console and the command line: one
operation's whole file (its record, escalations, history, completion steps and Operation
view), its story, and the list. Each is one read transaction; an operator sees every
operation (an agent's reads are ``commands.agent_actions``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from reconciler.core.principal import Principal
from reconciler.core.records import EscalationRecord, HistoryRecord, OperationRecord
from reconciler.core.states import State
from reconciler.storage import operations as store
from reconciler.storage.completion_steps import StepRecord, steps_of
from reconciler.storage.database import Database
from reconciler.storage.escalations import escalations_of
from reconciler.storage.history import history_of
from reconciler.storage.operation_reads import view_of


@dataclass(frozen=True)
class OperationFile:
    """One operation as its page shows it, read in one transaction."""

    op: OperationRecord
    escalations: list[EscalationRecord]
    entries: list[HistoryRecord]
    steps: list[StepRecord]


def operation(db: Database, op_id: str) -> OperationRecord:
    """The operation, or ``NotFound``."""
    with db.read() as conn:
        return store.load_operation(conn, op_id)


def operation_file(db: Database, op_id: str) -> OperationFile:
    with db.read() as conn:
        return OperationFile(
            store.load_operation(conn, op_id),
            escalations_of(conn, op_id),
            history_of(conn, op_id),
            steps_of(conn, op_id),
        )


def operation_view(db: Database, op_id: str, now: datetime) -> dict[str, Any]:
    """The Operation as the API shows it to an operator."""
    with db.read() as conn:
        return view_of(conn, store.load_operation(conn, op_id), now)


def operation_story(db: Database, op_id: str) -> tuple[OperationRecord, list[HistoryRecord]]:
    """The operation and its history, oldest entry first."""
    with db.read() as conn:
        return store.load_operation(conn, op_id), history_of(conn, op_id)


def operations_page(
    db: Database, who: Principal, state: State | None, provider: str | None, limit: int
) -> store.Page:
    """The newest operations ``who`` may see (an operator: all), filtered."""
    with db.read() as conn:
        return store.list_operations(
            conn, who, state=state, provider=provider, limit=limit, cursor=None
        )
