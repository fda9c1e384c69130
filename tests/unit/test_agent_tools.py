"""The MCP tool definitions and the task mapping, without a server: pure values."""

from __future__ import annotations

from typing import Any

import pytest
from jsonschema import Draft202012Validator

from reconciler.agent_tools.definitions import ToolName, build_tools
from reconciler.agent_tools.server import tool_message
from reconciler.agent_tools.tasks import poll_interval_ms, task_status, task_view
from reconciler.core.errors import InvalidRequest
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
        **extra,
    }


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


def test_a_working_task_polls_at_the_operation_hint_and_carries_no_result() -> None:
    task = task_view(view(State.OBSERVING), "msg", {"content": []}, result_type="task")
    assert task["resultType"] == "task" and task["taskId"] == "op_1"
    assert task["pollIntervalMs"] == 2000 and task["ttlMs"] is None
    assert "result" not in task
    assert poll_interval_ms(view(State.ESCALATED, OPEN, poll_after_seconds=None)) == 30_000


def test_an_escalated_task_says_why_and_a_finished_one_carries_the_result() -> None:
    escalated = task_view(view(State.ESCALATED, OPEN), "msg", {}, result_type="complete")
    assert escalated["statusMessage"] == OPEN["message"]
    result = {"content": [{"type": "text", "text": "done"}], "isError": False}
    finished = task_view(view(State.SUCCEEDED), "done", result, result_type="complete")
    assert finished["result"] == result and "pollIntervalMs" not in finished


def test_the_next_step_is_named_as_a_tool() -> None:
    text = tool_message(view(State.OBSERVING))
    assert text == 'Waiting. Wait with wait_job(id="op_1"); it waits on the server.'
