"""The core's row records against the tables they are read from, and how they are built."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic_core import PydanticUndefined
from sqlmodel import SQLModel

from reconciler.core import records
from reconciler.core.records import EscalationRecord, HistoryRecord, OperationRecord
from reconciler.storage.models import Escalation, HistoryEntry, Operation
from reconciler.storage.tables import table_of
from tests.support.factories import new_operation

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _columns(table: type[SQLModel]) -> tuple[str, ...]:
    return tuple(c.name for c in table_of(table).c)


def _annotations(cls: type) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        found.update(getattr(klass, "__annotations__", {}))
    return found


def test_operation_record_is_the_operations_columns_in_table_order_then_the_payloads() -> None:
    # Rows are built positionally from statements that select the table's columns in order.
    assert _columns(Operation) == records.COLUMNS
    assert (*_columns(Operation), *records.PAYLOADS) == records.FIELDS
    assert records.PAYLOADS == ("request", "meta", "status_body", "result")


@pytest.mark.parametrize(
    ("record", "table"),
    [(OperationRecord, Operation), (EscalationRecord, Escalation), (HistoryRecord, HistoryEntry)],
)
def test_each_record_field_has_its_column_name_and_type(record: type, table: type) -> None:
    names = tuple(f.name for f in dataclasses.fields(record))
    assert names[: len(_columns(table))] == _columns(table)
    model, ours = _annotations(table), _annotations(record)
    # Ids the database assigns are never None once read; the rest matches the declaration.
    differ = {
        name: (model[name], ours[name])
        for name in _columns(table)
        if model[name] != ours[name] and not (name == "id" and model[name] == "int | None")
    }
    assert differ == {}


def test_a_new_operation_starts_with_the_tables_defaults() -> None:
    declared = {
        name: info.default
        for name, info in Operation.model_fields.items()
        if info.default is not PydanticUndefined
    }
    assert dict(records.DEFAULTS) == declared


def _values() -> list[Any]:
    return [f"v{i}" for i in range(len(records.COLUMNS))]


def test_a_built_record_is_a_frozen_operation_record() -> None:
    built = records.build_operation(_values())
    assert type(built) is OperationRecord
    assert built == OperationRecord(*_values())
    assert built.request is None and built.result is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.state = "running"  # type: ignore[misc]


def test_a_record_from_a_row_by_name_carries_the_payloads_given() -> None:
    row = dict(zip(records.COLUMNS, _values(), strict=True))
    built = records.operation_of(row, {"meta": {"team": "a"}})
    assert type(built) is OperationRecord
    assert built.meta == {"team": "a"} and built.request is None
    assert built.id == "v0"


def test_changes_give_a_new_record_and_leave_the_old_one_as_it_was() -> None:
    op = new_operation(NOW, id="op_1")
    changed = records.with_changes(op, {"state": "observing", "result": {"n": 1}})
    assert (op.state, op.result) == ("create_pending", None)
    assert (changed.state, changed.result, changed.id) == ("observing", {"n": 1}, "op_1")
    assert type(changed) is OperationRecord
    with pytest.raises(KeyError):
        records.with_changes(op, {"no_such_column": 1})
