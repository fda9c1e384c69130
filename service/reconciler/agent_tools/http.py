"""``/mcp``: the agent tools over streamable HTTP, in the service's own app and lifespan.

Guarantee: every request is authenticated exactly as the HTTP API does it
(``inbound.auth.principal_for``: the same tokens, the same few-second cache, so a
revoked token stops working within the same window); no token or a bad one is
a 401 before the MCP layer sees the request. Each tool call then runs as that
principal (``LocalBackend``), so an agent reaches its own operations only.

Stateless on purpose: no MCP session lives in a replica's memory, so any
replica can answer any request, and a task (an operation) survives restarts.

The door keeps the service's limits, before the SDK reads a byte:

* only POST: a stateless server has nothing to push and no session to delete, so
  ``GET`` (the standalone SSE stream) and ``DELETE`` are 405 with ``Allow: POST``,
  as the transport allows; no stream is ever held open waiting for nothing;
* the body is read here under ``server.max_body_bytes`` (413, JSON-RPC ``-32600``),
  must be JSON (415), and is parsed by the one strict parser of client bodies
  (duplicate member names, bad UTF-8, absurd nesting: 400, ``-32700``); a client
  that hangs up mid-body (or is cut by the front door's body deadline) is an info
  line, as on the API;
* one token has at most ``server.mcp_requests_per_agent`` requests open at once
  (429 with ``Retry-After``), so one agent's waits never reach ``max_connections``;
* a request still open when its token is revoked or expires is ended within the
  token cache's window plus one re-check (``inbound.auth.until_refused``, as the API's
  ``/wait``): its stream is closed, cleanly.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
from mcp.server.context import ServerRequestContext
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp_types import INVALID_REQUEST, PARSE_ERROR
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import Message, Receive, Scope, Send

from reconciler.agent_tools.backends import LocalBackend
from reconciler.agent_tools.definitions import build_tools
from reconciler.agent_tools.server import build_server
from reconciler.core.errors import (
    AuthenticationFailed,
    Bug,
    ClientDisconnected,
    InvalidRequest,
    ReconcilerError,
)
from reconciler.core.principal import Principal
from reconciler.core.strict_json import parse_request_json
from reconciler.inbound.auth import principal_for, until_refused
from reconciler.inbound.bodies import read_limited, require_json_type
from reconciler.inbound.errors import error_response, status_for
from reconciler.runtime import Runtime

log = logging.getLogger("reconciler.mcp")

PATH = "/mcp"
PRINCIPAL = "reconciler.principal"  # the scope key the authenticated principal travels in
OVER_CAP = -32000  # JSON-RPC's implementation-defined server error range


def rpc_error(
    status: int, code: int, message: str, headers: dict[str, str] | None = None
) -> Response:
    """A JSON-RPC error answered before the MCP layer (no request id is known yet)."""
    body = {"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}}
    return Response(
        json.dumps(body, ensure_ascii=True).encode("ascii"),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


class _Replay:
    """The ASGI ``receive`` of a request whose body was read already: the body, then the rest."""

    def __init__(self, body: bytes, receive: Receive) -> None:
        self.body, self.receive, self.sent = body, receive, False

    async def __call__(self) -> Message:
        if not self.sent:
            self.sent = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        return await self.receive()


class _Watched:
    """The ASGI ``send`` of a request, remembering how far its answer got."""

    def __init__(self, send: Send) -> None:
        self.send, self.started, self.complete, self.sse = send, False, False, False

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
            kinds = [v for k, v in message.get("headers", []) if k.lower() == b"content-type"]
            self.sse = any(v.startswith(b"text/event-stream") for v in kinds)
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            self.complete = True
        await self.send(message)


class McpEndpoint:
    """An ASGI endpoint: bearer check and the door's limits, then the SDK's transport."""

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
        self.open: Counter[str] = Counter()  # requests in progress, per token name

    def _backend(self, ctx: ServerRequestContext[Any, Any]) -> LocalBackend:
        request = ctx.request
        who = request.scope.get(PRINCIPAL) if isinstance(request, Request) else None
        if not isinstance(who, Principal):
            # Unreachable behind __call__; refuse rather than act as nobody in particular.
            raise Bug("an MCP request reached a tool without an authenticated principal")
        # The agent's traceparent, if any: its call continues into the operation's trace.
        return LocalBackend(
            self.runtime, who, request.headers if isinstance(request, Request) else None
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        authorization = headers.get("authorization")
        try:
            who = await principal_for(self.runtime, authorization)
        except ReconcilerError as exc:
            status = status_for(exc)
            extra = {401: {"WWW-Authenticate": "Bearer"}, 503: {"Retry-After": "1"}}
            refused = error_response(status, exc.code, exc.message, extra.get(status))
            await refused(scope, receive, send)
            return
        if scope["method"] != "POST":
            message = (
                f"{scope['method']} is not allowed on {PATH}: this server is stateless and "
                "offers no SSE stream or session; send each JSON-RPC request as a POST"
            )
            response = rpc_error(405, INVALID_REQUEST, message, {"Allow": "POST"})
            await response(scope, receive, send)
            return
        cap = self.runtime.settings.server.mcp_requests_per_agent
        if self.open[who.name] >= cap:
            message = (
                f"token '{who.name}' already has {cap} requests open on {PATH}, the most "
                "allowed (server.mcp_requests_per_agent); retry after one finishes"
            )
            await rpc_error(429, OVER_CAP, message, {"Retry-After": "1"})(scope, receive, send)
            return
        self.open[who.name] += 1
        try:
            await self._serve(who, authorization, scope, receive, send)
        finally:
            self.open[who.name] -= 1
            if self.open[who.name] <= 0:
                del self.open[who.name]

    async def _serve(
        self, who: Principal, authorization: str | None, scope: Scope, receive: Receive, send: Send
    ) -> None:
        request = Request(scope, receive)
        limit = self.runtime.settings.server.max_body_bytes
        try:
            require_json_type(request.headers.get("content-type"))
            body = await read_limited(request, limit)
            message = parse_request_json(body, "the JSON-RPC message")
        except ClientDisconnected as exc:
            log.info("client disconnected: %s", exc.message, extra={"path": PATH})
            self.runtime.metrics.client_disconnects.labels("mcp").inc()
            return
        except InvalidRequest as exc:
            status = status_for(exc)
            code = PARSE_ERROR if status == 400 else INVALID_REQUEST
            await rpc_error(status, code, exc.message)(scope, receive, send)
            return
        scope[PRINCIPAL] = who
        answer = _Watched(send)
        revoked: list[str] = []
        async with anyio.create_task_group() as tg:

            async def watch_token() -> None:
                revoked.append(await until_refused(self.runtime, authorization))
                tg.cancel_scope.cancel()

            tg.start_soon(watch_token)
            await self.manager.handle_request(scope, _Replay(body, receive), answer)
            tg.cancel_scope.cancel()
        if revoked:
            log.info("mcp request ended: %s", revoked[0], extra={"path": PATH, "caller": who.name})
            request_id = message.get("id") if isinstance(message, dict) else None
            await self._end(answer, revoked[0], request_id, scope, receive)

    @staticmethod
    async def _end(
        answer: _Watched, reason: str, request_id: Any, scope: Scope, receive: Receive
    ) -> None:
        """Finish an answer cut off by a revoked token: the stream ends, the connection lives."""
        if answer.complete:
            return
        if answer.started:
            last = b""
            if answer.sse:  # the request's answer, as an error the client can show
                error = {"code": INVALID_REQUEST, "message": f"{reason}; the request was ended"}
                event = {"jsonrpc": "2.0", "id": request_id, "error": error}
                last = b"event: message\r\ndata: " + json.dumps(event).encode() + b"\r\n\r\n"
            await answer({"type": "http.response.body", "body": last, "more_body": False})
            return
        headers = {"WWW-Authenticate": "Bearer"}
        await error_response(401, AuthenticationFailed.code, reason, headers)(
            scope, receive, answer
        )

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The transport's task group; entered once, in the app's lifespan."""
        async with self.manager.run():
            yield

    def routes(self) -> list[BaseRoute]:
        # Both spellings: a Mount would answer POST /mcp with a redirect to /mcp/.
        return [Route(PATH, endpoint=self), Route(PATH + "/", endpoint=self)]
