"""The demo's moving parts: servers in threads, simulated providers as processes, and the
agent's callback receiver.

Guarantee: whatever starts here stops on the way out, within a bound: a server in a
thread is told to exit and joined; a simulated provider is stopped by its process group
(SIGTERM, then SIGKILL after ``STOP_GRACE``), and dies with the demo even when the demo
is killed with SIGKILL (its ``--die-with-parent``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from reconciler.core.clock import SystemClock
from reconciler.core.errors import DemoFailed, SignatureRejected
from reconciler.core.signatures import StandardWebhooksVerifier

HOST = "127.0.0.1"
START_TIMEOUT = 15.0
STOP_GRACE = 5.0  # a simulated provider's, from SIGTERM to SIGKILL (it stops in 2 s)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
    return port


def bound_socket() -> socket.socket:
    """A socket bound to a free loopback port; uvicorn listens on it when it starts."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((HOST, 0))
    return sock


def url_of(sock: socket.socket) -> str:
    return f"http://{HOST}:{sock.getsockname()[1]}"


@contextmanager
def serve_in_thread(
    app: Any,
    name: str,
    sock: socket.socket | None = None,
    on_stop: Callable[[], None] | None = None,
) -> Iterator[str]:
    """Run ``app`` on uvicorn in a thread (no signal handlers there); yields its base URL.

    ``on_stop`` is called as the stop begins (the service answers its open waits then).
    """
    sock = sock or bound_socket()
    config = uvicorn.Config(
        app, log_config=None, access_log=False, ws="none", timeout_graceful_shutdown=2
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=name)
    thread.daemon = True
    thread.start()
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise DemoFailed(f"the {name} did not start; see service.log")
            time.sleep(0.02)
        yield url_of(sock)
    finally:
        if on_stop is not None:
            on_stop()
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@contextmanager
def run_sim(log_path: Path, env: dict[str, str], webhook_url: str) -> Iterator[str]:
    """Start the simulated provider as a subprocess; stop it by its PID on the way out."""
    with log_path.open("ab") as log:
        for _ in range(3):
            port = _free_port()
            command = [sys.executable, "-m", "reconciler.demo.sim", "--host", HOST]
            command += ["--port", str(port), "--webhook-url", webhook_url]
            command += ["--die-with-parent", str(os.getpid())]
            # Token and webhook secret go through the environment, not argv (visible in ps).
            # The demo directory as cwd: `-m` puts it first on sys.path, and nothing there
            # can stand in for the installed package.
            # Its own process group: a Ctrl-C at the terminal reaches the demo alone, which
            # stops the service before its providers. It dies with the demo even when the
            # demo is killed with SIGKILL (--die-with-parent, ``demo.sim.lifeline``).
            proc = subprocess.Popen(
                command,
                cwd=log_path.parent,
                env=env,
                stdout=log,
                stderr=log,
                process_group=0,
            )
            try:
                url = f"http://{HOST}:{port}"
                if _wait_for_sim(proc, url):
                    yield url
                    return
            finally:
                _stop(proc)
    raise DemoFailed(f"the simulated provider did not start; see {log_path}")


def _wait_for_sim(proc: subprocess.Popen[bytes], url: str) -> bool:
    deadline = time.monotonic() + START_TIMEOUT
    # One client for every try: each new one would load the TLS roots again (~45 ms).
    with httpx.Client(timeout=1.0, trust_env=False) as client:
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if client.get(f"{url}/_sim/stats").status_code == 200:
                    return True
            except httpx.TransportError:
                pass
            time.sleep(0.1)
    return False


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, and SIGKILL after a grace; to its process group, which only it is in."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_GRACE)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=STOP_GRACE)


class CallbackReceiver:
    """The agent's side: verifies each callback's signature and counts it per webhook-id."""

    def __init__(self, secret: str) -> None:
        self.trust(secret)
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._rejected = 0
        self.app = Starlette(routes=[Route("/callbacks", self._receive, methods=["POST"])])

    async def _receive(self, request: Request) -> Response:
        body = await request.body()
        try:
            verified = self._verifier.verify(request.headers, body)
        except SignatureRejected:
            with self._lock:
                self._rejected += 1
            return Response(status_code=401)
        with self._lock:
            self._counts[verified.event_id or ""] += 1
        return Response(status_code=204)

    def trust(self, secret: str) -> None:
        """Verify with ``secret`` from now on: the agent's own, once its token exists."""
        self._verifier = StandardWebhooksVerifier([secret], clock=SystemClock())

    def counts(self) -> tuple[Counter[str], int]:
        with self._lock:
            return Counter(self._counts), self._rejected
