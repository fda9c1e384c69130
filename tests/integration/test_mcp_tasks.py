"""MCP Tasks (io.modelcontextprotocol/tasks, SEP-2663): a started job is a task whose id is
the operation id; it lives in the database, so it outlives the service that made it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
import sqlalchemy as sa
from mcp.client import advertise
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from reconciler.app import create_app
from reconciler.config import SchedulerSettings, Settings
from reconciler.demo.sim import SimConfig, SimState
from reconciler.demo.sim import create_app as create_sim
from reconciler.runtime import Runtime
from reconciler.storage.tokens import create_token
from tests.support import loopback
from tests.support.mcp import (
    TASKS_EXTENSION,
    AckResult,
    CreateTaskResult,
    GetTaskResult,
    TaskIdParams,
    TaskResult,
    TasksExtension,
    cancel_task,
    connect,
    get_task,
    run,
    text_of,
)
from tests.support.servers import serve_asgi
from tests.support.stack import (
    CALLBACK_SECRET,
    SIM_TOKEN,
    WEBHOOK_SECRET,
    Stack,
    make_tokens,
    running_stack,
    sim_provider_table,
)

FAST_POLLING = {"base_delay_seconds": 0.1, "max_delay_seconds": 0.5}


@pytest.fixture
def stack(tmp_path: Path, db_url: str) -> Iterator[Stack]:
    with running_stack(tmp_path, db_url, provider={"polling": FAST_POLLING}) as running:
        yield running


def job(scenario: str, duration: float = 0.3, **knobs: Any) -> dict[str, Any]:
    return {"provider": "sim", "request": {"scenario": scenario, "duration": duration, **knobs}}


async def start_task(session: ClientSession, arguments: dict[str, Any]) -> CreateTaskResult:
    created = await session.call_tool("start_job", arguments, allow_claimed=True)
    assert isinstance(created, CreateTaskResult), created
    return created


async def until(
    session: ClientSession, task_id: str, statuses: set[str], seconds: float = 30
) -> GetTaskResult:
    with anyio.fail_after(seconds):
        while (task := await get_task(session, task_id)).status not in statuses:
            await anyio.sleep(0.1)
    return task


def inline(task: GetTaskResult) -> types.CallToolResult:
    assert task.result is not None
    return types.CallToolResult.model_validate(task.result)


def answered(result: types.CallToolResult) -> dict[str, Any]:
    """A tool result as the tool answered it (the transport's own ``_meta`` left out)."""
    return result.model_dump(by_alias=True, mode="json", exclude={"meta"})


async def as_wait_job_answers(
    session: ClientSession, stack: Stack, task_id: str
) -> types.CallToolResult:
    """A finished task's inline result, once its record stopped changing (the completion's
    bookkeeping still touches it after the end): the very answer wait_job gives."""
    stack.settled([task_id])
    result = inline(await get_task(session, task_id))
    waited = await session.call_tool("wait_job", {"id": task_id})
    assert answered(result) == answered(waited)
    return result


def stored(stack: Stack, op_id: str) -> bool:
    with stack.runtime.db.read() as conn:
        found = conn.execute(
            sa.text("SELECT count(*) FROM operations WHERE id = :id"), {"id": op_id}
        )
        return int(found.scalar_one()) == 1


def test_a_task_is_the_operation_from_creation_to_its_inline_result(stack: Stack) -> None:
    async def main() -> None:
        async with connect(stack.url, stack.agent_token, extensions=[TasksExtension()]) as client:
            created = await start_task(client.session, job("success", 0.5))
            # Created only once durable: the record exists and tasks/get resolves at once.
            assert created.task_id.startswith("op_") and stored(stack, created.task_id)
            assert (created.status, created.ttl_ms) == ("working", None)
            assert created.poll_interval_ms is not None and created.poll_interval_ms >= 1000
            assert "NOT complete" in (created.status_message or "")
            first = await get_task(client.session, created.task_id)
            assert first.result_type == "complete" and first.task_id == created.task_id
            # The task is also the job: the tools see it under the same id.
            seen = await client.call_tool("get_job", {"id": created.task_id})
            assert seen.structured_content is not None
            assert seen.structured_content["id"] == created.task_id
            done = await until(client.session, created.task_id, {"completed"})
            result = inline(done)
            assert result.is_error is False
            assert result.structured_content is not None
            assert result.structured_content["state"] == "succeeded"
            assert text_of(result).startswith(result.structured_content["message"])
            assert done.poll_interval_ms is None
            # The inline result is what wait_job answers for the job, to the byte.
            await as_wait_job_answers(client.session, stack, created.task_id)

            failed = await start_task(client.session, job("late_failure", 0.3))
            done = await until(client.session, failed.task_id, {"completed"})
            ended = inline(done)
            # A failed job is an answer (completed, the tool result inline), not a protocol
            # error; and it is a tool error, as wait_job answers it: never read as success.
            assert ended.is_error is True
            assert ended.structured_content is not None
            assert ended.structured_content["state"] == "failed"
            assert "error: provider_failed" in text_of(ended)
            assert (await as_wait_job_answers(client.session, stack, failed.task_id)).is_error
            assert (done.status_message or "").startswith("The job FAILED")

    run(main)


def test_the_client_extension_resolves_a_task_into_the_final_result(stack: Stack) -> None:
    async def main() -> None:
        async with connect(stack.url, stack.agent_token, extensions=[TasksExtension()]) as client:
            result = await client.call_tool("start_job", job("partial", 0.3))
        assert result.structured_content is not None
        assert result.structured_content["state"] == "completed_with_errors"

    run(main)


def test_tasks_cancel_records_the_intent_like_the_http_api(stack: Stack) -> None:
    async def main() -> str:
        async with connect(stack.url, stack.agent_token, extensions=[TasksExtension()]) as client:
            created = await start_task(client.session, job("success", 30))
            await until(client.session, created.task_id, {"working"})
            stack.wait_state(created.task_id, {"accepted", "observing"})
            ack = await cancel_task(client.session, created.task_id)
            # Acknowledged with the task as it stands: the intent, not yet the outcome.
            assert ack.result_type == "complete" and ack.task_id == created.task_id
            assert ack.status == "working" and ack.poll_interval_ms is not None
            assert "Cancellation was requested and is NOT confirmed" in (ack.status_message or "")
            again = await cancel_task(client.session, created.task_id)  # idempotent
            assert again.result_type == "complete" and again.task_id == created.task_id
            ended = await until(client.session, created.task_id, {"cancelled", "completed"})
            assert ended.status == "cancelled"
            assert "CANCELLED" in (ended.status_message or "")
            await as_wait_job_answers(client.session, stack, created.task_id)
            return created.task_id

    op_id = run(main)
    requests = [e for e in stack.history(op_id) if e["cause"].startswith("cancel_request:")]
    assert [e["cause"] for e in requests] == ["cancel_request:agent:agent-1"]
    assert requests[0]["to"] == "cancel_requested"


def test_an_escalated_task_is_working_with_the_escalation_as_its_message(stack: Stack) -> None:
    async def main() -> None:
        async with connect(stack.url, stack.agent_token, extensions=[TasksExtension()]) as client:
            created = await start_task(client.session, job("unknown_state", 0.2))
            stack.wait_state(created.task_id, {"escalated"})
            task = await get_task(client.session, created.task_id)
        assert task.status == "working" and task.result is None
        # Written to the agent, not the operator's text: a person decides, it cannot.
        message = task.status_message or ""
        assert message.startswith("Waiting has STOPPED and the job is NOT complete")
        assert "A person, an operator of this service, must decide" in message
        assert "you cannot decide it" in message and "Tell your user" in message
        assert "The task stays working until the decision is made" in message
        assert "/v1/" not in message and "Safe options" not in message
        assert task.poll_interval_ms is not None and 0 < task.poll_interval_ms <= 5000

    run(main)


def test_unknown_foreign_and_removed_requests_are_refused(stack: Stack) -> None:
    with stack.runtime.db.write() as conn:
        other = create_token(conn, "agent-2", "agent", stack.runtime.clock.now())

    async def main() -> str:
        async with connect(stack.url, stack.agent_token, extensions=[TasksExtension()]) as mine:
            created = await start_task(mine.session, job("success", 20))
            for call in (get_task, cancel_task):
                with pytest.raises(MCPError) as caught:
                    await call(mine.session, "op_doesnotexist")
                assert caught.value.code == types.INVALID_PARAMS
                # In get_job's words, with its error object.
                assert "operation op_doesnotexist does not exist" in caught.value.message
                assert "Check the id" in caught.value.message
                assert caught.value.data["error"]["code"] == "not_found"
            with pytest.raises(MCPError) as caught:
                await mine.session.send_request(
                    TaskResult(params=TaskIdParams(taskId=created.task_id)), AckResult
                )
            assert caught.value.code == types.METHOD_NOT_FOUND
        async with connect(stack.url, other, extensions=[TasksExtension()]) as theirs:
            for call in (get_task, cancel_task):
                with pytest.raises(MCPError) as caught:
                    await call(theirs.session, created.task_id)
                assert caught.value.code == types.INVALID_PARAMS
        return created.task_id

    op_id = run(main)
    assert stack.get(op_id)["cancel_requested"] is False


def test_without_the_extension_start_job_answers_plainly(stack: Stack) -> None:
    async def main() -> None:
        async with connect(stack.url, stack.agent_token) as plain:
            result = await plain.session.call_tool("start_job", job("success"), allow_claimed=True)
            assert isinstance(result, types.CallToolResult)
        # On the legacy (initialize) wire there is no task, whatever the client advertises.
        async with connect(
            stack.url, stack.agent_token, mode="legacy", extensions=[advertise(TASKS_EXTENSION)]
        ) as legacy:
            result = await legacy.call_tool("start_job", job("success"))
            assert result.structured_content is not None
            assert result.structured_content["id"].startswith("op_")

    run(main)


def test_the_wire_shape_of_a_created_task(stack: Stack) -> None:
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {TASKS_EXTENSION: {}}},
    }
    headers = {
        **stack.headers(),
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "tools/call",
        "Mcp-Name": "start_job",
    }
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "start_job", "arguments": job("success", 5), "_meta": meta},
    }
    answer = loopback.post(f"{stack.url}/mcp", json=body, headers=headers, timeout=10).json()
    created = answer["result"]
    assert created["resultType"] == "task"
    assert set(created) >= {"taskId", "status", "createdAt", "lastUpdatedAt", "ttlMs"}
    assert created["ttlMs"] is None and isinstance(created["pollIntervalMs"], int)
    CreateTaskResult.model_validate(created)  # the extension's Task, closed and strict
    # The SDK's own task types are 2025-11-25's and cannot read it (docs/agents.md#mcp-tasks).
    with pytest.raises(ValidationError):
        types.GetTaskResult.model_validate({**created, "resultType": "complete"})


