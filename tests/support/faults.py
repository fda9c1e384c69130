"""Harness for fault tests and bench/faults.py: two providers, a hanging peer, a TCP proxy.

Everything binds 127.0.0.1, is bounded in time and is stopped by the caller's
context manager; nothing here sleeps to order events (callers poll state).
"""

from __future__ import annotations

import asyncio
import socket
import statistics
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from reconciler.app import create_app
from reconciler.config import CallbackSettings, SchedulerSettings, ServerSettings, Settings
from reconciler.core.records import HistoryRecord, OperationRecord
from reconciler.demo.sim import FaultRates, SimConfig, SimState
from reconciler.demo.sim import create_app as create_sim
from reconciler.runtime import Runtime
from reconciler.storage import operations as store
from reconciler.storage.database import Database
from reconciler.storage.history import history_of
from tests.support import loopback
from tests.support.servers import HOST, serve_asgi
from tests.support.stack import (
    CALLBACK_SECRET,
    QUICK_POLLING,
    SIM_TOKEN,
    WEBHOOK_SECRET,
    make_tokens,
    sim_provider_table,
)
from tests.support.waiting import wait_until


@dataclass
class TwoProviders:
    """The service with providers ``good`` and ``slow``, each its own simulated provider."""

    url: str
    runtime: Runtime
    sims: dict[str, SimState]
    agent_token: str
    client: httpx.Client = field(init=False)

    def __post_init__(self) -> None:
        self.client = loopback.client(base_url=self.url, timeout=30.0)

    def create(self, provider: str, request: dict[str, Any], **fields: Any) -> str:
        body = {"provider": provider, "request": request, **fields}
        headers = {"Authorization": f"Bearer {self.agent_token}"}
        response = self.client.post("/v1/operations", json=body, headers=headers)
        response.raise_for_status()
        op_id: str = response.json()["id"]
        return op_id

    def rows(self, op_ids: list[str]) -> list[Any]:
        with self.runtime.db.read() as conn:
            return [store.load_operation(conn, op_id) for op_id in op_ids]

    def done(self, op_ids: list[str]) -> bool:
        return all(op.done_at is not None for op in self.rows(op_ids))

    def latencies(self, op_ids: list[str]) -> list[float]:
        """create -> end state, from the recorded timestamps (seconds)."""
        return [(op.done_at - op.created_at).total_seconds() for op in self.rows(op_ids)]

    def leased(self, op_ids: list[str]) -> int:
        return sum(1 for op in self.rows(op_ids) if op.lease_owner is not None)

    def wait_done(self, op_ids: list[str], timeout: float) -> bool:
        try:
            wait_until(lambda: self.done(op_ids), timeout, f"{len(op_ids)} operations done")
        except AssertionError:
            return False
        return True


@contextmanager
def two_providers(
    tmp_path: Path,
    db_url: str,
    *,
    slow: dict[str, FaultRates] | None = None,
    slow_provider: dict[str, dict[str, Any]] | None = None,
    scheduler: dict[str, Any] | None = None,
    callbacks: dict[str, Any] | None = None,
    hooks: tuple[str, ...] = (),
) -> Iterator[TwoProviders]:
    """``slow``: the slow sim's per-endpoint faults (e.g. status answered after 60 s).

    The slow sim's delays end when the test does: the service's shutdown then finds its
    calls answered instead of waiting out its drain bound for them.
    """
    with ExitStack() as stack:
        ending = threading.Event()
        sims = {
            "good": SimState(SimConfig(token=SIM_TOKEN, webhook_secret=WEBHOOK_SECRET)),
            "slow": SimState(
                SimConfig(
                    token=SIM_TOKEN,
                    webhook_secret=WEBHOOK_SECRET,
                    endpoint_faults=slow or {},
                    sleep=sleep_until(ending),
                )
            ),
        }
        urls = {
            name: stack.enter_context(serve_asgi(create_sim(state=s))) for name, s in sims.items()
        }
        polling = {"polling": dict(QUICK_POLLING)}
        providers = {
            "good": sim_provider_table(urls["good"], **polling),
            "slow": sim_provider_table(urls["slow"], **{**polling, **(slow_provider or {})}),
        }
        empty = tmp_path / "no-provider-files"
        empty.mkdir(exist_ok=True)
        settings = Settings(
            database_url=db_url,
            providers_dir=str(empty),
            providers=providers,
            hooks=hooks,
            server=ServerSettings(wait_max_seconds=30.0),
            scheduler=SchedulerSettings(
                **{"tick_seconds": 0.2, "lease_seconds": 10.0, **(scheduler or {})}
            ),
            callbacks=CallbackSettings(**{"allow_hosts": ("127.0.0.0/8",), **(callbacks or {})}),
        )
        environ = {
            "SIM_TOKEN": SIM_TOKEN,
            "SIM_WEBHOOK_SECRETS": WEBHOOK_SECRET,
            "RECONCILER_CALLBACK_SECRET": CALLBACK_SECRET,
        }
        runtime = Runtime.build(settings, environ=environ)
        agent, _ = make_tokens(runtime)
        url = stack.enter_context(serve_asgi(create_app(runtime)))
        stack.callback(ending.set)  # before the service stops (an ExitStack unwinds LIFO)
        for name, sim in sims.items():
            sim.config.webhook_url = f"{url}/webhooks/{name}"
        result = TwoProviders(url, runtime, sims, agent)
        try:
            yield result
        finally:
            result.client.close()


