"""``GET /openapi.json``: the API description of this running service."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from reconciler.api.openapi import document
from reconciler.runtime import Runtime


async def openapi(request: Request) -> Response:
    runtime: Runtime = request.app.state.runtime
    return JSONResponse(
        document(
            sorted(runtime.providers),
            runtime.settings.server.wait_max_seconds,
            runtime.settings.limits.max_history_page,
        )
    )


ROUTES = [Route("/openapi.json", openapi, methods=["GET"])]
