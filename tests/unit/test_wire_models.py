"""The wire models are the one description of each shape: the OpenAPI components and the
MCP tool schemas are generated from them, the Operation views the core builds validate
against them, and the client's typed Operation has their fields."""

from __future__ import annotations

import dataclasses
import types
import typing
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from reconciler.agent_tools.definitions import ANSWERS, ARGUMENTS, ToolName, build_tools
from reconciler.api import openapi
from reconciler.client import model as client
from reconciler.core.clock import utc
from reconciler.core.operation_view import operation_view
from reconciler.core.states import END_STATES, State, awaits_decision, is_done
from reconciler.core.strict_json import parse_json
from reconciler.inbound.errors import error_response
from reconciler.storage.models import Escalation as EscalationRow
from reconciler.wire import (
    CallbackEvent,
    ErrorBody,
    Operation,
)
from reconciler.wire import answers as wire_answers
from reconciler.wire.events import COMPLETED
from reconciler.wire.schemas import components, model_schema
from tests.support.factories import new_operation
from tests.support.imports import modules_after, top_level

ROOT = Path(__file__).resolve().parents[2]
NOW = utc(datetime(2025, 3, 8, 14, 22, 11))
REF = "#/components/schemas/"


# --- OpenAPI ------------------------------------------------------------------------------


def test_the_openapi_components_are_the_models_schemas() -> None:
    doc = openapi.document([], 30.0)
    assert doc["components"]["schemas"] == components(openapi.WIRE_MODELS)


def test_the_configured_providers_are_the_only_value_added() -> None:
    plain = openapi.document([], 30.0)["components"]["schemas"]
    doc = openapi.document(["acme", "sim"], 30.0)["components"]["schemas"]
    provider = doc["CreateOperation"]["properties"]["provider"]
    assert provider.pop("enum") == ["acme", "sim"]
    assert doc == plain