def test_a_task_survives_a_restart_of_the_service(tmp_path: Path, db_url: str) -> None:
    """Started on one service; that service stops; a new one on the same database answers."""
    providers_dir = tmp_path / "no-provider-files"
    providers_dir.mkdir()
    environ = {
        "SIM_TOKEN": SIM_TOKEN,
        "SIM_WEBHOOK_SECRETS": WEBHOOK_SECRET,
        "RECONCILER_CALLBACK_SECRET": CALLBACK_SECRET,
    }
    with ExitStack() as stack:
        sim = SimState(SimConfig(token=SIM_TOKEN, webhook_secret=WEBHOOK_SECRET))
        sim_url = stack.enter_context(serve_asgi(create_sim(state=sim)))
        settings = Settings(
            database_url=db_url,
            providers_dir=str(providers_dir),
            providers={"sim": sim_provider_table(sim_url, polling=FAST_POLLING)},
            scheduler=SchedulerSettings(tick_seconds=0.2, lease_seconds=2.0),
        )
        first = Runtime.build(settings, environ=environ)
        token, _ = make_tokens(first)

        async def before(url: str) -> CreateTaskResult:
            async with connect(url, token, extensions=[TasksExtension()]) as client:
                created = await start_task(client.session, job("success", 3))
                assert (await get_task(client.session, created.task_id)).status == "working"
                return created

        with serve_asgi(create_app(first)) as url:
            sim.config.webhook_url = f"{url}/webhooks/sim"
            created = run(lambda: before(url))

        async def after(url: str) -> GetTaskResult:
            async with connect(url, token, extensions=[TasksExtension()]) as client:
                seen = await get_task(client.session, created.task_id)
                assert seen.created_at == created.created_at
                return await until(client.session, created.task_id, {"completed"}, seconds=40)

        second = Runtime.build(settings, environ=environ)
        with serve_asgi(create_app(second)) as url:
            sim.config.webhook_url = f"{url}/webhooks/sim"
            done = run(lambda: after(url))
        result = inline(done)
        assert result.structured_content is not None
        assert result.structured_content["state"] == "succeeded"
        assert result.structured_content["id"] == created.task_id
