"""The demo's last act: one job started and awaited through MCP, as an agent host would.

The official SDK's client connects to ``/mcp`` with the demo agent's token,
calls ``start_job`` and then ``wait_job`` until the job is done, and the
lines it returns show each call and the answer's message (the words a model
reads). A failure to get there is a problem the summary reports.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

WAIT_SECONDS = 20.0
MAX_WAITS = 3


@dataclass(frozen=True)
class McpWalk:
    lines: tuple[str, ...]
    problems: tuple[str, ...] = field(default_factory=tuple)


def _call_line(tool: str, arguments: dict[str, Any]) -> str:
    return f"  {tool} {json.dumps(arguments, sort_keys=True)}"


def _answer_lines(op: dict[str, Any], text: str, seconds: float) -> list[str]:
    """The answer's state, then its text as the model reads it, one line each."""
    first, *rest = text.splitlines() or [""]
    head = f"    -> {op['state']}, done={str(op['done']).lower()} in {seconds:.1f} s: {first}"
    return [head, *(f"       {line}" for line in rest)]


async def walk(service_url: str, token: str, provider: str) -> McpWalk:
    headers = {"Authorization": f"Bearer {token}"}
    http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=WAIT_SECONDS + 30))
    lines = [f"  connected to {service_url}/mcp"]
    async with http, Client(streamable_http_client(f"{service_url}/mcp", http_client=http)) as mcp:
        tools = [tool.name for tool in (await mcp.list_tools()).tools]
        lines[0] += f" (protocol {mcp.protocol_version}); tools: {', '.join(tools)}"
        start = {
            "provider": provider,
            "request": {"scenario": "success", "duration": 2, "webhooks": "normal"},
            "idempotency_key": "demo-mcp-walkthrough",
        }
        lines.append(_call_line("start_job", start))
        began = time.monotonic()
        result = await mcp.call_tool("start_job", start)
        op = result.structured_content or {}
        if result.is_error or "id" not in op:
            return McpWalk(tuple(lines), (f"MCP start_job was refused: {_text(result)}",))
        lines += _answer_lines(op, _text(result), time.monotonic() - began)
        for _ in range(MAX_WAITS):
            if op["done"]:
                break
            wait = {"id": op["id"], "timeout_seconds": WAIT_SECONDS}
            lines.append(_call_line("wait_job", wait))
            result = await mcp.call_tool("wait_job", wait)
            op = result.structured_content or op
            lines += _answer_lines(op, _text(result), time.monotonic() - began)
    if not op["done"]:
        return McpWalk(tuple(lines), ("the MCP job did not finish in the demo's time",))
    return McpWalk(tuple(lines))


def _text(result: Any) -> str:
    return "\n".join(c.text for c in result.content if getattr(c, "type", None) == "text")
