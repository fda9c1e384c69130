"""The composition root: the one module that puts the service together.

It builds the pieces below it (the runtime over storage and providers, the engine in
the background, the routes of the API, the console and the MCP door) into one
Starlette app, and runs it. Nothing else imports a door and the engine together: the
doors receive the ``Runtime``, the engine receives ``engine.deps.EngineDeps``, and
only this module hands the same runtime to both.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.routing import BaseRoute

from reconciler import logs
from reconciler.agent_tools.http import McpEndpoint
from reconciler.api import docs, health, operations, providers, webhooks
from reconciler.api.server import Server, server_config, tune_process
from reconciler.config import Settings
from reconciler.console.routes import ROUTES as CONSOLE_ROUTES
from reconciler.console.web import ConsoleState
from reconciler.engine.background import Background
from reconciler.inbound.errors import HANDLERS
from reconciler.runtime import Runtime
from reconciler.storage import migrate


def create_app(runtime: Runtime, *, background: bool = True) -> Starlette:
    """Every route, MCP at ``/mcp``, the error handlers, and the engine and the MCP
    transport in the app's lifespan (``background=False``: the engine's scheduler is off)."""
    worker = Background(runtime, run_scheduler=background)
    if worker.run_scheduler:
        runtime.create_starts = worker.create_starts
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


def serve(settings: Settings, *, migrate_first: bool = True) -> int:
    """``reconciler serve``: the app on uvicorn until a signal stops it."""
    logs.configure(settings.log_level)
    runtime = Runtime.build(settings)
    if migrate_first:
        migrate.upgrade(runtime.db)
    app = create_app(runtime)
    tune_process()
    Server(server_config(app, settings, runtime), runtime).run()
    return 0
