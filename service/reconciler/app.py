"""The Starlette application factory."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.routing import BaseRoute

from reconciler.api import health
from reconciler.http_errors import HANDLERS
from reconciler.runtime import Runtime


def create_app(runtime: Runtime) -> Starlette:
    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await runtime.start()
        try:
            yield
        finally:
            await runtime.stop()

    routes: list[BaseRoute] = [*health.ROUTES]
    app = Starlette(routes=routes, exception_handlers=dict(HANDLERS), lifespan=lifespan)
    app.state.runtime = runtime
    return app
