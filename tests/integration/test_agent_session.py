"""One agent, nine everyday tasks, through the MCP tools alone: every answer it acts on.

An agent given only the MCP endpoint and a token reads the server's instructions, the
tool descriptions and each answer, and must act correctly on the first try. This test
is that agent, scripted: for each task it makes the calls an agent needs and asserts
what it would act on (``done``, ``state``, ``awaiting_decision``, ``replayed``,
``error.code``, the message's words, tool errors), and how many calls the task took.
A change that makes an answer misleading, or a task take more calls, fails here.

The tasks: what can be started (providers and their schemas), a quick success, a job
longer than one wait, a failure, a start whose answer was lost and is retried with the
same key, a cancel, three mistakes, a job that stops for an operator's decision, and a
start as an MCP task. Against the service on uvicorn and the simulated provider.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
import sqlalchemy as sa
from mcp import Client

from tests.support.mcp import CreateTaskResult, TasksExtension, connect, get_task, run, text_of
from tests.support.stack import Stack, running_stack
from tests.support.waiting import wait_until

FAST_POLLING = {"base_delay_seconds": 0.1, "max_delay_seconds": 0.5}
# Calls the agent makes per task (tools/call; the task's tasks/get polls are counted apart).
EXPECTED_CALLS = {
    "providers": 1,
    "quick_success": 1,
    "longer_than_one_wait": 3,
    "failure": 1,
    "lost_answer": 2,
    "cancel": 3,
    "mistakes": 3,
    "awaiting_decision": 4,
    "task": 1,
}


@pytest.fixture
def stack(tmp_path: Path, db_url: str) -> Iterator[Stack]:
    provider = {"polling": FAST_POLLING}
    with running_stack(tmp_path, db_url, provider=provider, server={"wait_max_seconds": 20.0}) as s:
        yield s


class Agent:
    """The tool calls of one agent, counted per task."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.calls: Counter[str] = Counter()
        self.task = ""

    async def call(self, tool: str, arguments: dict[str, Any]) -> types.CallToolResult:
        self.calls[self.task] += 1
        return await self.client.call_tool(tool, arguments)

    async def job(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """A call that must answer an Operation; its text is the Operation's message."""
        result = await self.call(tool, arguments)
        assert not result.is_error, text_of(result)
        op = result.structured_content
        assert op is not None and text_of(result) == op["message"]
        assert not (op["done"] and op["awaiting_decision"]), op
        return op

    async def refused(self, tool: str, arguments: dict[str, Any]) -> str:
        result = await self.call(tool, arguments)
        assert result.is_error, result.structured_content
        return text_of(result)


def sim(request: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"provider": "sim", "request": request, **fields}


def stored(stack: Stack) -> int:
    with stack.runtime.db.read() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM operations")).scalar_one())


def parked(stack: Stack, op_id: str) -> bool:
    # The notifier keeps one shared event per operation and a count of its waiters.
    return stack.runtime.notifier._counts.get(op_id, 0) >= 1


async def providers(agent: Agent) -> None:
    instructions = agent.client.instructions or ""
    assert "list_providers" in instructions and "`request_schema`" in instructions
    assert "`awaiting_decision: true`" in instructions
    result = await agent.call("list_providers", {})
    text = text_of(result)
    assert result.structured_content is not None
    (provider,) = result.structured_content["providers"]
    schema = provider["request_schema"]
    assert "success" in schema["properties"]["scenario"]["enum"]
    assert schema["properties"]["duration"] == {
        "type": "number",
        "minimum": 0,
        "maximum": 86400,
        "description": "Seconds from create to the outcome.",
    }
    assert provider["max_deadline_seconds"] == 120 and provider["can_cancel"] is True
    assert "- sim: A simulated job provider" in text
    assert "request: no required fields; optional: scenario, duration," in text
    assert "deadline_seconds: 120 s by default, and at most 120 s;" in text
    assert "max_status_requests: 60 by default, and at most 60;" in text
    assert "can cancel: yes" in text


async def quick_success(agent: Agent) -> None:
    op = await agent.job(
        "start_job",
        sim({"scenario": "success", "duration": 0.2}, idempotency_key="quick", wait_seconds=15),
    )
    assert (op["state"], op["done"], op["awaiting_decision"]) == ("succeeded", True, False)
    assert op["message"].startswith("The job SUCCEEDED and its result was verified")
    assert op["result"]["summary"]["processed"] == 100 and op["replayed"] is False
    assert op["progress"]["completed"] == op["progress"]["total"] == 100


async def longer_than_one_wait(agent: Agent) -> None:
    op = await agent.job("start_job", sim({"scenario": "success", "duration": 3}))
    assert (op["done"], op["awaiting_decision"]) == (False, False)
    assert "NOT complete" in op["message"] and "Do not report success" in op["message"]
    assert f'wait_job(id="{op["id"]}")' in op["message"]
    waited = await agent.job("wait_job", {"id": op["id"], "timeout_seconds": 1})
    assert (waited["state"], waited["done"]) == ("observing", False)
    assert "NOT complete" in waited["message"] and waited["poll_after_seconds"] is not None
    done = await agent.job("wait_job", {"id": op["id"], "timeout_seconds": 15})
    assert (done["state"], done["done"]) == ("succeeded", True)


async def failure(agent: Agent) -> None:
    op = await agent.job(
        "start_job", sim({"scenario": "late_failure", "duration": 0.3}, wait_seconds=15)
    )
    assert (op["state"], op["done"], op["awaiting_decision"]) == ("failed", True, False)
    assert op["message"].startswith("The job FAILED; the reason is in `error`")
    error = op["error"]
    assert error["code"] == "provider_failed" and error["http_status"] is None
    assert error["provider_message"] == "Processing failed at item 42: input unreadable."
    assert error["message"].startswith("the provider reports the job failed")
    assert op["result"] is None


async def lost_answer(agent: Agent) -> None:
    request = sim({"scenario": "success", "duration": 0.5}, idempotency_key="report-q3")
    first = await agent.job("start_job", request)  # its answer never reached the agent
    again = await agent.job("start_job", request)
    assert again["id"] == first["id"] and again["replayed"] is True
    assert again["message"].startswith(
        "This is the job started earlier with the same idempotency_key and request; no new "
        "job was started."
    )
    assert first["replayed"] is False


async def cancel(agent: Agent) -> None:
    op = await agent.job("start_job", sim({"scenario": "never_finishes", "duration": 30}))
    asked = await agent.job("cancel_job", {"id": op["id"]})
    assert asked["cancel_requested"] is True and asked["done"] is False
    assert "NOT confirmed" in asked["message"]
    assert "Do not report success or cancellation" in asked["message"]
    ended = await agent.job("wait_job", {"id": op["id"], "timeout_seconds": 15})
    assert (ended["state"], ended["done"]) == ("cancelled", True)
    assert ended["message"].startswith("The job was CANCELLED, confirmed by the provider")


async def mistakes(agent: Agent, stack: Stack) -> None:
    before = stored(stack)
    # A request its provider's schema refuses: a tool error naming the field, nothing stored.
    text = await agent.refused("start_job", sim({"scenario": "bogus"}))
    assert text.startswith("start_job: 'request.scenario' does not match the request_schema")
    assert "nothing was stored" in text and "Fix the arguments and call start_job again" in text
    assert stored(stack) == before
    # A request the provider itself refuses: its own outcome, said at once.
    op = await agent.job(
        "start_job",
        sim({"scenario": "partial", "total": 2, "failed_items": 5}, wait_seconds=15),
    )
    assert (op["state"], op["done"]) == ("failed", True)
    assert op["error"]["code"] == "request_rejected" and op["error"]["http_status"] == 422
    assert op["error"]["provider_message"] == "failed_items must not exceed total"
    assert op["message"].startswith(
        "The provider REFUSED the request (HTTP 422: failed_items must not exceed total), so "
        "nothing ran."
    )
    assert "Fix `request`" in op["message"] and "NEW `idempotency_key`" in op["message"]
    assert "FAILED" not in op["message"]
    # A filter value that does not exist: an error, not an empty list.
    text = await agent.refused("list_jobs", {"provider": "sim-typo"})
    assert "unknown provider 'sim-typo' in the filter; known providers: sim" in text


async def awaiting_decision(agent: Agent, stack: Stack) -> None:
    request = {"scenario": "never_finishes", "duration": 60, "webhooks": "never"}
    op = await agent.job("start_job", sim(request, deadline_seconds=1.5, wait_seconds=15))
    # The wait ended when the decision became pending, not at its 15 s.
    assert op["state"] == "result_timed_out"
    assert (op["done"], op["awaiting_decision"]) == (False, True)
    message = op["message"]
    assert message.startswith("Waiting STOPPED at the deadline and the job is NOT done")
    assert "An operator of this service must decide what happens next" in message
    assert "an agent's token cannot decide" in message and "Tell your user" in message
    assert "extend waiting once by 15 minutes" in message and "abandon (stop waiting" in message
    assert f'wait_job(id="{op["id"]}") returns as soon as the decision is made' in message
    assert op["escalation"]["reason"] == "deadline_exceeded"
    listed = await agent.call("list_jobs", {})
    assert listed.structured_content is not None
    assert op["id"] in [o["id"] for o in listed.structured_content["operations"]]
    assert "awaiting an operator's decision" in text_of(listed)
    pending = await agent.call("list_jobs", {"awaiting_decision": True})
    assert pending.structured_content is not None
    assert [o["id"] for o in pending.structured_content["operations"]] == [op["id"]]
    assert text_of(pending).startswith("1 of your jobs that await an operator's decision")

    async def operator_abandons() -> None:
        await anyio.to_thread.run_sync(
            lambda: wait_until(lambda: parked(stack, op["id"]), 10, "the agent's wait")
        )
        decided = await anyio.to_thread.run_sync(
            lambda: stack.client.post(
                f"/v1/operations/{op['id']}/decisions",
                json={"action": "abandon"},
                headers=stack.headers(operator=True),
            )
        )
        assert decided.status_code == 200, decided.text

    async with anyio.create_task_group() as tg:
        tg.start_soon(operator_abandons)
        began = time.monotonic()
        after = await agent.job("wait_job", {"id": op["id"], "timeout_seconds": 20})
    assert time.monotonic() - began < 15  # the decision ended the wait, not its timeout
    assert (after["state"], after["done"], after["awaiting_decision"]) == (
        "result_timed_out",
        True,
        False,
    )
    assert after["error"]["code"] == "abandoned_deadline_exceeded"
    assert "NOT success" in after["message"] and "decision is made" not in after["message"]


async def as_a_task(stack: Stack) -> int:
    """The agent read of tasks in the instructions and declares the extension."""
    async with connect(stack.url, stack.agent_token, extensions=[TasksExtension()]) as client:
        created = await client.session.call_tool(
            "start_job", sim({"scenario": "success", "duration": 0.3}), allow_claimed=True
        )
        assert isinstance(created, CreateTaskResult), created
        assert created.task_id.startswith("op_") and created.status == "working"
        assert "NOT complete" in (created.status_message or "")
        polls = 0
        with anyio.fail_after(30):
            while True:
                task = await get_task(client.session, created.task_id)
                polls += 1
                if task.status == "completed":
                    break
                await anyio.sleep((task.poll_interval_ms or 1000) / 1000)
        assert task.result is not None
        result = types.CallToolResult.model_validate(task.result)
        assert result.structured_content is not None
        assert result.structured_content["id"] == created.task_id
        assert result.structured_content["state"] == "succeeded"
        return polls


def test_an_agent_reads_every_answer_right_the_first_time(stack: Stack) -> None:
    async def main() -> tuple[Counter[str], int]:
        async with connect(stack.url, stack.agent_token) as client:
            agent = Agent(client)
            for name, task in (
                ("providers", providers),
                ("quick_success", quick_success),
                ("longer_than_one_wait", longer_than_one_wait),
                ("failure", failure),
                ("lost_answer", lost_answer),
                ("cancel", cancel),
            ):
                agent.task = name
                await task(agent)
            agent.task = "mistakes"
            await mistakes(agent, stack)
            agent.task = "awaiting_decision"
            await awaiting_decision(agent, stack)
        agent.calls["task"] += 1
        polls = await as_a_task(stack)
        return agent.calls, polls

    calls, polls = run(main)
    assert dict(calls) == EXPECTED_CALLS
    assert polls >= 1