def sleep_until(ending: threading.Event) -> Callable[[float], Awaitable[None]]:
    """A sim's ``sleep`` that returns early once ``ending`` is set (from any thread)."""

    async def sleep(seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not ending.is_set() and (left := deadline - time.monotonic()) > 0:
            await asyncio.sleep(min(left, 0.05))

    return sleep


def p99(values: list[float]) -> float:
    if len(values) < 2:
        return max(values, default=0.0)
    return statistics.quantiles(values, n=100, method="inclusive")[98]


@contextmanager
def hanging_server(host: str = HOST) -> Iterator[str]:
    """Accepts connections, reads what comes, never answers; yields ``http://HOST:PORT``.

    ``host``: another loopback address (``127.0.0.2``) makes it a receiver host of its own.
    """
    listener = socket.create_server((host, 0))
    listener.settimeout(0.05)
    stop = threading.Event()
    held: list[socket.socket] = []

    def accept_loop() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.setblocking(False)
            held.append(conn)  # kept open, never answered, closed at the end

    thread = threading.Thread(target=accept_loop, name="test-hanging", daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(timeout=5)
        listener.close()
        for conn in held:
            with suppress(OSError):
                conn.close()


class TcpProxy:
    """A TCP relay to ``target`` that can be cut (every connection closed, new ones refused)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.port = 0

    def start(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((HOST, self.port))
        listener.listen(128)
        listener.settimeout(0.05)
        self.port = listener.getsockname()[1]
        self._listener = listener
        thread = threading.Thread(target=self._accept, args=(listener,), daemon=True)
        thread.start()
        self._threads.append(thread)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except TimeoutError:
                if self._listener is not listener:
                    return
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        with suppress(OSError):
            src.settimeout(None)
            while data := src.recv(65536):
                dst.sendall(data)
        for s in (src, dst):
            with suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def stop(self) -> None:
        """Cut: refuse new connections and reset every open one."""
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            with suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            with suppress(OSError):
                conn.close()
        for thread in self._threads:
            thread.join(timeout=2)
        self._threads.clear()


def rss_kib(pid: int) -> int:
    """Resident set size of a process, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def submit(url: str, agent: str, body: dict[str, Any]) -> str:
    """``POST /v1/operations`` as ``agent``; the new operation's id (the answer must be 202)."""
    response = loopback.post(
        f"{url}/v1/operations",
        json=body,
        headers={"Authorization": f"Bearer {agent}"},
        timeout=30,
    )
    assert response.status_code == 202, response.text
    op_id: str = response.json()["id"]
    return op_id


def stored(db: Database, op_id: str) -> OperationRecord:
    """The operation as stored now."""
    with db.read() as conn:
        op = store.get_operation(conn, op_id)
    assert op is not None
    return op


def history(db: Database, op_id: str) -> list[HistoryRecord]:
    with db.read() as conn:
        return history_of(conn, op_id)
