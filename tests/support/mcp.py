"""The official MCP SDK's client against our service, and the SEP-2663 tasks client side.

mcp 2.3.0 ships the hooks for extensions but no tasks client: its own task types
(``mcp_types.GetTaskResult``...) are the 2025-11-25 ones (``ttl``, ``pollInterval``) and
cannot read a SEP-2663 task (``ttlMs``, ``pollIntervalMs``). So the request/result shapes
of ``io.modelcontextprotocol/tasks`` are declared here on the SDK's ``Result`` base, closed
and strict, so that a task answer with a field missing, misnamed or of the wrong type fails
to parse (``tasks/get``, ``tasks/cancel``), together with a ``ClientExtension`` that
declares the extension on each request and resolves a task by polling.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Literal, TypeVar

import anyio
import httpx2
import mcp_types as types
from mcp import Client
from mcp.client import ClaimContext, ClientExtension, ResultClaim
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from pydantic import ConfigDict, Field

from reconciler.providers.aiohttp_transport import default_tls_context

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
T = TypeVar("T")


def run(main: Callable[[], Awaitable[T]]) -> T:
    """Run one async test body on a fresh event loop (the tests themselves are sync)."""
    return anyio.run(main)


@contextlib.asynccontextmanager
async def connect(
    base_url: str,
    token: str | None,
    *,
    mode: str = "auto",
    extensions: Sequence[ClientExtension] | None = None,
    path: str = "/mcp",
) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    timeout = httpx2.Timeout(30.0, read=120.0)
    # The process's one TLS context (see loopback.py): a new client would load the roots.
    http = httpx2.AsyncClient(headers=headers, timeout=timeout, verify=default_tls_context())
    transport = streamable_http_client(base_url + path, http_client=http)
    async with http, Client(transport, mode=mode, extensions=extensions) as client:
        yield client


def text_of(result: Any) -> str:
    return "\n".join(c.text for c in result.content if getattr(c, "type", None) == "text")


class _TaskFields(types.Result):
    # The schema of the extension's Task, and nothing else (no field of another revision).
    model_config = ConfigDict(extra="forbid", strict=True)

    task_id: str
    status: Literal["working", "input_required", "completed", "failed", "cancelled"]
    status_message: str | None = None
    created_at: str
    last_updated_at: str
    ttl_ms: int | None
    poll_interval_ms: int | None = None


class CreateTaskResult(_TaskFields):
    result_type: Literal["task"] = "task"


class GetTaskResult(_TaskFields):
    result_type: Literal["complete"] = "complete"
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


class AckResult(types.Result):
    model_config = ConfigDict(extra="allow")
    result_type: str | None = None


class TaskIdParams(types.RequestParams):
    task_id: str = Field(alias="taskId")


class GetTask(types.Request[TaskIdParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskIdParams
    name_param = "taskId"  # SEP-2663: Mcp-Name carries the task id


class CancelTask(types.Request[TaskIdParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskIdParams
    name_param = "taskId"


class TaskResult(types.Request[TaskIdParams, Literal["tasks/result"]]):
    method: Literal["tasks/result"] = "tasks/result"
    params: TaskIdParams
    name_param = "taskId"


async def get_task(session: ClientSession, task_id: str) -> GetTaskResult:
    return await session.send_request(GetTask(params=TaskIdParams(taskId=task_id)), GetTaskResult)


async def cancel_task(session: ClientSession, task_id: str) -> GetTaskResult:
    """tasks/cancel: acknowledged with the task as it stands after the cancel intent."""
    return await session.send_request(
        CancelTask(params=TaskIdParams(taskId=task_id)), GetTaskResult
    )


async def _resolve(created: CreateTaskResult, ctx: ClaimContext) -> types.CallToolResult:
    interval = (created.poll_interval_ms or 1000) / 1000
    while True:
        task = await get_task(ctx.session, created.task_id)
        if task.status == "completed" and task.result is not None:
            return types.CallToolResult.model_validate(task.result)
        if task.status in ("failed", "cancelled"):
            text = task.status_message or f"task {task.status}"
            return types.CallToolResult(
                content=[types.TextContent(type="text", text=text)], is_error=True
            )
        await anyio.sleep(min(interval, (task.poll_interval_ms or 1000) / 1000))


class TasksExtension(ClientExtension):
    """Declares the tasks extension (modern wire only) and resolves task results."""

    identifier = TASKS_EXTENSION

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=CreateTaskResult, resolve=_resolve)]


MODERN_META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {"extensions": {TASKS_EXTENSION: {}}},
}


def rpc_headers(token: str, method: str, name: str | None = None) -> dict[str, str]:
    """The headers of one modern (2026-07-28) JSON-RPC POST to /mcp."""
    headers = {
        "Authorization": f"Bearer {token}",
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": method,
    }
    if name is not None:
        headers["Mcp-Name"] = name
    return headers


def rpc_body(method: str, params: dict[str, Any], request_id: int = 1) -> str:
    """A modern request as JSON text (``ensure_ascii``: lone surrogates travel as escapes)."""
    full = {**params, "_meta": MODERN_META}
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": full})


def tool_call(name: str, arguments: dict[str, Any]) -> str:
    return rpc_body("tools/call", {"name": name, "arguments": arguments})
