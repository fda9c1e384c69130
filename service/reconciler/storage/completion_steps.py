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
from functools import cache
from typing import Any

from sqlalchemy.engine import Connection

from reconciler.core.records import OperationRecord
from reconciler.core.vocabulary import HistoryKind
from reconciler.storage.fastsql import AS_IS, Bound, Sql
from reconciler.storage.history import LAST_HINT, last_hint_at
from reconciler.storage.journal import Also
from reconciler.storage.tables import STEPS
from reconciler.storage.tokens import SALTS


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
_NEW_COLUMNS = ("operation_id", "round", "step", "status", "idempotency_key", "attempts")
_RECORD_COLUMNS = (
    "round",
    "step",
    "status",
    "attempts",
    "started_at",
    "finished_at",
    "next_attempt_at",
    "last_error",
)


@cache
def _ensure_sql(rows: int) -> Sql:
    """Insert ``rows`` step rows unless the row of (operation, round, step) exists."""
    one = f"({', '.join(['?'] * len(_NEW_COLUMNS))})"
    return Sql(
        "steps-ensure",
        STEPS,
        f"INSERT INTO completion_steps ({', '.join(_NEW_COLUMNS)}) "
        f"VALUES {', '.join([one] * rows)} ON CONFLICT (operation_id, round, step) DO NOTHING",
        params=_NEW_COLUMNS * rows,
    )


@cache
def _ensure_and_read_sql(rows: int, salts: bool) -> Sql:
    """PostgreSQL: ``_ensure_sql`` and ``_OF_ROUND`` in one statement, each row with the
    operation's last webhook hint (``history.LAST_HINT``: the lag's start) and, with
    ``salts``, its caller's row of ``tokens.SALTS`` (the callback's signing keys). The
    rows it makes come from the INSERT's RETURNING; those that were there come from the
    table, whose snapshot (the statement's start) does not hold the new ones, so none
    comes twice."""
    insert = _ensure_sql(rows)
    columns = ", ".join(_STEP_COLUMNS)
    ctes = [f"made AS ({insert.text} RETURNING {columns})", f"hint AS ({LAST_HINT.text})"]
    params = [*insert.params, *(f"history.{name}" for name in LAST_HINT.params)]
    extra, join, returns = "(SELECT at FROM hint)", "", ["history.at"]
    if salts:
        ctes.append(f"salts AS ({SALTS.text} LIMIT 1)")
        params += [f"api_tokens.{name}" for name in SALTS.params]
        extra += ", " + ", ".join(f"salts.{name}" for name in SALTS.returns)
        join = " LEFT JOIN salts ON true"
        returns += [f"api_tokens.{name}" for name in SALTS.returns]
    return Sql(
        "steps-ensure-and-read",
        STEPS,
        f"WITH {', '.join(ctes)} SELECT {columns}, {extra} FROM made{join} UNION ALL "
        f"SELECT {columns}, {extra} FROM completion_steps{join} "
        "WHERE operation_id = ? AND round = ? AND step IN (?*)",
        params=(*params, "operation_id", "round", "step"),
        returns=(*_STEP_COLUMNS, *returns),
    )


_OF_ROUND = Sql(
    "steps-of-round",
    STEPS,
    f"SELECT {', '.join(_STEP_COLUMNS)} FROM completion_steps "
    "WHERE operation_id = ? AND round = ? AND step IN (?*)",
    params=("operation_id", "round", "step"),
    returns=_STEP_COLUMNS,
)
_REOPEN = Sql(
    "steps-reopen",
    STEPS,
    "UPDATE completion_steps SET status = ?, attempts = 0, next_attempt_at = NULL "
    "WHERE operation_id = ? AND round = ? AND status = ?",
    params=("status", "operation_id", "round", "status"),
)
_OF_OPERATION = Sql(
    "steps-of-operation",
    STEPS,
    f"SELECT {', '.join(_RECORD_COLUMNS)} FROM completion_steps "
    "WHERE operation_id = ? ORDER BY round, id",
    params=("operation_id",),
    returns=_RECORD_COLUMNS,
)


@cache
def _set_sql(keys: tuple[str, ...], only: bool) -> Sql:
    """UPDATE ``keys`` of one step row of a round (``only``: on one status)."""
    return Sql(
        "step-set",
        STEPS,
        f"UPDATE completion_steps SET {', '.join(f'{k} = ?' for k in keys)} "
        "WHERE operation_id = ? AND round = ? AND step = ?" + (" AND status = ?" if only else ""),
        params=(*keys, "operation_id", "round", "step", *(("status",) if only else ())),
    )


