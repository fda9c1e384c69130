"""The agent API: start, read, list, wait for and cancel operations."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from reconciler.api.auth import principal as authenticate
from reconciler.api.bodies import read_limited
from reconciler.api.validation import parse_cancel, parse_create, parse_decision
from reconciler.api.view_batch import ViewBatcher
from reconciler.commands import create as operations
from reconciler.commands.cancel import cancel as commands_cancel
from reconciler.commands.decide import decide as commands_decide
from reconciler.core.states import END_STATES, State
from reconciler.core.strict_json import parse_json
from reconciler.core.views import history_entry_view
from reconciler.errors import InvalidRequest
from reconciler.runtime import Runtime
from reconciler.storage import operations as store
from reconciler.storage.history import history_of
from reconciler.storage.models import Operation
from reconciler.storage.tokens import Principal, require_operator
from reconciler.storage.views import operation_views, view_of

MAX_LIMIT = store.MAX_PAGE
STALE_RETRIES = 5
DEFAULT_LIMIT = 50


def _rt(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


async def _view(rt: Runtime, op: Operation) -> dict[str, Any]:
    def load() -> dict[str, Any]:
        with rt.db.read() as conn:
            return view_of(conn, op, rt.clock.now())

    return await rt.db.run(load)


async def _load_visible(rt: Runtime, op_id: str, who: Principal) -> Operation:
    def load() -> Operation:
        with rt.db.read() as conn:
            return store.visible_operation(conn, op_id, who)

    return await rt.db.run(load)


async def _wait_for(
    rt: Runtime,
    op_id: str,
    who: Principal,
    deadline: float,
    until: set[State] | None = None,
) -> Operation:
    """The operation as soon as it is done (or leaves ``until``), or at ``deadline``.

    ``deadline`` is on the loop's clock, taken when the request arrived, so time spent
    queueing for a read counts against the wait. Each round subscribes before it reads
    (a change in between is not missed) and reads once; the timeout itself costs no read.
    """
    loop = asyncio.get_running_loop()

    def finished(current: Operation) -> bool:
        state = State(current.state)
        return state in END_STATES if until is None else state not in until

    while True:
        event = rt.notifier.subscribe(op_id)
        try:
            op = await _load_visible(rt, op_id, who)
            left = deadline - loop.time()
            if finished(op) or left <= 0 or rt.notifier.closing:
                return op  # closing: shutting down, answer now rather than be cut off
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout=left)
        finally:
            rt.notifier.unsubscribe(op_id, event)
        if not event.is_set():
            return op  # timed out without a change: the last read stands


def _views(request: Request) -> ViewBatcher:
    batcher = getattr(request.app.state, "view_batcher", None)
    if batcher is None:
        batcher = request.app.state.view_batcher = ViewBatcher(_rt(request))
    assert isinstance(batcher, ViewBatcher)
    return batcher


async def create(request: Request) -> Response:
    rt = _rt(request)
    who = await authenticate(request)
    body = parse_json(await read_limited(request, rt.settings.server.max_body_bytes))
    req = parse_create(body, rt.providers, rt.check_callback_url)
    limits = rt.limits_for(req.provider)
    op, created = await rt.db.run_write(
        operations.create_operation, rt.db, rt.journal, who, req, limits, rt.clock.now()
    )
    if created:
        rt.notifier.wake()
        # A short, bounded wait so the answer usually carries the job id already.
        deadline = asyncio.get_running_loop().time() + rt.settings.server.create_wait_seconds
        op = await _wait_for(rt, op.id, who, deadline, until={State.CREATE_PENDING})
    return JSONResponse(await _view(rt, op), status_code=202 if created else 200)


async def get_one(request: Request) -> Response:
    rt = _rt(request)
    who = await authenticate(request)
    op = await _load_visible(rt, request.path_params["op_id"], who)
    return JSONResponse(await _view(rt, op))


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
    op = await _wait_for(rt, request.path_params["op_id"], who, arrived + timeout)
    return JSONResponse(await _views(request).view(op))


async def list_all(request: Request) -> Response:
    rt = _rt(request)
    who = await authenticate(request)
    params = request.query_params
    extra = sorted(set(params) - {"state", "provider", "limit", "cursor"})
    if extra:
        raise InvalidRequest(f"unknown query parameter(s): {', '.join(extra)}")
    state = None
    if "state" in params:
        try:
            state = State(params["state"])
        except ValueError:
            raise InvalidRequest(
                f"'state' must be one of: {', '.join(s.value for s in State)}"
            ) from None
    raw_limit = params.get("limit", str(DEFAULT_LIMIT))
    if not (raw_limit.isascii() and raw_limit.isdigit()) or not 1 <= int(raw_limit) <= MAX_LIMIT:
        raise InvalidRequest(f"'limit' must be a whole number from 1 to {MAX_LIMIT}")

    def load() -> dict[str, Any]:
        with rt.db.read() as conn:
            page = store.list_operations(
                conn,
                who,
                state=state,
                provider=params.get("provider"),
                limit=int(raw_limit),
                cursor=params.get("cursor"),
            )
            views = operation_views(conn, page.items, rt.clock.now())
        return {"operations": views, "next_cursor": page.next_cursor}

    return JSONResponse(await rt.db.run(load))


async def cancel(request: Request) -> Response:
    rt = _rt(request)
    who = await authenticate(request)
    raw = await read_limited(request, rt.settings.server.max_body_bytes)
    intent = parse_cancel(parse_json(raw) if raw.strip() else None)
    op_id = request.path_params["op_id"]

    op = await rt.db.run_write(
        commands_cancel, rt.db, rt.journal, rt.providers, op_id, who, intent.reason, rt.clock.now()
    )
    rt.notifier.changed(op.id)
    rt.notifier.wake()
    return JSONResponse(await _view(rt, op), status_code=202)


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
    decision = parse_decision(
        parse_json(await read_limited(request, rt.settings.server.max_body_bytes))
    )
    op_id = request.path_params["op_id"]

    op = await rt.db.run_write(
        commands_decide, rt.db, rt.journal, rt.providers, op_id, who, decision, rt.clock.now()
    )
    rt.notifier.changed(op.id)
    rt.notifier.wake()
    return JSONResponse(await _view(rt, op))


async def history(request: Request) -> Response:
    rt = _rt(request)
    who = await authenticate(request)
    op_id = request.path_params["op_id"]

    def load() -> list[dict[str, Any]]:
        with rt.db.read() as conn:
            store.visible_operation(conn, op_id, who)
            return [history_entry_view(e) for e in history_of(conn, op_id)]

    return JSONResponse({"operation_id": op_id, "entries": await rt.db.run(load)})


ROUTES += [
    Route("/v1/operations/{op_id}/decisions", decide, methods=["POST"]),
    Route("/v1/operations/{op_id}/history", history, methods=["GET"]),
]
