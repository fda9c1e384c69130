"""Liveness, readiness and metrics (behind a bearer token when one is configured).

``/healthz`` touches nothing but the event loop, so it answers whatever the
database does (a liveness probe must not kill a process for its database's
trouble). ``/readyz`` is 503 while the database cannot be read within a
bound or while this process's writes fail (``storage.availability``).

``/readyz`` is probed every few seconds by every replica's supervisor: each probe
is one ``SELECT 1`` (``Database.ping``). The schema check (an Alembic migration
context) runs once it is needed: until it has succeeded, after any failed probe, and
every ``SCHEMA_RECHECK_SECONDS`` (an upgrade by another process is seen within that).
"""

from __future__ import annotations

import asyncio
import hmac
import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from reconciler.commands.database import schema_behind
from reconciler.core.errors import AuthenticationFailed
from reconciler.runtime import Runtime


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


def _ready(runtime: Runtime, check_schema: bool) -> tuple[bool, str]:
    try:
        runtime.db.ping()
        if not check_schema:
            return True, "ready"
        behind = schema_behind(runtime.db)
    except Exception as exc:  # any failure here means "not ready", never a 500
        return False, f"database unreachable: {type(exc).__name__}"
    return (False, behind) if behind is not None else (True, "ready")


# A readiness probe is answered within this, whatever the database does.
READY_WAIT_SECONDS = 2.0
# A schema found at head is checked again after this long (or after any failed probe).
SCHEMA_RECHECK_SECONDS = 300.0


async def readyz(request: Request) -> Response:
    runtime: Runtime = request.app.state.runtime
    state = request.app.state
    confirmed: float | None = getattr(state, "schema_at_head_since", None)
    check_schema = confirmed is None or time.monotonic() - confirmed > SCHEMA_RECHECK_SECONDS
    try:
        ok, message = await asyncio.wait_for(
            runtime.db.run(_ready, runtime, check_schema), READY_WAIT_SECONDS
        )
    except TimeoutError:
        ok, message = False, f"database did not answer within {READY_WAIT_SECONDS:g} s"
    if not ok:
        state.schema_at_head_since = None
    elif check_schema:
        state.schema_at_head_since = time.monotonic()
    if ok:
        ok, message = runtime.db.availability.readiness()
    return JSONResponse(
        {"status": "ready" if ok else "not_ready", "detail": message},
        status_code=200 if ok else 503,
    )


def _check_metrics_token(runtime: Runtime, request: Request) -> None:
    expected = runtime.metrics_token
    if expected is None:
        return
    scheme, _, given = (request.headers.get("authorization") or "").partition(" ")
    wanted = expected.reveal().encode("utf-8")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), wanted):
        raise AuthenticationFailed("/metrics needs 'Authorization: Bearer <metrics token>'")


async def metrics(request: Request) -> Response:
    runtime: Runtime = request.app.state.runtime
    _check_metrics_token(runtime, request)
    body = await runtime.db.run(runtime.metrics.render)
    return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")


ROUTES = [
    Route("/metrics", metrics, methods=["GET"]),
    Route("/healthz", healthz, methods=["GET"]),
    Route("/readyz", readyz, methods=["GET"]),
]