@dataclass(frozen=True)
class Round:
    """A completion round's step rows as ``ensure_all`` found them, with what came along."""

    rows: list[StepRow]
    hinted_at: datetime | None  # the last webhook hint, when no step has begun (the lag)
    salts: Sequence[Any] | None = None  # the caller's ``tokens.SALTS`` row (None: none)
    salts_read: bool = False  # whether ``salts`` was read (else read it when needed)


def _new_rows(op: OperationRecord, names: Sequence[str]) -> list[Any]:
    """The values of ``_ensure_sql`` for ``names``: each pending, never tried."""
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
    return params


def made(op: OperationRecord, names: Sequence[str]) -> Also:
    """The round's rows, pending, made by the move that opens the round (its end state:
    ``Journal.transition``), so the step that begins the round finds them and starts its
    step in one statement (``start_expected``). ``ensure_all`` still makes any missing."""
    return Bound(_ensure_sql(len(names)), tuple(_new_rows(op, names)))


_DONE_BEFORE = "(o.step IN (?*) AND o.status = ?)"
_FRESH_AFTER = "(o.step IN (?*) AND o.status = ? AND o.attempts = 0 AND o.next_attempt_at IS NULL)"


@cache
def _start_sql(hint: bool, salts: bool) -> Sql:
    """PostgreSQL: mark one step of a round running if the round stands as expected, every
    step before it done and every one after it never tried; returns its attempts after,
    and with ``hint`` the last webhook hint, with ``salts`` the caller's ``tokens.SALTS``
    row (one statement with the operation's write: ``Journal.write_if``)."""
    returning, returns = ["completion_steps.attempts"], ["attempts"]
    params: list[str] = ["status", "started_at"]
    source = ""
    if salts:
        source = f" FROM (SELECT 1) AS one LEFT JOIN ({SALTS.text} LIMIT 1) AS salts ON true"
        params += [f"api_tokens.{name}" for name in SALTS.params]
        returning += [f"salts.{name}" for name in SALTS.returns]
        returns += [f"api_tokens.{name}" for name in SALTS.returns]
    params += [
        "operation_id",
        "round",
        "step",
        "status",
        "next_attempt_at",
        "operation_id",
        "round",
        "step",
        "status",
        "step",
        "status",
        AS_IS,
    ]
    if hint:
        returning.append(f"({LAST_HINT.text})")
        params += [f"history.{name}" for name in LAST_HINT.params]
        returns.append("history.at")
    return Sql(
        "step-start-expected",
        STEPS,
        "UPDATE completion_steps SET status = ?, attempts = completion_steps.attempts + 1, "
        f"started_at = ?{source} WHERE completion_steps.operation_id = ? "
        "AND completion_steps.round = ? AND completion_steps.step = ? "
        "AND completion_steps.status = ? AND (completion_steps.next_attempt_at IS NULL "
        "OR completion_steps.next_attempt_at <= ?) AND (SELECT count(*) FROM completion_steps o "
        f"WHERE o.operation_id = ? AND o.round = ? AND ({_DONE_BEFORE} OR {_FRESH_AFTER})) = ? "
        f"RETURNING {', '.join(returning)}",
        params=params,
        returns=returns,
    )


@dataclass(frozen=True)
class Started:
    """What ``start_expected``'s statement answered: the step's attempts now, and what came
    along (the last webhook hint, the caller's salts row: as in ``Round``)."""

    attempts: int
    hinted_at: datetime | None
    salts: Sequence[Any] | None
    salts_read: bool


def start_expected(
    op: OperationRecord,
    names: Sequence[str],
    index: int,
    now: datetime,
    *,
    hint: bool,
    salts: bool,
) -> Bound:
    """The gate of ``Journal.write_if`` that starts step ``index`` of ``names`` (due now)
    when the steps before it are done and those after it untried: what a claim of the
    round's share expects (the hooks of a round just opened, the callback after them).
    Anything else (a row missing, a retry waiting) changes nothing, and the caller reads
    the round (``ensure_all``)."""
    values: list[Any] = [StepStatus.RUNNING.value, now]
    if salts:
        values.append(op.caller)
    values += [
        op.id,
        op.completion_round,
        names[index],
        StepStatus.PENDING.value,
        now,
        op.id,
        op.completion_round,
        list(names[:index]),
        StepStatus.DONE.value,
        list(names[index + 1 :]),
        StepStatus.PENDING.value,
        len(names) - 1,
    ]
    if hint:
        values += [op.id, HistoryKind.HINT.value]
    return Bound(_start_sql(hint, salts), tuple(values))


