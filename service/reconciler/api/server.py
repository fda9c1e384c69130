"""The app on uvicorn: the process's settings, the server, and its front door.

``reconciler.app.serve`` puts them together.
"""

from __future__ import annotations

import contextlib
import gc
import signal
from collections.abc import Iterator
from types import FrameType
from typing import Any

import uvicorn

from reconciler.api.frontdoor import DoorLimits, Refusal, protocol_class
from reconciler.config import Settings
from reconciler.runtime import Runtime


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


class Server(uvicorn.Server):
    """uvicorn's server, telling long-polls to answer as soon as a stop is asked for.

    uvicorn waits ``timeout_graceful_shutdown`` for open requests and then cancels
    them, which logs a ``CancelledError`` traceback for every ``/wait`` still open;
    answered at once instead, each agent simply waits again (on another replica).
    """

    def __init__(self, config: uvicorn.Config, runtime: Runtime) -> None:
        super().__init__(config)
        self.runtime = runtime

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.runtime.notifier.close_waits()
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn's signal handling, without raising SIGTERM again after a clean stop.

        uvicorn re-raises every signal it caught once it has shut down, so the process dies
        of SIGTERM (status -15) and supervisors report the stop they asked for as a
        failure. A SIGTERM that led to a clean shutdown ends with status 0 instead; any
        other signal is re-raised as uvicorn does.
        """
        with super().capture_signals():
            yield
            caught = self._captured_signals
            caught[:] = [s for s in caught if s != signal.SIGTERM]


def server_config(app: Any, settings: Settings, runtime: Runtime) -> uvicorn.Config:
    """uvicorn's settings, with the front door's limits in the protocol itself."""
    refusals = runtime.metrics.front_door_refusals

    def count(refusal: Refusal) -> None:
        refusals.labels(refusal.value).inc()

    server = settings.server
    return uvicorn.Config(
        app,
        host=server.host,
        port=server.port,
        log_config=None,
        access_log=False,
        proxy_headers=server.trust_proxy_headers,
        timeout_graceful_shutdown=5,
        http=protocol_class(DoorLimits.of(server), count),
        timeout_keep_alive=max(1, round(server.keep_alive_seconds)),
        # The protocol refuses connections over max_connections on accept; the kernel's
        # queue of not yet accepted ones is kept as long as the cap allows.
        backlog=min(server.max_connections, 4096),
    )
