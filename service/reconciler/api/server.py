"""Running the app on uvicorn."""

from __future__ import annotations

import gc

import uvicorn

from reconciler import logs
from reconciler.api.app import create_app
from reconciler.config import Settings
from reconciler.runtime import Runtime
from reconciler.storage import migrate


def tune_process() -> None:
    """Garbage-collector settings for a long-running service.

    Everything built at start (SQLAlchemy metadata, settings, routes) is frozen out of
    the collector's view, and young collections run less often: with the defaults, a
    full collection walking those objects would stall requests for tens of
    milliseconds every few thousand requests.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


def serve(settings: Settings, *, migrate_first: bool = True) -> int:
    logs.configure(settings.log_level)
    runtime = Runtime.build(settings)
    if migrate_first:
        migrate.upgrade(runtime.db)
    app = create_app(runtime)
    tune_process()
    config = uvicorn.Config(
        app,
        host=settings.server.host,
        port=settings.server.port,
        log_config=None,
        access_log=False,
        proxy_headers=settings.server.trust_proxy_headers,
        timeout_graceful_shutdown=5,
    )
    uvicorn.Server(config).run()
    return 0
