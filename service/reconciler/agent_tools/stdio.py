"""``reconciler mcp``: the agent tools over stdio, forwarding to a running service.

For agent hosts that start their tools as local processes. The tools are the
in-app ones (``agent_tools.definitions``, ``agent_tools.server``) over a
``RemoteBackend``: every call goes to the service's HTTP API through
``reconciler.client`` with the token from ``RECONCILER_TOKEN``, so ownership,
validation and the wait cap are the service's own. Guarantee: the process
refuses to start, with one line on stderr and exit status 2, when the token is
missing or the service refuses it; stdout carries the protocol and nothing else.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

import anyio
from mcp.server.stdio import stdio_server

from reconciler.agent_tools.backends import RemoteBackend
from reconciler.agent_tools.definitions import build_tools
from reconciler.agent_tools.server import build_server
from reconciler.client import AsyncClient
from reconciler.core.errors import AuthenticationFailed, PermissionDenied, ServiceError

TOKEN_ENV = "RECONCILER_TOKEN"
URL_ENV = "RECONCILER_URL"
DEFAULT_URL = "http://127.0.0.1:8080"


def _say(line: str) -> None:
    print(f"reconciler mcp: {line}", file=sys.stderr, flush=True)


async def _serve(url: str, token: str) -> int:
    async with AsyncClient(url, token) as client:
        try:
            # One authenticated read proves the token before the host starts calling.
            await client.providers()
        except (AuthenticationFailed, PermissionDenied) as exc:
            _say(f"the service at {url} refused the token in {TOKEN_ENV}: {exc.message}")
            return 2
        except ServiceError as exc:
            _say(exc.message)
            return 1
        toolset = build_tools(await client.wait_cap())
        backend = RemoteBackend(client)
        server = build_server(toolset, lambda ctx: backend)
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())
    return 0


def serve_stdio(url: str | None, environ: Mapping[str, str]) -> int:
    token = environ.get(TOKEN_ENV, "").strip()
    if not token:
        _say(f"{TOKEN_ENV} is not set; make one with 'reconciler tokens create --scope agent'")
        return 2
    chosen = url or environ.get(URL_ENV) or DEFAULT_URL
    return anyio.run(_serve, chosen, token)
