"""The MCP tool definitions and the task mapping, without a server: pure values."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from reconciler.agent_tools.definitions import ToolName, build_tools
from reconciler.agent_tools.refusals import tool_error
from reconciler.agent_tools.request_summary import field_lines, request_summary
from reconciler.agent_tools.server import INSTRUCTIONS, tool_message
from reconciler.agent_tools.tasks import poll_interval_ms, task_status, task_view
from reconciler.core.errors import Gone, InvalidRequest, NotFound
from reconciler.core.states import END_STATES, State, awaits_decision, is_done
from reconciler.wire import Operation
from reconciler.wire.schemas import model_schema


def test_six_tools_with_valid_schemas() -> None:
    toolset = build_tools(60.0)
    assert [t.name for t in toolset.tools] == [n.value for n in ToolName]
    for tool in toolset.tools:
        Draft202012Validator.check_schema(tool.input_schema)
        assert tool.output_schema is not None
        Draft202012Validator.check_schema(tool.output_schema)
    by_name = {t.name: t for t in toolset.tools}
    assert by_name["get_job"].output_schema == model_schema(Operation)
    wait = by_name["wait_job"].input_schema["properties"]["timeout_seconds"]
    assert wait["maximum"] == 60 and isinstance(wait["maximum"], int)
    assert "at most 60" in (by_name["wait_job"].description or "")
    assert toolset.default_wait() == 30.0
    assert build_tools(5.0).default_wait() == 5.0


@pytest.mark.parametrize(
    ("tool", "arguments", "message"),
    [
        ("get_job", {}, "'id' is required"),
        ("get_job", {"id": ""}, "'id' must not be empty"),
        ("get_job", {"id": "op_1", "x": 1}, "unknown argument(s): x; allowed: id"),
        ("wait_job", {"id": "op_1", "timeout_seconds": True}, "'timeout_seconds' must be a number"),
        ("wait_job", {"id": "op_1", "timeout_seconds": 61}, "'timeout_seconds' must be at most 60"),
        ("start_job", {"provider": "p", "request": []}, "'request' must be a JSON object, got an"),
        ("list_jobs", {"done": "no"}, "'done' must be true or false, got a string"),
        ("missing", {}, "there is no tool 'missing'; the tools are: start_job, get_job"),
    ],
)
def test_argument_errors_name_the_field(tool: str, arguments: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        build_tools(60.0).check(tool, arguments)
    assert message in caught.value.message


def test_good_arguments_pass() -> None:
    toolset = build_tools(60.0)
    tool, args = toolset.check("wait_job", {"id": "op_1", "timeout_seconds": 60})
    assert tool is ToolName.WAIT_JOB and args.model_dump() == {"id": "op_1", "timeout_seconds": 60}
    assert toolset.check("list_jobs", {})[0] is ToolName.LIST_JOBS


def view(state: State, escalation: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    is_open = escalation is not None and not escalation["decided"]
    return {
        "id": "op_1",
        "state": state.value,
        "done": is_done(state, is_open),
        "awaiting_decision": awaits_decision(state, is_open),
        "message": "Waiting. Wait with GET /v1/operations/op_1/wait.",
        "escalation": escalation,
        "poll_after_seconds": None if state in END_STATES else 2.0,
        "created_at": "2026-01-01T00:00:00Z",
        "updated_at": "2026-01-01T00:01:00Z",
        "deadline_at": "2026-01-01T01:00:00Z",
        **extra,
    }


CREATED = datetime(2026, 1, 1, tzinfo=UTC)


OPEN = {"message": "External job needs a decision\n...", "decided": False}
DECIDED = {"message": "External job needs a decision\n...", "decided": True}


@pytest.mark.parametrize(
    ("state", "escalation", "status"),
    [
        (State.OBSERVING, None, "working"),
        (State.CREATE_PENDING, None, "working"),
        (State.ESCALATED, OPEN, "working"),
        (State.RESULT_TIMED_OUT, OPEN, "working"),  # a decision may still reopen it
        (State.CANCELLATION_UNCONFIRMED, OPEN, "working"),
        (State.RESULT_TIMED_OUT, DECIDED, "completed"),
        (State.SUCCEEDED, None, "completed"),
        (State.SUCCEEDED, OPEN, "completed"),  # an undeliverable callback: the outcome stands
        (State.FAILED, None, "completed"),
        (State.COMPLETED_WITH_ERRORS, None, "completed"),
        (State.CANCELLED, None, "cancelled"),
    ],
)
def test_task_status(state: State, escalation: dict[str, Any] | None, status: str) -> None:
    assert task_status(view(state, escalation)) == status


def test_a_working_task_carries_no_result_and_says_when_to_poll() -> None:
    task = task_view(view(State.OBSERVING), "msg", {"content": []}, CREATED, result_type="task")
    assert task["resultType"] == "task" and task["taskId"] == "op_1"
    assert task["pollIntervalMs"] == 1000 and task["ttlMs"] is None
    assert task["statusMessage"] == "msg" and "result" not in task


@pytest.mark.parametrize(
    ("age", "extra", "expected"),
    [
        (0.0, {}, 1000),  # a new job: news may come at once
        (2.0, {}, 1000),
        (8.0, {}, 2000),  # a quarter of its age...
        (600.0, {}, 5000),  # ...never more than a few seconds, whatever the poller does
        (600.0, {"poll_after_seconds": 3.0}, 3000),  # the next status read comes first
        (600.0, {"poll_after_seconds": 300.0}, 5000),  # a stretched fallback read does not
        (3599.5, {}, 500),  # never past the deadline
        (3599.95, {}, 250),  # ...though not a busy loop either
        (3700.0, {"poll_after_seconds": 60.0}, 5000),  # past it, a person decides
    ],
)
def test_a_task_is_polled_when_news_may_come(
    age: float, extra: dict[str, Any], expected: int
) -> None:
    now = CREATED + timedelta(seconds=age)
    hinted = {"poll_after_seconds": None, **extra}
    assert poll_interval_ms(view(State.OBSERVING, **hinted), now) == expected


def test_a_finished_task_carries_the_tool_result_a_cancelled_one_too() -> None:
    pending = view(State.ESCALATED, OPEN)
    escalated = task_view(pending, "decide", {}, CREATED, result_type="complete")
    assert escalated["status"] == "working" and escalated["statusMessage"] == "decide"
    assert "result" not in escalated
    result = {"content": [{"type": "text", "text": "done"}], "isError": False}
    finished = task_view(view(State.SUCCEEDED), "done", result, CREATED, result_type="complete")
    assert finished["result"] == result and "pollIntervalMs" not in finished
    cancelled = task_view(view(State.CANCELLED), "gone", result, CREATED, result_type="complete")
    assert cancelled["status"] == "cancelled" and cancelled["result"] == result


def test_the_next_step_is_named_as_a_tool() -> None:
    text = tool_message(view(State.OBSERVING))
    assert text == 'Waiting. Wait with wait_job(id="op_1"); it waits on the server.'


# --- the tools in MCP's own terms ----------------------------------------------------------

HTTP_WORDS = re.compile(r"/v1/|\bGET\b|\bPOST\b|``|HTTP API")


def _texts(node: Any) -> list[str]:
    """Every description and title in a schema (what a model reads of it)."""
    if isinstance(node, dict):
        found = [v for k, v in node.items() if k in ("description", "title") and isinstance(v, str)]
        return found + [t for v in node.values() for t in _texts(v)]
    if isinstance(node, list):
        return [t for v in node for t in _texts(v)]
    return []


def test_no_tool_sends_the_agent_to_the_http_api() -> None:
    for tool in build_tools(60.0).tools:
        texts = [tool.description or "", *_texts(tool.input_schema), *_texts(tool.output_schema)]
        for text in texts:
            assert not HTTP_WORDS.search(text), (tool.name, text)
    assert not HTTP_WORDS.search(INSTRUCTIONS)


def test_defaults_and_the_deadline_are_said_where_the_fields_are() -> None:
    start = {t.name: t for t in build_tools(60.0).tools}["start_job"].input_schema
    deadline = start["properties"]["deadline_seconds"]["description"]
    assert "Default: the provider's `max_deadline_seconds`" in deadline
    assert "an operator decides" in deadline and "NOT done" in deadline
    budget = start["properties"]["max_status_requests"]["description"]
    assert "Default: the provider's `max_status_requests`" in budget
    # An optional argument is left out: no schema offers null or names null its default.
    for tool in build_tools(60.0).tools:
        for name, prop in tool.input_schema["properties"].items():
            assert "default" not in prop or prop["default"] is not None, (tool.name, name)
            assert "anyOf" not in prop, (tool.name, name)


def test_the_output_has_one_error_shape_and_typed_progress() -> None:
    out = {t.name: t for t in build_tools(60.0).tools}["get_job"].output_schema
    assert out is not None
    defs = out["$defs"]
    assert set(defs["OperationError"]["properties"]) == {
        "code",
        "message",
        "http_status",
        "provider_message",
        "detail",
    }
    assert set(defs["Progress"]["properties"]) == {"completed", "total", "detail"}
    assert {"awaiting_decision", "replayed", "done"} <= set(out["required"])


@pytest.mark.parametrize(
    ("tool", "read_only", "destructive", "open_world"),
    [
        ("start_job", False, False, True),
        ("get_job", True, None, False),
        ("wait_job", True, None, False),
        ("cancel_job", False, True, True),
        ("list_jobs", True, None, False),
        ("list_providers", True, None, False),
    ],
)
def test_tool_annotations(
    tool: str, read_only: bool, destructive: bool | None, open_world: bool
) -> None:
    hints = {t.name: t for t in build_tools(60.0).tools}[tool].annotations
    assert hints is not None and hints.title
    assert hints.read_only_hint is read_only
    assert hints.destructive_hint is destructive
    assert hints.open_world_hint is open_world


def test_tasks_are_discoverable_without_the_extension() -> None:
    start = {t.name: t for t in build_tools(60.0).tools}["start_job"].description or ""
    for text in (INSTRUCTIONS, start):
        assert "io.modelcontextprotocol/tasks" in text and "tasks/get" in text
        assert "`taskId` is the job's `id`" in text


def test_a_decision_hint_is_named_as_a_tool() -> None:
    message = (
        "Waiting STOPPED. GET /v1/operations/op_1/wait returns as soon as the decision is made."
    )
    text = tool_message({**view(State.RESULT_TIMED_OUT), "message": message})
    assert text == 'Waiting STOPPED. wait_job(id="op_1") returns as soon as the decision is made.'


SCHEMAS = [
    (None, "any JSON object (no request_schema)"),
    ({"type": "object"}, "no required fields"),
    (
        {
            "type": "object",
            "required": ["scenario", "window"],
            "properties": {
                "scenario": {"enum": ["a", "b"]},
                "window": {"const": "24h"},
                "n": {"type": "integer", "minimum": 1, "maximum": 5},
            },
            "additionalProperties": False,
        },
        'required: scenario (one of: a, b), window ("24h"); no other fields',
    ),
    (
        {"anyOf": [{"required": ["model"]}, {"required": ["prompt"]}], "properties": {}},
        "required: one of model (any) | prompt (any)",
    ),
]


@pytest.mark.parametrize(("schema", "text"), SCHEMAS)
def test_a_request_schema_in_one_line(schema: Any, text: str) -> None:
    assert request_summary(schema) == text


def test_every_field_is_listed_with_its_description_and_nothing_is_cut() -> None:
    values = [f"v{i}" for i in range(20)]
    schema = {
        "type": "object",
        "required": ["mode"],
        "properties": {
            "mode": {"enum": values, "description": "How it runs.\n v0: plain."},
            **{f"knob{i}": {"type": "number", "minimum": 0} for i in range(15)},
            "fault": {"anyOf": [{"enum": [429, 503]}, {"type": "null"}]},
            "error": {"type": "object", "properties": {"code": {"type": "string"}}},
        },
    }
    lines = field_lines(schema)
    assert len(lines) == 18
    assert lines[0] == f"mode (one of: {', '.join(values)}, required): How it runs. v0: plain."
    assert lines[1] == "knob0 (number from 0)"
    assert lines[-2] == "fault (one of: 429, 503 or null)"
    assert lines[-1] == "error (object with code (string))"
    assert field_lines(None) == []


def test_a_pruned_job_is_a_tool_error_that_says_once_that_nothing_was_started() -> None:
    gone = tool_error("get_job", Gone("operation op_1 ended succeeded ... removed by retention"))
    text = gone.content[0].text  # type: ignore[union-attr]
    assert gone.is_error and "removed by retention" in text
    assert text.count("started") == 1 and "Nothing was started" in text
    assert "new idempotency_key" in text and "Check the id" not in text and "long ago" not in text
    replay = tool_error(
        "start_job",
        Gone(
            "idempotency_key 'k' named operation op_1 ended succeeded ...; no new job was "
            "started. Use a new idempotency_key to start a new one"
        ),
    )
    said = replay.content[0].text  # type: ignore[union-attr]
    assert said.count("started") == 1 and said.count("new idempotency_key") == 1
    unknown = tool_error("get_job", NotFound("operation op_2 does not exist"))
    assert "Check the id" in unknown.content[0].text  # type: ignore[union-attr]
