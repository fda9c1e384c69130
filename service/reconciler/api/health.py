"""Liveness, readiness and metrics (behind a bearer token when one is configured)."""

from __future__ import annotations

import hmac

import sqlalchemy as sa
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from reconciler.errors import AuthenticationFailed
from reconciler.runtime import Runtime
from reconciler.storage import migrate


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


def _ready(runtime: Runtime) -> tuple[bool, str]:
    try:
        with runtime.db.read() as conn:
            conn.execute(sa.text("SELECT 1"))
        current = migrate.current_revision(runtime.db)
    except Exception as exc:  # any failure here means "not ready", never a 500
        return False, f"database unreachable: {type(exc).__name__}"
    head = migrate.head_revision()
    if current != head:
        at = current or "nothing"
        return False, f"schema at {at}, expected {head}; run 'reconciler db upgrade'"
    return True, "ready"


async def readyz(request: Request) -> Response:
    runtime: Runtime = request.app.state.runtime
    ok, message = await runtime.db.run(_ready, runtime)
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
