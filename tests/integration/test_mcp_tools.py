"""The MCP tools over streamable HTTP, driven by the official SDK's client against a live
service and the simulated provider, on SQLite and PostgreSQL."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from mcp import Client

from reconciler.agent_tools.answer_text import no_outcome
from reconciler.inbound.auth import CACHE_SECONDS
from reconciler.storage.tokens import create_token, revoke_token
from reconciler.wire import ToolErrorBody
from tests.support import loopback
from tests.support.mcp import connect, run, text_of
from tests.support.stack import Stack, running_stack
from tests.support.waiting import wait_until

FAST_POLLING = {"base_delay_seconds": 0.1, "max_delay_seconds": 0.5}
SCHEMA = {
    "type": "object",
    "required": ["scenario"],
    "properties": {
        "scenario": {"type": "string"},
        "duration": {"type": "number", "minimum": 0, "maximum": 60},
    },
}
TOOLS = {"start_job", "get_job", "wait_job", "cancel_job", "list_jobs", "list_providers"}


@pytest.fixture
def stack(tmp_path: Path, db_url: str) -> Iterator[Stack]:
    provider = {"polling": FAST_POLLING, "request_schema": SCHEMA}
    with running_stack(tmp_path, db_url, provider=provider, server={"wait_max_seconds": 20.0}) as s:
        yield s


def job(scenario: str, duration: float = 0.3, **knobs: Any) -> dict[str, Any]:
    return {"scenario": scenario, "duration": duration, **knobs}


def rows(stack: Stack) -> tuple[int, int]:
    with stack.runtime.db.read() as conn:
        ops = conn.execute(sa.text("SELECT count(*) FROM operations")).scalar_one()
        entries = conn.execute(sa.text("SELECT count(*) FROM history")).scalar_one()
    return int(ops), int(entries)


def agent_token(stack: Stack, name: str) -> str:
    with stack.runtime.db.write() as conn:
        return create_token(conn, name, "agent", stack.runtime.clock.now())


async def start_and_wait(client: Client, request: dict[str, Any], **args: Any) -> dict[str, Any]:
    started = await client.call_tool("start_job", {"provider": "sim", "request": request, **args})
    assert not started.is_error, text_of(started)
    op = started.structured_content
    assert op is not None
    deadline = time.monotonic() + 30
    while not op["done"] and op["state"] != "escalated" and time.monotonic() < deadline:
        waited = await client.call_tool("wait_job", {"id": op["id"], "timeout_seconds": 5})
        assert waited.structured_content is not None
        op = waited.structured_content
        # A job that ended without a usable outcome is a tool error; the answer is the job.
        assert waited.is_error is no_outcome(op), text_of(waited)
        assert text_of(waited).startswith(op["message"] + "\n")
    return op


def test_the_tools_and_their_schemas(stack: Stack) -> None:
    async def main() -> None:
        async with connect(stack.url, stack.agent_token) as client:
            assert client.protocol_version == "2026-07-28"
            tools = {t.name: t for t in (await client.list_tools()).tools}
        assert set(tools) == TOOLS
        for tool in tools.values():
            assert tool.input_schema["type"] == "object"
            assert tool.input_schema["additionalProperties"] is False
            assert tool.output_schema is not None and tool.output_schema["type"] == "object"
            assert tool.description and len(tool.description) > 80
        for name in ("start_job", "get_job", "wait_job"):
            assert "NOT finished" in (tools[name].description or "")
        start = tools["start_job"]
        assert "wait_job" in (start.description or "")
        assert "idempotency_key" in (start.description or "")
        assert set(start.input_schema["required"]) == {"provider", "request"}
        assert start.output_schema is not None
        assert "done" in start.output_schema["required"]
        wait = tools["wait_job"].input_schema["properties"]["timeout_seconds"]
        assert wait["maximum"] == 20
        assert "not done" in (tools["list_jobs"].description or "").lower()

    run(main)


def test_success_failure_partial_and_escalation_are_told_apart(stack: Stack) -> None:
    async def main() -> None:
        async with connect(stack.url, stack.agent_token) as client:
            done = await start_and_wait(client, job("success"), idempotency_key="ok")
            failed = await start_and_wait(client, job("late_failure", 0.5))
            partial = await start_and_wait(client, job("partial", 0.5, failed_items=2))
            stuck = await start_and_wait(client, job("unknown_state", 0.3))
        assert (done["state"], done["done"]) == ("succeeded", True)
        assert "SUCCEEDED" in done["message"] and done["result"] is not None
        assert (failed["state"], failed["done"]) == ("failed", True)
        assert failed["error"] and "FAILED" in failed["message"]
        assert (partial["state"], partial["done"]) == ("completed_with_errors", True)
        assert partial["result"]["summary"]["failed"] == 2
        assert (stuck["state"], stuck["done"]) == ("escalated", False)
        assert stuck["escalation"]["reason"] == "unknown_state"
        assert stuck["awaiting_decision"] is True
        assert "A person, an operator of this service, must decide" in stuck["message"]

    run(main)


def test_a_wait_that_times_out_keeps_the_id_and_says_not_done(stack: Stack) -> None:
    async def main() -> None:
        async with connect(stack.url, stack.agent_token) as client:
            started = await client.call_tool(
                "start_job", {"provider": "sim", "request": job("never_finishes", 30)}
            )
            op = started.structured_content
            assert op is not None and not op["done"]
            text = text_of(started)
            assert "NOT complete" in text and f'wait_job(id="{op["id"]}")' in text
            began = time.monotonic()
            waited = await client.call_tool("wait_job", {"id": op["id"], "timeout_seconds": 0.5})
            assert time.monotonic() - began >= 0.4
            assert not waited.is_error
            assert waited.structured_content is not None
            assert waited.structured_content["id"] == op["id"]
            assert waited.structured_content["done"] is False
            assert "NOT complete" in text_of(waited)

    run(main)


def test_start_job_can_wait_in_the_same_call(stack: Stack) -> None:
    async def main() -> None:
        async with connect(stack.url, stack.agent_token) as client:
            result = await client.call_tool(
                "start_job",
                {"provider": "sim", "request": job("success", 0.2), "wait_seconds": 15},
            )
        assert result.structured_content is not None
        assert result.structured_content["state"] == "succeeded"

    run(main)


def test_the_same_idempotency_key_returns_the_same_job(stack: Stack) -> None:
    async def main() -> None:
        async with connect(stack.url, stack.agent_token) as client:
            args = {"provider": "sim", "request": job("success", 5), "idempotency_key": "report-q3"}
            first = await client.call_tool("start_job", args)
            again = await client.call_tool("start_job", args)
            other = await client.call_tool("start_job", {**args, "request": job("success", 6)})
        assert first.structured_content is not None and again.structured_content is not None
        assert first.structured_content["id"] == again.structured_content["id"]
        assert other.is_error and "already used for a different request" in text_of(other)

    run(main)
    assert rows(stack)[0] == 1


def first_id(stack: Stack) -> str:
    with stack.runtime.db.read() as conn:
        return str(conn.execute(sa.text("SELECT id FROM operations")).scalar_one())


BAD_CALLS: list[tuple[str, dict[str, Any], str]] = [
    ("start_job", {"provider": "nope", "request": {"scenario": "x"}}, "unknown provider"),
    (
        "start_job",
        {"provider": "sim", "request": "go"},
        "'request' must be a JSON object, got a string",
    ),
    ("start_job", {"provider": "sim"}, "'request' is required"),
    ("start_job", {"provider": "sim", "request": {}}, "'request.scenario' is required"),
    (
        "start_job",
        {"provider": "sim", "request": {"scenario": "success", "duration": "long"}},
        "'request.duration' does not match the request_schema",
    ),
    (
        "start_job",
        {"provider": "sim", "request": {"scenario": "s"}, "callback_url": "http://x"},
        "unknown argument(s): callback_url",
    ),
    (
        "start_job",
        {"provider": "sim", "request": {"scenario": "s"}, "deadline_seconds": 999999},
        "'deadline_seconds' may be at most",
    ),
    (
        "start_job",
        {"provider": "sim", "request": {"scenario": "s"}, "wait_seconds": 21},
        "'wait_seconds' must be at most 20",
    ),
    ("get_job", {"id": "op_doesnotexist"}, "does not exist"),
    ("get_job", {"id": 5}, "'id' must be a string, got a number"),
    ("wait_job", {"id": "op_x", "timeout_seconds": 500}, "'timeout_seconds' must be at most 20"),
    ("wait_job", {"id": "op_x", "timeout_seconds": -1}, "'timeout_seconds' must be at least 0"),
    ("cancel_job", {}, "'id' is required"),
    ("list_jobs", {"limit": 0}, "'limit' must be a whole number from 1 to 200"),
    ("list_jobs", {"state": "running"}, "'state' must be one of: create_pending"),
    ("list_jobs", {"cursor": "garbage!"}, "cursor is not valid"),
    ("no_such_tool", {}, "there is no tool 'no_such_tool'"),
]


def test_bad_arguments_are_tool_errors_that_say_what_to_fix(stack: Stack) -> None:
    before = rows(stack)

    async def main() -> list[tuple[str, Any]]:
        async with connect(stack.url, stack.agent_token) as client:
            return [
                (fragment, await client.call_tool(tool, args)) for tool, args, fragment in BAD_CALLS
            ]

    for fragment, result in run(main):
        assert result.is_error is True, fragment
        assert fragment in text_of(result), (fragment, text_of(result))
        # The same refusal as an object with a code, saying that nothing was started.
        error = ToolErrorBody.model_validate(result.structured_content).error
        assert error.message == text_of(result) and error.started is False
        assert "started" in error.message.lower() or "nothing was stored" in error.message
        assert "/v1/" not in error.message
    assert rows(stack) == before  # nothing stored, not even half


def test_an_agent_never_sees_another_agents_job(stack: Stack) -> None:
    other = agent_token(stack, "agent-2")

    async def main() -> None:
        async with connect(stack.url, stack.agent_token) as mine:
            started = await mine.call_tool(
                "start_job", {"provider": "sim", "request": job("never_finishes", 30)}
            )
            assert started.structured_content is not None
            op_id = started.structured_content["id"]
        async with connect(stack.url, other) as theirs:
            for tool, args in [
                ("get_job", {"id": op_id}),
                ("wait_job", {"id": op_id, "timeout_seconds": 0}),
                ("cancel_job", {"id": op_id}),
            ]:
                result = await theirs.call_tool(tool, args)
                assert result.is_error and "does not exist" in text_of(result), tool
            listed = await theirs.call_tool("list_jobs", {"done": False})
            assert listed.structured_content == {"operations": [], "next_cursor": None}
        async with connect(stack.url, stack.operator_token) as operator:
            seen = await operator.call_tool("get_job", {"id": op_id})
            assert not seen.is_error

    run(main)
    assert stack.get(first_id(stack), operator=True)["cancel_requested"] is False


def test_list_jobs_finds_unfinished_work_newest_first(stack: Stack) -> None:
    async def main() -> None:
        async with connect(stack.url, stack.agent_token) as client:
            finished = await start_and_wait(client, job("success", 0.1))
            ids = []
            for _ in range(3):
                started = await client.call_tool(
                    "start_job", {"provider": "sim", "request": job("never_finishes", 30)}
                )
                assert started.structured_content is not None
                ids.append(started.structured_content["id"])
            pending = await client.call_tool("list_jobs", {})
            done = await client.call_tool("list_jobs", {"done": True})
            page = await client.call_tool("list_jobs", {"limit": 2})
            assert page.structured_content is not None
            rest = await client.call_tool(
                "list_jobs", {"limit": 2, "cursor": page.structured_content["next_cursor"]}
            )
        assert pending.structured_content is not None and done.structured_content is not None
        assert [op["id"] for op in pending.structured_content["operations"]] == ids[::-1]
        assert [op["id"] for op in done.structured_content["operations"]] == [finished["id"]]
        assert rest.structured_content is not None
        paged = page.structured_content["operations"] + rest.structured_content["operations"]
        assert [op["id"] for op in paged] == ids[::-1]
        assert "3 of your jobs that are not done" in text_of(pending)

    run(main)


def test_list_providers_shows_what_may_be_started(stack: Stack) -> None:
    async def main() -> tuple[Any, Any]:
        async with connect(stack.url, stack.agent_token) as agent:
            mine = await agent.call_tool("list_providers", {})
        async with connect(stack.url, stack.operator_token) as operator:
            theirs = await operator.call_tool("list_providers", {})
        return mine, theirs

    agent_view, operator_view = run(main)
    (sim,) = agent_view.structured_content["providers"]
    assert sim["name"] == "sim" and sim["request_schema"] == SCHEMA
    assert sim["preset"] is None and sim["set_by_service"] == []
    assert "simulated" in sim["description"] and "webhook" not in sim
    assert "- sim: A simulated job provider" in text_of(agent_view)
    (sim_op,) = operator_view.structured_content["providers"]
    assert sim_op["webhook"]["scheme"] == "standard-webhooks"
    assert sim_op["webhook"]["secrets_set"] is True
    assert "webhook_trust" in sim_op
    http_view = stack.client.get("/v1/providers", headers=stack.headers(operator=True)).json()
    assert http_view == operator_view.structured_content


def test_the_legacy_handshake_gets_the_same_tools(stack: Stack) -> None:
    async def main() -> None:
        async with connect(stack.url, stack.agent_token, mode="legacy") as client:
            assert client.protocol_version == "2025-11-25"
            op = await start_and_wait(client, job("success", 0.1))
            assert op["state"] == "succeeded"

    run(main)


def _raw_call(url: str, token: str | None) -> httpx.Response:
    headers = {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "tools/list",
    }
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": meta}}
    return loopback.post(f"{url}/mcp", json=body, headers=headers, timeout=10)


def test_no_token_or_a_bad_one_is_401_before_mcp(stack: Stack) -> None:
    for token in (None, "rk_not-a-token"):
        response = _raw_call(stack.url, token)
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == "Bearer"
        assert response.json()["error"]["code"] == "unauthenticated"
    assert _raw_call(stack.url, stack.agent_token).status_code == 200

    async def main() -> None:
        async with connect(stack.url, "rk_not-a-token"):
            pass

    with pytest.raises(BaseExceptionGroup):
        run(main)


def test_a_revoked_token_is_refused_within_the_cache_window(stack: Stack) -> None:
    token = agent_token(stack, "agent-soon-revoked")
    assert _raw_call(stack.url, token).status_code == 200
    with stack.runtime.db.write() as conn:
        revoke_token(conn, "agent-soon-revoked", stack.runtime.clock.now())
    revoked_at = time.monotonic()
    wait_until(
        lambda: _raw_call(stack.url, token).status_code != 200,
        CACHE_SECONDS + 5,
        "the revoked token to be refused",
    )
    assert time.monotonic() - revoked_at <= CACHE_SECONDS + 1
    refused = stack.client.get("/v1/providers", headers={"Authorization": f"Bearer {token}"})
    assert refused.status_code == 401


def test_the_trailing_slash_works_too(stack: Stack) -> None:
    async def main() -> None:
        async with connect(stack.url, stack.agent_token, path="/mcp/") as client:
            assert {t.name for t in (await client.list_tools()).tools} == TOOLS

    run(main)
