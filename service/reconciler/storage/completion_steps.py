"""The completion_steps table: one row per operation, completion round and downstream step.

Guarantee: a finished step never runs again. The unique key (operation, round,
step) makes the row exist once; every status change is a conditional UPDATE
naming that row, and ``done`` is written only over ``running``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from reconciler.storage.models import CompletionStep, Operation

STEPS = CompletionStep.__table__  # type: ignore[attr-defined]


class StepStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    GAVE_UP = "gave_up"


FINISHED = frozenset({StepStatus.DONE, StepStatus.GAVE_UP})


@dataclass(frozen=True)
class StepRow:
    step: str
    status: StepStatus
    attempts: int
    next_attempt_at: datetime | None
    idempotency_key: str


def step_key(op: Operation, step: str) -> str:
    """Stable per operation, round and step: what hooks use for their own side effects."""
    return f"{op.id}:{op.completion_round}:{step}"


def _this_step(op: Operation, step: str) -> tuple[sa.ColumnElement[bool], ...]:
    """The WHERE clause naming one step of this operation's current completion round."""
    return (
        STEPS.c.operation_id == op.id,
        STEPS.c.round == op.completion_round,
        STEPS.c.step == step,
    )


def ensure(conn: Connection, op: Operation, step: str) -> StepRow:
    """The step's row for this round, made ``pending`` the first time it is asked for."""
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    conn.execute(
        dialect.insert(STEPS)
        .values(
            operation_id=op.id,
            round=op.completion_round,
            step=step,
            status=StepStatus.PENDING.value,
            idempotency_key=step_key(op, step),
            attempts=0,
        )
        .on_conflict_do_nothing(index_elements=["operation_id", "round", "step"])
    )
    row = conn.execute(sa.select(STEPS).where(*_this_step(op, step))).mappings().one()
    return StepRow(
        row["step"],
        StepStatus(row["status"]),
        row["attempts"],
        row["next_attempt_at"],
        row["idempotency_key"],
    )


def mark_running(conn: Connection, op: Operation, row: StepRow, now: datetime) -> None:
    """Recorded before the step runs: a crash from here on means "may have run"."""
    conn.execute(
        sa.update(STEPS)
        .where(*_this_step(op, row.step))
        .values(status=StepStatus.RUNNING.value, attempts=row.attempts + 1, started_at=now)
    )


def mark_done(conn: Connection, op: Operation, step: str, now: datetime) -> None:
    conn.execute(
        sa.update(STEPS)
        .where(*_this_step(op, step), STEPS.c.status == StepStatus.RUNNING.value)
        .values(status=StepStatus.DONE.value, finished_at=now, last_error=None)
    )


def mark_failed(
    conn: Connection,
    op: Operation,
    step: str,
    error: str,
    *,
    give_up: bool,
    retry_at: datetime | None,
) -> None:
    conn.execute(
        sa.update(STEPS)
        .where(*_this_step(op, step))
        .values(
            status=(StepStatus.GAVE_UP if give_up else StepStatus.PENDING).value,
            last_error=error,
            next_attempt_at=None if give_up else retry_at,
        )
    )


def reopen_given_up(conn: Connection, op: Operation) -> None:
    """An operator extended delivery: the steps that gave up this round may try again."""
    conn.execute(
        sa.update(STEPS)
        .where(
            STEPS.c.operation_id == op.id,
            STEPS.c.round == op.completion_round,
            STEPS.c.status == StepStatus.GAVE_UP.value,
        )
        .values(status=StepStatus.PENDING.value, attempts=0, next_attempt_at=None)
    )


@dataclass(frozen=True)
class StepRecord:
    """One downstream step of one completion round, as an operator reads it."""

    round: int
    step: str
    status: StepStatus
    attempts: int
    started_at: datetime | None
    finished_at: datetime | None
    next_attempt_at: datetime | None
    last_error: str | None


def steps_of(conn: Connection, operation_id: str) -> list[StepRecord]:
    """Every step row of one operation, by round then step."""
    rows = conn.execute(
        sa.select(STEPS)
        .where(STEPS.c.operation_id == operation_id)
        .order_by(STEPS.c.round, STEPS.c.id)
    ).mappings()
    return [
        StepRecord(
            r["round"],
            r["step"],
            StepStatus(r["status"]),
            r["attempts"],
            r["started_at"],
            r["finished_at"],
            r["next_attempt_at"],
            r["last_error"],
        )
        for r in rows
    ]
