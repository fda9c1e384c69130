"""A step's last write: prepare the next step, give the lease back, or neither."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from reconciler.core.records import OperationRecord
from reconciler.engine.flow import Flow, Prep
from tests.support.factories import new_operation

NOW = datetime(2026, 1, 1, tzinfo=UTC)
CONN: Any = object()  # the write's connection: only handed through


class Next:
    def __init__(self) -> None:
        self.prepared: list[str] = []

    def prepare(self, conn: Any, op: OperationRecord, now: datetime) -> Prep | None:
        self.prepared.append(op.id)
        return Prep(op, data="prepared")


def _flow(step: Next | None, keeps: bool, released: list[str]) -> Flow:
    return Flow(
        next_step=lambda _op, _now: step,
        release=lambda _conn, op_id: released.append(op_id),
        keeps=lambda _op: keeps,
    )


def test_a_due_step_in_a_share_the_task_can_take_is_prepared_in_the_write() -> None:
    released: list[str] = []
    step = Next()
    op = new_operation(NOW, next_poll_at=NOW)
    prep, gave_back = _flow(step, True, released).after_write(CONN, op, NOW, final=True)
    assert prep is not None and prep.data == "prepared" and not gave_back
    assert step.prepared == [op.id] and released == []


def test_a_due_step_in_a_full_share_gives_the_lease_back_in_the_write() -> None:
    released: list[str] = []
    step = Next()
    op = new_operation(NOW, next_poll_at=NOW)
    prep, gave_back = _flow(step, False, released).after_write(CONN, op, NOW, final=True)
    assert prep is None and gave_back
    assert released == [op.id] and step.prepared == []  # never prepared: it will not run here


def test_nothing_due_gives_the_lease_back_and_a_write_that_is_not_final_does_neither() -> None:
    released: list[str] = []
    later = new_operation(NOW, next_poll_at=NOW + timedelta(seconds=30))
    flow = _flow(Next(), True, released)
    assert flow.after_write(CONN, later, NOW, final=False) == (None, False)
    assert released == []
    assert flow.after_write(CONN, later, NOW, final=True) == (None, True)
    assert released == [later.id]
