"""The Starlette application: every route, MCP at ``/mcp``, the error handlers, and the
engine and the MCP transport in its lifespan."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.routing import BaseRoute

from reconciler.agent_tools.http import McpEndpoint
from reconciler.api import docs, health, operations, providers, webhooks
from reconciler.api.errors import HANDLERS
from reconciler.console.routes import ROUTES as CONSOLE_ROUTES
from reconciler.console.web import ConsoleState
from reconciler.engine.background import Background
from reconciler.runtime import Runtime


def create_app(runtime: Runtime, *, background: bool = True) -> Starlette:
    worker = Background(runtime, run_scheduler=background)
    mcp = McpEndpoint(runtime)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await worker.start()
        try:
            async with mcp.running():
                yield
        finally:
            await worker.stop()
            await runtime.close()

    # The provider endpoint first: it carries the most traffic.
    routes: list[BaseRoute] = [
        *webhooks.ROUTES,
        *operations.ROUTES,
        *providers.ROUTES,
        *mcp.routes(),
        *health.ROUTES,
        *docs.ROUTES,
        *CONSOLE_ROUTES,
    ]
    app = Starlette(routes=routes, exception_handlers=dict(HANDLERS), lifespan=lifespan)
    app.state.runtime = runtime
    app.state.background = worker
    app.state.console = ConsoleState.build(runtime)
    return app