def _refs(node: Any) -> set[str]:
    if isinstance(node, dict):
        found = {node["$ref"]} if isinstance(node.get("$ref"), str) else set()
        return found.union(*(_refs(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_refs(v) for v in node))
    return set()


def _bodies(operation: dict[str, Any]) -> list[dict[str, Any]]:
    bodies = [operation["requestBody"]] if "requestBody" in operation else []
    bodies += list(operation["responses"].values())
    return [b["content"]["application/json"]["schema"] for b in bodies if "content" in b]


def test_every_documented_body_is_a_wire_model() -> None:
    doc = openapi.document(["sim"], 30.0)
    models = {m.__name__ for m in openapi.WIRE_MODELS}
    seen: set[str] = set()
    for path, methods in doc["paths"].items():
        for method, operation in methods.items():
            for schema in _bodies(operation):
                assert set(schema) == {"$ref"}, f"{method} {path}: a body written by hand"
                name = schema["$ref"].removeprefix(REF)
                assert name in models, f"{method} {path}: {name} is not a wire model"
                seen.add(name)
    assert seen == models  # and no model is documented without a path that uses it
    # Every reference inside resolves to a generated component.
    assert {r.removeprefix(REF) for r in _refs(doc)} <= set(doc["components"]["schemas"])


# --- MCP ----------------------------------------------------------------------------------


@pytest.mark.parametrize("cap", [20.0, 60.0, 7.5])
def test_the_tool_schemas_are_the_models_schemas(cap: float) -> None:
    tools = {t.name: t for t in build_tools(cap).tools}
    assert set(tools) == {t.value for t in ToolName}
    capped = {ToolName.START_JOB: "wait_seconds", ToolName.WAIT_JOB: "timeout_seconds"}
    for name in ToolName:
        tool = tools[name.value]
        assert tool.output_schema == model_schema(ANSWERS[name])
        expected = model_schema(ARGUMENTS[name])
        if name in capped:
            prop = expected["properties"][capped[name]]
            assert "maximum" not in prop
            prop["maximum"] = int(cap) if cap.is_integer() else cap
        assert tool.input_schema == expected


def test_a_tool_answers_with_the_apis_operation() -> None:
    assert ANSWERS[ToolName.GET_JOB] is Operation
    assert ARGUMENTS[ToolName.LIST_JOBS].__name__ == "OperationFilter"


# --- the core's views ---------------------------------------------------------------------

OPTIONS = [
    {
        "action": "extend",
        "description": "Wait 10 more minutes",
        "extra_seconds": 600.0,
        "extra_status_requests": 6,
    },
    {"action": "cancel", "description": "Ask the provider to cancel"},
    {"action": "abandon", "description": "Stop waiting"},
]


def _escalation(decided: bool) -> EscalationRow:
    return EscalationRow(
        id=4,
        operation_id="op_x",
        reason="deadline_exceeded",
        message="Operation op_x: waiting stopped.",
        options=OPTIONS,
        created_at=NOW,
        decided_at=NOW + timedelta(minutes=3) if decided else None,
        decided_by="operator:ops" if decided else None,
        decision={"action": "abandon"} if decided else None,
    )


def _facts(state: State, with_result: bool) -> dict[str, Any]:
    facts: dict[str, Any] = {"state": state.value, "remote_job_id": "job_7ad2"}
    if with_result:
        facts["result"] = {"summary": {"ok": 3}, "failed_items": []}
        facts["error"] = {"code": "provider_failure", "message": "quota"}
        facts["progress"] = {"completed": 146, "total": 500}
        facts["meta"] = {"ticket": "T-1"}
        facts["idempotency_key"] = "idem-1"
        facts["callback_url"] = "https://agent.example/hook"
        facts["remote_state"] = "running"
        facts["next_poll_at"] = NOW + timedelta(seconds=30)
    if state in END_STATES:
        facts["done_at"] = NOW
    return facts


CASES = [
    (state, with_result, escalation)
    for state in State
    for with_result in (False, True)
    for escalation in (None, "open", "decided")
]


@pytest.mark.parametrize(
    ("state", "with_result", "escalation"),
    CASES,
    ids=[f"{s.value}-{'full' if r else 'bare'}-{e or 'none'}" for s, r, e in CASES],
)
def test_the_core_view_validates_against_the_model(
    state: State, with_result: bool, escalation: str | None
) -> None:
    row = None if escalation is None else _escalation(escalation == "decided")
    is_open = escalation == "open"
    op = new_operation(NOW, escalation_open=is_open, **_facts(state, with_result))
    view = operation_view(op, NOW, row)
    parsed = Operation.model_validate(view)
    assert set(view) == set(Operation.model_fields)
    assert parsed.done is is_done(state, is_open)
    assert parsed.awaiting_decision is awaits_decision(state, is_open)
    assert not (parsed.done and parsed.awaiting_decision)
    assert (parsed.escalation is None) is (escalation is None)
    # The client reads the same view without losing a field.
    read = client.Operation.from_json(view)
    assert read.state == state.value and read.done is parsed.done
    assert read.awaiting_decision is parsed.awaiting_decision
    assert (read.error is None) is (parsed.error is None)
    assert (read.progress is None) is (parsed.progress is None)


def test_the_callback_event_carries_the_operation() -> None:
    view = operation_view(new_operation(NOW, state=State.SUCCEEDED.value), NOW)
    event = CallbackEvent.model_validate({"type": COMPLETED, "operation": view})
    assert event.operation.state == State.SUCCEEDED.value


def test_an_error_answer_is_the_error_body() -> None:
    body = parse_json(bytes(error_response(400, "invalid_request", "'provider' is required").body))
    assert ErrorBody.model_validate(body).error.message == "'provider' is required"


# --- the client's typed Operation ---------------------------------------------------------

_JSON_TYPES: dict[Any, str] = {
    str: "string",
    datetime: "string",
    bool: "boolean",
    int: "integer",
    float: "number",
    type(None): "null",
}


def _kinds(annotation: Any) -> set[str]:
    """The JSON types a Python annotation reads (the client's or a model's)."""
    if annotation is Any:
        return {"any"}
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return set().union(*(_kinds(a) for a in typing.get_args(annotation)))
    if origin is typing.Annotated:
        return _kinds(typing.get_args(annotation)[0])
    if origin in (tuple, list):
        return {"array"}
    if origin is not None:  # Mapping[...], dict[...]
        return {"object"}
    if isinstance(annotation, type) and issubclass(annotation, str):  # an enum of words
        return {"string"}
    if annotation in _JSON_TYPES:
        return {_JSON_TYPES[annotation]}
    if dataclasses.is_dataclass(annotation) or (
        isinstance(annotation, type) and issubclass(annotation, BaseModel)
    ):
        return {"object"}
    raise AssertionError(f"no JSON type for {annotation!r}")


PAIRS = [
    (client.Operation, wire_answers.Operation),
    (client.Budget, wire_answers.Budget),
    (client.Escalation, wire_answers.Escalation),
    (client.EscalationOption, wire_answers.EscalationOption),
    (client.Progress, wire_answers.Progress),
    (client.OperationError, wire_answers.OperationError),
]


@pytest.mark.parametrize(("typed", "model"), PAIRS, ids=[m.__name__ for _, m in PAIRS])
def test_the_clients_types_have_the_models_fields(typed: type, model: type[BaseModel]) -> None:
    hints = typing.get_type_hints(typed)
    fields = {f.name for f in dataclasses.fields(typed)} - {"raw"}
    assert fields == set(model.model_fields)
    for name, field in model.model_fields.items():
        sent, read = _kinds(field.annotation), _kinds(hints[name])
        # The client may be more lenient (an older service may leave a key out), never less.
        assert sent - {"null"} <= read or "any" in read, name
        if "null" in sent:
            assert "null" in read, f"{name}: the service may send null"


# --- what importing the models costs ------------------------------------------------------


def test_the_models_import_neither_the_web_stack_nor_the_database_nor_the_layers_above() -> None:
    modules = modules_after("import reconciler.wire")
    heavy = {"starlette", "sqlalchemy", "sqlmodel", "uvicorn", "jsonschema", "httpx", "mcp"}
    assert not top_level(modules) & heavy
    ours = {"reconciler", "reconciler.core", "reconciler.wire"}
    above = {
        m for m in modules if m.startswith("reconciler.") and ".".join(m.split(".")[:2]) not in ours
    }
    assert not above
