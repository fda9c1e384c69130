"""The completion_steps table: one row per operation, completion round and downstream step.

Guarantee: a finished step never runs again. The unique key (operation, round,
step) makes the row exist once; every status change is a conditional UPDATE
naming that row, and ``done`` is written only over ``running``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from reconciler.core.records import OperationRecord
from reconciler.storage.fastsql import Raw, raw_for, run
from reconciler.storage.models import CompletionStep

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


def step_key(op: OperationRecord, step: str) -> str:
    """Stable per operation, round and step: what hooks use for their own side effects."""
    return f"{op.id}:{op.completion_round}:{step}"


_STEP_COLUMNS = ("step", "status", "attempts", "next_attempt_at", "idempotency_key")


def _step_row(raw: Raw, row: Sequence[Any]) -> StepRow:
    step, status, attempts, next_attempt_at, key = row
    return StepRow(step, StepStatus(status), attempts, raw.read_time(next_attempt_at), key)


def ensure_all(conn: Connection, op: OperationRecord, names: Sequence[str]) -> list[StepRow]:
    """This round's rows of the named steps, in that order; made ``pending`` the first time.

    One INSERT for the missing ones (the unique key decides, so concurrent handlers
    cannot both make a row) and one SELECT for all of them.
    """
    if not names:
        return []
    raw = raw_for(conn.dialect.name)
    one = f"({raw.placeholders(6)})"
    insert = (
        "INSERT INTO completion_steps "
        "(operation_id, round, step, status, idempotency_key, attempts) "
        f"VALUES {', '.join([one] * len(names))} "
        "ON CONFLICT (operation_id, round, step) DO NOTHING"
    )
    params: list[Any] = []
    for name in names:
        params += [
            op.id,
            op.completion_round,
            name,
            StepStatus.PENDING.value,
            step_key(op, name),
            0,
        ]
    run(conn, insert, params)
    where, wanted = raw.in_list("step", names)
    select = (
        f"SELECT {', '.join(_STEP_COLUMNS)} FROM completion_steps "
        f"WHERE operation_id = {raw.mark} AND round = {raw.mark} AND {where}"
    )
    found = {
        row[0]: _step_row(raw, row)
        for row in run(conn, select, [op.id, op.completion_round, *wanted]).fetchall()
    }
    return [found[name] for name in names]


def ensure(conn: Connection, op: OperationRecord, step: str) -> StepRow:
    """The step's row for this round, made ``pending`` the first time it is asked for."""
    return ensure_all(conn, op, [step])[0]


def _set(
    conn: Connection, op: OperationRecord, step: str, values: Mapping[str, Any], only: str = ""
) -> int:
    """UPDATE one step row of this round (``only``: an extra condition on its status)."""
    raw = raw_for(conn.dialect.name)
    keys = tuple(values)
    sql = raw.statement(
        ("step-set", keys, bool(only)),
        lambda r: (
            f"UPDATE completion_steps SET {', '.join(f'{k} = {r.mark}' for k in keys)} "
            f"WHERE operation_id = {r.mark} AND round = {r.mark} AND step = {r.mark}"
            + (f" AND status = {r.mark}" if only else "")
        ),
    )
    encoded = [code(values[k]) for code, k in zip(raw.encoders(STEPS, keys), keys, strict=True)]
    params = [*encoded, op.id, op.completion_round, step, *([only] if only else [])]
    return int(run(conn, sql, params).rowcount)


def mark_running(conn: Connection, op: OperationRecord, row: StepRow, now: datetime) -> None:
    """Recorded before the step runs: a crash from here on means "may have run"."""
    values = {"status": StepStatus.RUNNING.value, "attempts": row.attempts + 1, "started_at": now}
    _set(conn, op, row.step, values)


def mark_done(conn: Connection, op: OperationRecord, step: str, now: datetime) -> None:
    values = {"status": StepStatus.DONE.value, "finished_at": now, "last_error": None}
    _set(conn, op, step, values, only=StepStatus.RUNNING.value)


def mark_failed(
    conn: Connection,
    op: OperationRecord,
    step: str,
    error: str,
    *,
    give_up: bool,
    retry_at: datetime | None,
) -> None:
    values = {
        "status": (StepStatus.GAVE_UP if give_up else StepStatus.PENDING).value,
        "last_error": error,
        "next_attempt_at": None if give_up else retry_at,
    }
    _set(conn, op, step, values)


def reopen_given_up(conn: Connection, op: OperationRecord) -> None:
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
