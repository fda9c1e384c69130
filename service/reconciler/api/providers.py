"""``GET /v1/providers``: what an agent may start here; operators also see webhook settings."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from reconciler.commands import agent_actions
from reconciler.inbound.auth import principal as authenticate
from reconciler.runtime import Runtime


async def list_providers(request: Request) -> Response:
    runtime: Runtime = request.app.state.runtime
    who = await authenticate(request)
    return JSONResponse(await agent_actions.providers(runtime, who))


ROUTES = [Route("/v1/providers", list_providers, methods=["GET"])]
