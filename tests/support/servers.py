"""Real servers on 127.0.0.1 for tests: an ASGI app on uvicorn, or a raw TCP handler.

Both bind port 0, wait a bounded time for start-up, and stop on exit even if a
handler is still busy (uvicorn gets a short graceful-shutdown window).
"""

from __future__ import annotations

import random
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import uvicorn

from tests.support.waiting import wait_until

HOST = "127.0.0.1"


@contextmanager
def serve_asgi(
    app: Any,
    *,
    startup_timeout: float = 10.0,
    graceful_shutdown_seconds: int = 1,
    **config: Any,
) -> Iterator[str]:
    """Run ``app`` on uvicorn in a background thread; yields ``http://127.0.0.1:<port>``.

    Extra keyword arguments go to ``uvicorn.Config`` (e.g. ``lifespan="off"``).
    """
    options: dict[str, Any] = {
        "host": HOST,
        "port": 0,
        "log_level": "warning",
        "ws": "none",
        "lifespan": "auto",
        "timeout_graceful_shutdown": graceful_shutdown_seconds,
    }
    options.update(config)
    server = uvicorn.Server(uvicorn.Config(app, **options))
    thread = threading.Thread(target=server.run, name="test-uvicorn", daemon=True)
    thread.start()

    def started() -> bool:
        if not thread.is_alive():
            raise RuntimeError("uvicorn stopped during start-up")
        return bool(server.started)

    try:
        wait_until(started, startup_timeout, "uvicorn to start", poll=0.01)
    except AssertionError:
        server.should_exit = True
        raise
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://{HOST}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=graceful_shutdown_seconds + 5)


@contextmanager
def serve_tcp(handler: Callable[[socket.socket], None]) -> Iterator[int]:
    """Accept connections on 127.0.0.1 and call ``handler(conn)`` for each; yields the port.

    For misbehaving peers (resets, garbage, half responses) that an ASGI server won't produce.
    The handler owns the connection and should close it.
    """
    listener = socket.create_server((HOST, 0))
    listener.settimeout(0.05)
    stop = threading.Event()

    def accept_loop() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(5.0)
            with suppress(OSError):
                handler(conn)

    thread = threading.Thread(target=accept_loop, name="test-tcp", daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(timeout=5)
        listener.close()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


# Below the kernel's ephemeral range: a port handed out here is one that no bind to port 0
# (the in-process servers of other workers) and no outgoing connection's source port can
# take between its release and the bind of the process it is meant for. From the ephemeral
# range one can be, and the service's readiness probe is then answered by another
# worker's server on the same port.
_PICKS = random.SystemRandom()
_LOW = _ephemeral_low()
_PICK_RANGE = (max(1024, _LOW - 12_000), _LOW)


def unused_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    for _ in range(200):
        port = _PICKS.randrange(*_PICK_RANGE)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((HOST, port))
            except OSError:
                continue  # in use: try another
        return port
    raise RuntimeError(f"no free port in {_PICK_RANGE} after 200 tries")
