"""Running the app on uvicorn."""

from __future__ import annotations

import uvicorn

from reconciler import logs, migrate
from reconciler.app import create_app
from reconciler.config import Settings
from reconciler.runtime import Runtime


def serve(settings: Settings, *, migrate_first: bool = True) -> int:
    logs.configure(settings.log_level)
    runtime = Runtime.build(settings)
    if migrate_first:
        migrate.upgrade(runtime.db)
    app = create_app(runtime)
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
