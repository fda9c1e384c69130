"""One agent, ten everyday tasks, in one MCP session: every answer it acts on, text included.

An agent given only the MCP endpoint and a token reads the server's instructions, the
tool descriptions and each answer, and must act correctly on the first try. Many clients
show the model only the text of an answer, so this agent reads the text: each task
asserts that the words it acts on are there (the state, the result or its summary, the
error's code, what to do next, whether anything was started), besides ``done``,
``awaiting_decision`` and ``replayed``, and counts the calls the task took. A change that
makes an answer misleading, leaves the outcome out of the text, or makes a task take
more calls, fails here.

The session declares the MCP tasks extension with the official SDK (``tests.support.mcp``
holds its claim), as a task-capable host does: a start whose job is not done by the
answer is a task, which the agent follows with the tools or ``tasks/get``. The tasks:
what can be started, a quick success, a job longer than one wait, a failure, a start
whose answer was lost and is retried with the same key, a cancel, three mistakes, a job
that stops for an operator's decision, a job followed as a task, and jobs that retention
has since removed. Against the service on uvicorn and the simulated provider; no sleeps
(the one job that must end while the agent looks is ended by the simulator's control).
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
import sqlalchemy as sa
from mcp import Client
from mcp.shared.exceptions import MCPError

from reconciler.storage.retention import prune_batch
from reconciler.wire import JobSummaryPage, Operation, ToolErrorBody
from tests.support import loopback
from tests.support.mcp import (
    CreateTaskResult,
    GetTaskResult,
    TasksExtension,
    cancel_task,
    connect,
    get_task,
    run,
    text_of,
)
from tests.support.stack import Stack, running_stack
from tests.support.waiting import wait_until

FAST_POLLING = {"base_delay_seconds": 0.1, "max_delay_seconds": 0.5}
# Calls the agent makes per task: tools/call, tasks/get and tasks/cancel alike.
EXPECTED_CALLS = {
    "providers": 1,
    "quick_success": 1,
    "longer_than_one_wait": 3,
    "failure": 1,
    "lost_answer": 2,
    "cancel": 3,
    "mistakes": 3,
    "awaiting_decision": 4,
    "task": 3,
    "pruned": 3,
}
Answer = types.CallToolResult | CreateTaskResult


@pytest.fixture
def stack(tmp_path: Path, db_url: str) -> Iterator[Stack]:
    provider = {"polling": FAST_POLLING}
    with running_stack(tmp_path, db_url, provider=provider, server={"wait_max_seconds": 20.0}) as s:
        yield s


class Agent:
    """The calls of one agent, counted per task, and what it reads of each answer."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.calls: Counter[str] = Counter()
        self.task = ""

    async def call(self, tool: str, arguments: dict[str, Any]) -> Answer:
        self.calls[self.task] += 1
        answer = await self.client.session.call_tool(tool, arguments, allow_claimed=True)
        assert isinstance(answer, types.CallToolResult | CreateTaskResult), answer
        return answer

    async def job(self, tool: str, arguments: dict[str, Any]) -> tuple[dict[str, Any], str]:
        """A call answered with a job: the Operation, and the text that carries it."""
        result = await self.call(tool, arguments)
        assert isinstance(result, types.CallToolResult), result
        op = result.structured_content
        assert op is not None
        Operation.model_validate(op)
        text = text_of(result)
        assert text.startswith(op["message"] + "\n"), text
        assert f"job {op['id']} at sim; " in text and not API_PATH.search(text)
        assert not (op["done"] and op["awaiting_decision"]), op
        assert result.is_error is (op["done"] and op["state"] in NO_OUTCOME), text
        return op, text

    async def task_started(self, arguments: dict[str, Any]) -> CreateTaskResult:
        created = await self.call("start_job", arguments)
        assert isinstance(created, CreateTaskResult), created
        assert created.status == "working" and created.ttl_ms is None
        assert created.poll_interval_ms is not None and 250 <= created.poll_interval_ms <= 5000
        message = created.status_message or ""
        assert "tasks/get" in message and f'wait_job(id="{created.task_id}")' in message
        assert not API_PATH.search(message), message
        return created

    async def refused(self, tool: str, arguments: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        result = await self.call(tool, arguments)
        assert isinstance(result, types.CallToolResult) and result.is_error, result
        error = ToolErrorBody.model_validate(result.structured_content).error
        assert error.message == text_of(result) and not API_PATH.search(error.message)
        return text_of(result), error.model_dump()

    async def tasks_get(self, task_id: str) -> GetTaskResult:
        self.calls[self.task] += 1
        return await get_task(self.client.session, task_id)


# A path of the service's own API (the provider's result URL has its own /v1/).
API_PATH = re.compile(r"/v1/(operations|providers)")
NO_OUTCOME = {
    "failed",
    "result_timed_out",
    "result_unavailable",
    "result_validation_failed",
    "cancellation_unconfirmed",
}


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
    assert isinstance(result, types.CallToolResult) and result.structured_content is not None
    (provider,) = result.structured_content["providers"]
    schema = provider["request_schema"]
    # Every field of the request is described, in the schema and in the text, none cut off.
    assert all(prop.get("description") for prop in schema["properties"].values())
    text = text_of(result)
    assert "- sim: A simulated job provider" in text
    assert "request: no required fields" in text
    for name, prop in schema["properties"].items():
        assert f"\n    {name} (" in text, name
        assert " ".join(prop["description"].split()) in text, name
    assert "late_failure: fails after 5 s with `error`" in text
    assert "result_fault (one of: none, checksum_mismatch, size_mismatch," in text
    assert "..." not in text
    assert "deadline_seconds: 120 s by default, and at most 120 s;" in text
    assert "max_status_requests: 60 by default, and at most 60;" in text
    assert "can cancel: yes" in text


async def quick_success(agent: Agent) -> str:
    request = sim({"scenario": "success", "duration": 0.2}, idempotency_key="quick")
    op, text = await agent.job("start_job", {**request, "wait_seconds": 15})
    assert (op["state"], op["done"], op["awaiting_decision"]) == ("succeeded", True, False)
    assert op["replayed"] is False and op["result"]["summary"]["processed"] == 100
    # The outcome itself is in the text: the result's size, reference and summary.
    assert text.startswith("The job SUCCEEDED and its result was verified")
    assert "; state: succeeded; done: true\n" in text
    assert f"result: {op['result']['size']:,} bytes of application/json at " in text
    assert 'summary: {"processed": 100, "failed": 0}' in text and "item-00001" not in text
    return str(op["id"])


async def longer_than_one_wait(agent: Agent) -> None:
    created = await agent.task_started(sim({"scenario": "success", "duration": 2}))
    message = created.status_message or ""
    assert "NOT complete" in message
    assert f'Poll tasks/get(taskId="{created.task_id}") at its pollIntervalMs' in message
    waited, text = await agent.job("wait_job", {"id": created.task_id, "timeout_seconds": 1})
    assert (waited["state"], waited["done"]) == ("observing", False)
    assert "NOT complete" in text and "; state: observing; done: false" in text
    assert f'Wait with wait_job(id="{created.task_id}")' in text
    done, text = await agent.job("wait_job", {"id": created.task_id, "timeout_seconds": 15})
    assert (done["state"], done["done"]) == ("succeeded", True)
    assert 'summary: {"processed": 100, "failed": 0}' in text


async def failure(agent: Agent) -> None:
    request = sim({"scenario": "late_failure", "duration": 0.3}, wait_seconds=15)
    op, text = await agent.job("start_job", request)
    assert (op["state"], op["done"], op["awaiting_decision"]) == ("failed", True, False)
    assert op["error"]["code"] == "provider_failed" and op["result"] is None
    # A tool error (never read as success), whose text says why.
    assert text.startswith("The job FAILED; the reason is in `error`")
    assert "\nerror: provider_failed: the provider reports the job failed" in text
    assert "Processing failed at item 42: input unreadable." in text


async def lost_answer(agent: Agent) -> None:
    request = sim({"scenario": "success", "duration": 5}, idempotency_key="report-q3")
    first = await agent.task_started(request)  # its answer never reached the agent
    again = await agent.task_started(request)
    assert again.task_id == first.task_id
    assert (again.status_message or "").startswith(
        "This is the job started earlier with the same idempotency_key and request; no new "
        "job was started."
    )
    assert not (first.status_message or "").startswith("This is the job started earlier")


async def cancel(agent: Agent) -> None:
    created = await agent.task_started(sim({"scenario": "never_finishes", "duration": 30}))
    agent.calls[agent.task] += 1
    asked = await cancel_task(agent.client.session, created.task_id)
    # Acknowledged with the task as it stands: the intent is recorded, not yet confirmed.
    assert asked.status == "working" and asked.task_id == created.task_id
    message = asked.status_message or ""
    assert "NOT confirmed" in message and "Do not report success or cancellation" in message
    ended, text = await agent.job("wait_job", {"id": created.task_id, "timeout_seconds": 15})
    assert (ended["state"], ended["done"]) == ("cancelled", True)
    assert text.startswith("The job was CANCELLED, confirmed by the provider")


async def mistakes(agent: Agent, stack: Stack) -> None:
    before = stored(stack)
    # A request its provider's schema refuses: a tool error naming the field, nothing stored.
    text, error = await agent.refused("start_job", sim({"scenario": "bogus"}))
    assert text.startswith("start_job: 'request.scenario' does not match the request_schema")
    assert "(list_providers shows the schema); nothing was stored" in text
    assert "Fix the arguments and call start_job again" in text
    assert (error["code"], error["started"]) == ("invalid_request", False)
    assert stored(stack) == before
    # A request the provider itself refuses: its own outcome, said at once.
    request = sim({"scenario": "partial", "total": 2, "failed_items": 5}, wait_seconds=15)
    op, text = await agent.job("start_job", request)
    assert (op["state"], op["done"]) == ("failed", True)
    assert op["error"]["code"] == "request_rejected" and op["error"]["http_status"] == 422
    assert text.startswith(
        "The provider REFUSED the request (HTTP 422: failed_items must not exceed total), so "
        "nothing ran."
    )
    assert "Fix `request`" in text and "NEW `idempotency_key`" in text
    assert "\nerror: request_rejected: the provider refused the request (HTTP 422)" in text
    # A filter value that does not exist: an error that says nothing was started.
    text, error = await agent.refused("list_jobs", {"provider": "sim-typo"})
    assert "unknown provider 'sim-typo' in the filter; known providers: sim" in text
    assert "Nothing was started or changed" in text and error["code"] == "invalid_request"


async def awaiting_decision(agent: Agent, stack: Stack) -> None:
    request = {"scenario": "never_finishes", "duration": 60, "webhooks": "never"}
    # The start's own wait ends when the decision becomes pending; not done: it is a task.
    created = await agent.task_started(sim(request, deadline_seconds=1.5, wait_seconds=15))
    message = created.status_message or ""
    assert message.startswith("Waiting STOPPED at the deadline and the job is NOT done")
    assert "A person, an operator of this service, must decide what happens next" in message
    assert "you cannot decide it" in message and "Tell your user" in message
    assert "extend waiting once by 15 minutes" in message and "abandon (stop waiting" in message
    assert "The task stays working until the decision is made" in message
    listed = await agent.call("list_jobs", {})
    assert isinstance(listed, types.CallToolResult) and listed.structured_content is not None
    page = JobSummaryPage.model_validate(listed.structured_content)
    (summary,) = [job for job in page.operations if job.id == created.task_id]
    assert summary.awaiting_decision and not summary.done and summary.done_at is None
    line = next(t for t in text_of(listed).splitlines() if created.task_id in t)
    assert "awaiting an operator's decision (result_timed_out is not final until" in line
    pending = await agent.call("list_jobs", {"awaiting_decision": True})
    assert isinstance(pending, types.CallToolResult) and pending.structured_content is not None
    assert [o["id"] for o in pending.structured_content["operations"]] == [created.task_id]
    assert text_of(pending).startswith("1 of your jobs that await an operator's decision")

    async def operator_abandons() -> None:
        await anyio.to_thread.run_sync(
            lambda: wait_until(lambda: parked(stack, created.task_id), 10, "the agent's wait")
        )
        decided = await anyio.to_thread.run_sync(
            lambda: stack.client.post(
                f"/v1/operations/{created.task_id}/decisions",
                json={"action": "abandon"},
                headers=stack.headers(operator=True),
            )
        )
        assert decided.status_code == 200, decided.text

    async with anyio.create_task_group() as tg:
        tg.start_soon(operator_abandons)
        began = time.monotonic()
        after, text = await agent.job("wait_job", {"id": created.task_id, "timeout_seconds": 20})
    assert time.monotonic() - began < 15  # the decision ended the wait, not its timeout
    assert (after["state"], after["done"], after["awaiting_decision"]) == (
        "result_timed_out",
        True,
        False,
    )
    assert after["error"]["code"] == "abandoned_deadline_exceeded"
    # What was decided and what happens now, then the outcome: NOT success.
    assert text.startswith(
        "An operator decided to stop waiting for the job (abandon): the service no longer "
        "watches it. Waiting STOPPED for good"
    )
    assert "NOT success" in text and "decision is made" not in text


async def as_a_task(agent: Agent, stack: Stack) -> str:
    created = await agent.task_started(sim({"scenario": "never_finishes", "duration": 30}))
    working = await agent.tasks_get(created.task_id)
    assert working.status == "working" and working.result is None
    assert working.poll_interval_ms is not None and working.poll_interval_ms <= 5000
    # The job ends now; the next poll the agent makes finds the answer inline.
    remote = stack.wait_state(created.task_id, {"accepted", "observing"})["remote_job_id"]
    forced = loopback.post(
        f"{stack.sim_url}/_sim/jobs/{remote}/complete", json={"state": "succeeded"}, timeout=10
    )
    assert forced.status_code == 200, forced.text
    stack.wait_state(created.task_id, {"succeeded"})
    stack.settled([created.task_id])  # the completion's bookkeeping is over: no field moves
    done = await agent.tasks_get(created.task_id)
    assert done.status == "completed" and done.poll_interval_ms is None
    assert done.result is not None
    result = types.CallToolResult.model_validate(done.result)
    assert result.is_error is False and result.structured_content is not None
    assert result.structured_content["state"] == "succeeded"
    assert 'summary: {"processed": 100, "failed": 0}' in text_of(result)
    # The very answer wait_job gives for the job (the test's own look, not the agent's).
    waited = await agent.client.session.call_tool("wait_job", {"id": created.task_id})
    assert result.model_dump(exclude={"meta"}) == waited.model_dump(exclude={"meta"})
    return created.task_id


async def pruned(agent: Agent, stack: Stack, quick: str, task: str) -> None:
    """Retention removes the finished jobs; the agent comes back for two of them."""
    stack.settled([quick, task])
    now = stack.runtime.clock.now()
    with stack.runtime.db.write() as conn:
        prune_batch(conn, now + timedelta(seconds=1), now, 100, "retention:test", None)
    with pytest.raises(MCPError) as caught:
        await agent.tasks_get(task)
    assert caught.value.code == types.INVALID_PARAMS
    said = caught.value.message
    assert said.startswith(f"Failed to retrieve task: tasks/get: operation {task} ended succeeded")
    assert "its record and result are no longer kept" in said
    assert caught.value.data["error"]["code"] == "operation_pruned"
    text, error = await agent.refused("get_job", {"id": quick})
    assert text.startswith(f"get_job: operation {quick} ended succeeded at ")
    assert "removed by retention" in text and "long ago" not in text
    assert text.count("Nothing was started") == 1 and "with a new idempotency_key" in text
    tail = "its record and result are no longer kept. To run the work again, call start_job"
    assert tail in said and tail in text  # tasks/get in get_job's words
    assert (error["code"], error["started"]) == ("operation_pruned", False)
    request = sim({"scenario": "success", "duration": 0.2}, idempotency_key="quick")
    text, error = await agent.refused("start_job", {**request, "wait_seconds": 15})
    assert text.startswith(f"start_job: idempotency_key 'quick' named operation {quick} ended")
    assert text.count("no new job was started") == 1 and "started again" not in text
    assert (error["code"], error["started"]) == ("operation_pruned", False)


def test_an_agent_reads_every_answer_right_the_first_time(stack: Stack) -> None:
    async def main() -> Counter[str]:
        async with connect(stack.url, stack.agent_token, extensions=[TasksExtension()]) as client:
            agent = Agent(client)
            kept: dict[str, str] = {}
            agent.task = "providers"
            await providers(agent)
            agent.task = "quick_success"
            kept["quick"] = await quick_success(agent)
            for name, task in (
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
            agent.task = "task"
            kept["task"] = await as_a_task(agent, stack)
            agent.task = "pruned"
            await pruned(agent, stack, kept["quick"], kept["task"])
            return agent.calls

    assert dict(run(main)) == EXPECTED_CALLS
