"""``reconciler mcp`` as a subprocess speaking stdio to the SDK's client, forwarding to a live
service; and its refusals (no token, a refused token) as one line and exit status 2.

What is tested is the stdio bridge, not storage: one service on SQLite serves the whole
module (each test makes its own operations, under keys of its own).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters

from tests.support import forked
from tests.support.databases import sqlite_url
from tests.support.mcp import CreateTaskResult, TasksExtension, get_task, run, text_of
from tests.support.stack import Stack, running_stack

ROOT = Path(__file__).resolve().parents[2]
FAST_POLLING = {"base_delay_seconds": 0.1, "max_delay_seconds": 0.5}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp_path = tmp_path_factory.mktemp("mcp-stdio")
    with (
        sqlite_url(tmp_path) as db_url,
        running_stack(tmp_path, db_url, provider={"polling": FAST_POLLING}) as running,
    ):
        yield running


def child_env(token: str | None) -> dict[str, str]:
    env = {
        "PYTHONPATH": os.pathsep.join([str(ROOT / "service"), str(ROOT)]),
        "PYTHONWARNINGS": "error",
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    }
    if token is not None:
        env["RECONCILER_TOKEN"] = token
    return env


def params(stack: Stack, token: str) -> StdioServerParameters:
    # The SDK passes only a short allow-list of the parent's environment, plus this.
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "reconciler", "mcp", "--url", stack.url],
        env=child_env(token),
        cwd=str(ROOT),
    )


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_the_stdio_tools_work_against_the_service(stack: Stack, mode: str) -> None:
    async def main() -> None:
        async with Client(params(stack, stack.agent_token), mode=mode) as client:
            expected = "2026-07-28" if mode == "auto" else "2025-11-25"
            assert client.protocol_version == expected
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert set(tools) >= {"start_job", "wait_job", "list_jobs", "list_providers"}
            # The wait cap is the service's own, read from it at start.
            cap = tools["wait_job"].input_schema["properties"]["timeout_seconds"]["maximum"]
            assert cap == 30
            started = await client.call_tool(
                "start_job",
                {
                    "provider": "sim",
                    "request": {"scenario": "success", "duration": 0.3},
                    "idempotency_key": f"stdio-{mode}",
                },
            )
            assert not started.is_error, text_of(started)
            op = started.structured_content
            assert op is not None
            waited = await client.call_tool("wait_job", {"id": op["id"], "timeout_seconds": 20})
            assert waited.structured_content is not None
            assert waited.structured_content["state"] == "succeeded"
            assert "SUCCEEDED" in text_of(waited)
            bad = await client.call_tool("get_job", {})
            assert bad.is_error and "'id' is required" in text_of(bad)
            missing = await client.call_tool("get_job", {"id": "op_nope"})
            assert missing.is_error and "does not exist" in text_of(missing)
            unknown = await client.call_tool("start_job", {"provider": "nope", "request": {}})
            assert unknown.is_error and "unknown provider 'nope'" in text_of(unknown)
        # The job lives in the service, under the stdio process's token.
        assert stack.get(op["id"])["state"] == "succeeded"

    run(main)


def test_tasks_through_stdio(stack: Stack) -> None:
    async def main() -> None:
        server = params(stack, stack.agent_token)
        async with Client(server, extensions=[TasksExtension()]) as client:
            created = await client.session.call_tool(
                "start_job",
                {"provider": "sim", "request": {"scenario": "success", "duration": 0.3}},
                allow_claimed=True,
            )
            assert isinstance(created, CreateTaskResult)
            task = await get_task(client.session, created.task_id)
            assert task.task_id == created.task_id
            resolved = await client.call_tool(
                "start_job", {"provider": "sim", "request": {"scenario": "partial"}}
            )
            assert resolved.structured_content is not None
            assert resolved.structured_content["state"] == "completed_with_errors"

    run(main)


def cli(stack_url: str, token: str | None) -> subprocess.CompletedProcess[str]:
    return forked.run(["mcp", "--url", stack_url], child_env(token), ROOT)


def test_a_missing_token_is_one_line_and_exit_2(stack: Stack) -> None:
    done = cli(stack.url, None)
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "RECONCILER_TOKEN is not set" in lines[0]


def test_a_refused_token_is_one_line_and_exit_2(stack: Stack) -> None:
    done = cli(stack.url, "rk_not-a-real-token")
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "refused the token in RECONCILER_TOKEN" in lines[0]
    assert "rk_not-a-real-token" not in done.stderr