def started(row: Sequence[Any], *, hint: bool, salts: bool) -> Started:
    """``start_expected``'s answer row, as read back by ``Journal.write_if``."""
    attempts, rest = int(row[0]), row[1:]
    found: Sequence[Any] | None = None
    if salts:
        found, rest = rest[: len(SALTS.returns)], rest[len(SALTS.returns) :]
        if found[0] is None:
            found = None
    return Started(attempts, rest[0] if hint else None, found, salts)


def ensure_all(
    conn: Connection, op: OperationRecord, names: Sequence[str], *, salts: bool = False
) -> Round:
    """This round's rows of the named steps, in that order; made ``pending`` the first time.
    With them, when the round is fresh (no step begun yet), the operation's last webhook
    hint: where the lag metric starts; and with ``salts`` on PostgreSQL the caller's
    callback salts (what signs a callback step's request), read in the same statement.

    One INSERT for the missing ones (the unique key decides, so concurrent handlers
    cannot both make a row) and one SELECT for all of them; on PostgreSQL both in one
    statement, read again only if a row another transaction made meanwhile is missing.
    """
    if not names:
        return Round([], None)
    params = _new_rows(op, names)
    of_round = (op.id, op.completion_round, list(names))
    width = len(_STEP_COLUMNS)
    along: Sequence[Any] = ()
    if conn.dialect.name == "postgresql":
        rows = _ensure_and_read_sql(len(names), salts).rows(
            conn,
            *params,
            op.id,
            HistoryKind.HINT.value,
            *((op.caller,) if salts else ()),
            *of_round,
        )
        if len(rows) < len(names):
            rows = _OF_ROUND.rows(conn, *of_round)
        else:
            along = rows[0][width:]
    else:
        _ensure_sql(len(names)).run(conn, *params)
        rows = _OF_ROUND.rows(conn, *of_round)
    found = {
        step: StepRow(step, StepStatus(status), attempts, next_attempt_at, key)
        for step, status, attempts, next_attempt_at, key, *_ in rows
    }
    ordered = [found[name] for name in names]
    fresh = all(r.status is StepStatus.PENDING and r.attempts == 0 for r in ordered)
    hinted_at = None
    if fresh:
        hinted_at = along[0] if along else last_hint_at(conn, op.id)
    if len(along) > 1:
        row = along[1:]
        return Round(ordered, hinted_at, row if row[0] is not None else None, True)
    return Round(ordered, hinted_at)


def ensure(conn: Connection, op: OperationRecord, step: str) -> StepRow:
    """The step's row for this round, made ``pending`` the first time it is asked for."""
    return ensure_all(conn, op, [step]).rows[0]


# A step row's change, written with the operation's own (``Journal.write(also=...)``).
StepChange = Also


def _change(
    op: OperationRecord, step: str, values: Mapping[str, Any], only: str = ""
) -> StepChange:
    """The UPDATE of one step row of this round (``only``: an extra condition on its status)."""
    keys = tuple(values)
    params = [*[values[k] for k in keys], op.id, op.completion_round, step]
    return Bound(_set_sql(keys, bool(only)), (*params, *([only] if only else [])))


def running(op: OperationRecord, row: StepRow, now: datetime) -> StepChange:
    """Recorded before the step runs: a crash from here on means "may have run". Written
    with the operation's row (``Journal.write(also=...)``), under its lease."""
    values = {"status": StepStatus.RUNNING.value, "attempts": row.attempts + 1, "started_at": now}
    return _change(op, row.step, values)


def done(op: OperationRecord, step: str, now: datetime) -> StepChange:
    """The step finished (only a running one), written with the operation's row."""
    values = {"status": StepStatus.DONE.value, "finished_at": now, "last_error": None}
    return _change(op, step, values, only=StepStatus.RUNNING.value)


def failed(
    op: OperationRecord, step: str, error: str, *, give_up: bool, retry_at: datetime | None
) -> StepChange:
    """The step failed: pending again until ``retry_at``, or given up."""
    values = {
        "status": (StepStatus.GAVE_UP if give_up else StepStatus.PENDING).value,
        "last_error": error,
        "next_attempt_at": None if give_up else retry_at,
    }
    return _change(op, step, values)


def reopen_given_up(conn: Connection, op: OperationRecord) -> None:
    """An operator extended delivery: the steps that gave up this round may try again."""
    _REOPEN.run(
        conn,
        StepStatus.PENDING.value,
        op.id,
        op.completion_round,
        StepStatus.GAVE_UP.value,
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
    return [
        StepRecord(r, step, StepStatus(status), attempts, started, finished, next_at, error)
        for r, step, status, attempts, started, finished, next_at, error in _OF_OPERATION.rows(
            conn, operation_id
        )
    ]
