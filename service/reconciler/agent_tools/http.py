"""``/mcp``: the agent tools over streamable HTTP, in the service's own app and lifespan.

Guarantee: every request is authenticated exactly as the HTTP API does it
(``api.auth.principal_for``: the same tokens, the same few-second cache, so a
revoked token stops working within the same window); no token or a bad one is
a 401 before the MCP layer sees the request. Each tool call then runs as that
principal (``LocalBackend``), so an agent reaches its own operations only.

Stateless on purpose: no MCP session lives in a replica's memory, so any
replica can answer any request, and a task (an operation) survives restarts.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from mcp.server.context import ServerRequestContext
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.requests import Request
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from reconciler.agent_tools.backends import LocalBackend
from reconciler.agent_tools.definitions import build_tools
from reconciler.agent_tools.server import build_server
from reconciler.api.auth import principal_for
from reconciler.api.errors import error_response, status_for
from reconciler.errors import Bug, ReconcilerError
from reconciler.runtime import Runtime
from reconciler.storage.tokens import Principal

PATH = "/mcp"
PRINCIPAL = "reconciler.principal"  # the scope key the authenticated principal travels in


class McpEndpoint:
    """An ASGI endpoint: bearer check, then the SDK's streamable HTTP transport."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.toolset = build_tools(runtime.settings.server.wait_max_seconds)
        self.server = build_server(self.toolset, self._backend)
        # Only the Content-Type check: requests carry bearer tokens, not cookies, so
        # another site's page cannot make an authenticated call through a browser.
        # SSE mode answers plain JSON for calls under 15 s, and pings a longer wait_job
        # so that a proxy's idle timeout does not cut it (a disconnect cancels the wait).
        self.manager = StreamableHTTPSessionManager(
            app=self.server, json_response=False, stateless=True, security_settings=None
        )

    def _backend(self, ctx: ServerRequestContext[Any, Any]) -> LocalBackend:
        request = ctx.request
        who = request.scope.get(PRINCIPAL) if isinstance(request, Request) else None
        if not isinstance(who, Principal):
            # Unreachable behind __call__; refuse rather than act as nobody in particular.
            raise Bug("an MCP request reached a tool without an authenticated principal")
        return LocalBackend(self.runtime, who)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            who = await principal_for(self.runtime, headers.get("authorization"))
        except ReconcilerError as exc:
            status = status_for(exc)
            extra = {401: {"WWW-Authenticate": "Bearer"}, 503: {"Retry-After": "1"}}
            response = error_response(status, exc.code, exc.message, extra.get(status))
            await response(scope, receive, send)
            return
        scope[PRINCIPAL] = who
        await self.manager.handle_request(scope, receive, send)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The transport's task group; entered once, in the app's lifespan."""
        async with self.manager.run():
            yield

    def routes(self) -> list[BaseRoute]:
        # Both spellings: a Mount would answer POST /mcp with a redirect to /mcp/.
        return [Route(PATH, endpoint=self), Route(PATH + "/", endpoint=self)]
