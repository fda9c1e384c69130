"""The agent API routes: start, read, list, wait for and cancel operations.

A route reads the request and writes the answer; the work is ``commands.agent_actions``,
which the MCP tools call too.
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from reconciler.commands import agent_actions
from reconciler.commands.decide import decide as commands_decide
from reconciler.commands.validation import parse_history_params, parse_list_params
from reconciler.core.errors import InvalidRequest
from reconciler.core.principal import require_operator
from reconciler.inbound.auth import principal as authenticate
from reconciler.inbound.auth import while_authorized
from reconciler.inbound.bodies import read_json
from reconciler.inbound.responses import JSONResponse
from reconciler.runtime import Runtime
from reconciler.tracing import SpanName
from reconciler.wire import parse_decision


def _rt(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


async def create(request: Request) -> Response:
    rt = _rt(request)
    who = await authenticate(request)
    limit = rt.settings.server.max_body_bytes
    body = await read_json(request, limit, limiter=rt.request_checks)
    op, created = await agent_actions.start(rt, who, body, request.headers)
    view = await agent_actions.render(rt, op, replayed=not created)
    return JSONResponse(view, status_code=202 if created else 200)


async def get_one(request: Request) -> Response:
    rt = _rt(request)
    who = await authenticate(request)
    op = await agent_actions.load_visible(rt, request.path_params["op_id"], who)
    return JSONResponse(await agent_actions.render(rt, op))


def _query_number(request: Request, name: str, default: float, maximum: float) -> float:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise InvalidRequest(f"'{name}' must be a number, got {raw!r}") from None
    if not value >= 0:
        raise InvalidRequest(f"'{name}' must be 0 or more")
    return min(value, maximum)


async def wait(request: Request) -> Response:
    arrived = asyncio.get_running_loop().time()
    rt = _rt(request)
    who = await authenticate(request)
    cap = rt.settings.server.wait_max_seconds
    timeout = _query_number(request, "timeout_seconds", min(30.0, cap), cap)
    # A token revoked (or expiring) while it waits ends the wait with a 401, as on /mcp.
    op = await while_authorized(
        rt,
        request.headers.get("authorization"),
        agent_actions.wait_until(rt, request.path_params["op_id"], who, arrived + timeout),
    )
    return JSONResponse(await agent_actions.render(rt, op))


async def list_all(request: Request) -> Response:
    rt = _rt(request)
    who = await authenticate(request)
    query = parse_list_params(request.query_params)
    return JSONResponse(await agent_actions.page(rt, who, query))


async def cancel(request: Request) -> Response:
    rt = _rt(request)
    who = await authenticate(request)
    body = await read_json(request, rt.settings.server.max_body_bytes, optional=True)
    op = await agent_actions.cancel(rt, who, request.path_params["op_id"], body)
    return JSONResponse(await agent_actions.render(rt, op), status_code=202)


ROUTES = [
    Route("/v1/operations", create, methods=["POST"]),
    Route("/v1/operations", list_all, methods=["GET"]),
    Route("/v1/operations/{op_id}", get_one, methods=["GET"]),
    Route("/v1/operations/{op_id}/wait", wait, methods=["GET"]),
    Route("/v1/operations/{op_id}/cancel", cancel, methods=["POST"]),
]


async def decide(request: Request) -> Response:
    rt = _rt(request)
    who = await authenticate(request)
    require_operator(who)  # before the body: an agent learns nothing from its parsing
    op_id = agent_actions.operation_id(request.path_params["op_id"])
    decision = parse_decision(await read_json(request, rt.settings.server.max_body_bytes))

    op = await rt.db.run_write(
        commands_decide, rt.db, rt.journal, rt.providers, op_id, who, decision, rt.clock.now()
    )
    rt.tracing.mark(op, SpanName.DECISION, decision=decision.action, state=op.state)
    rt.notifier.changed(op.id)
    rt.notifier.wake()
    return JSONResponse(await agent_actions.render(rt, op))


async def history(request: Request) -> Response:
    """One page of the history, oldest first; ``next_cursor`` continues it (null at the end)."""
    rt = _rt(request)
    who = await authenticate(request)
    limit, after = parse_history_params(request.query_params, rt.settings.limits.max_history_page)
    return JSONResponse(
        await agent_actions.history(rt, who, request.path_params["op_id"], limit, after)
    )


ROUTES += [
    Route("/v1/operations/{op_id}/decisions", decide, methods=["POST"]),
    Route("/v1/operations/{op_id}/history", history, methods=["GET"]),
]
