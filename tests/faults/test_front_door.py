"""The front door of the real server process: oversized and slow clients are cut off early.

/healthz latency under the slow clients is reported by bench/faults.py (p99);
here every probe must be answered while 3,000 clients drip their headers.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from reconciler.demo.sim import SimConfig, SimState
from reconciler.demo.sim import create_app as create_sim
from tests.support import loopback
from tests.support.faults import rss_kib
from tests.support.process import ServiceProcess, service_config, service_process, upgrade
from tests.support.servers import serve_asgi
from tests.support.stack import SIM_TOKEN, WEBHOOK_SECRET

SLACK = 2.0  # scheduling on a shared machine; an uncut client would stay for ever


@contextmanager
def served(tmp_path: Path, **server: Any) -> Iterator[ServiceProcess]:
    sim = SimState(SimConfig(token=SIM_TOKEN, webhook_secret=WEBHOOK_SECRET))
    with serve_asgi(create_sim(state=sim)) as sim_url:
        db_url = f"sqlite:///{tmp_path / 'reconciler.db'}"
        config, port = service_config(tmp_path, db_url, sim_url, server=server)
        upgrade(db_url)
        with service_process(config, port) as svc:
            yield svc


def refusals(url: str) -> dict[str, float]:
    text = loopback.get(f"{url}/metrics", timeout=10).text
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("reconciler_front_door_refusals_total{"):
            reason = line.split('reason="', 1)[1].split('"', 1)[0]
            found[reason] = float(line.rsplit(" ", 1)[1])
    return found


@contextmanager
def sampling_rss(pid: int) -> Iterator[list[int]]:
    samples: list[int] = []
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            samples.append(rss_kib(pid))
            stop.wait(0.01)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        stop.set()
        thread.join(timeout=5)


async def oversized(port: int, header_bytes: int, chunk: int = 262_144) -> tuple[bytes, int]:
    """Send one request whose header grows to ``header_bytes``; return what the server said
    and how much of the header had been sent when it said it (or cut the connection)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    sent = 0
    try:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ")
        block = b"a" * chunk
        while sent < header_bytes and not reader.at_eof():
            writer.write(block)
            await writer.drain()
            sent += chunk
        return await asyncio.wait_for(reader.read(200), 10), sent
    except (ConnectionError, TimeoutError):
        return b"", sent  # reset while still sending, or never answered
    finally:
        writer.close()


def test_oversized_headers_are_refused_before_they_are_held(tmp_path: Path) -> None:
    header_bytes = 20 * 1024 * 1024
    with served(tmp_path) as svc:
        port = int(svc.url.rsplit(":", 1)[1])
        for _ in range(5):
            loopback.get(f"{svc.url}/healthz", timeout=5)
        idle = rss_kib(svc.pid)

        async def attack() -> list[tuple[bytes, int]]:
            return await asyncio.gather(*(oversized(port, header_bytes) for _ in range(100)))

        with sampling_rss(svc.pid) as samples:
            answers = asyncio.run(attack())
        # Each one refused with a 431, or cut off while its header was still being sent: a
        # server that held the header would have let all of it through and then answered
        # nothing (or something else).
        refused = [
            a.startswith(b"HTTP/1.1 431") or (a == b"" and n < header_bytes) for a, n in answers
        ]
        assert all(refused), [(a[:40], n) for a, n in answers][:3]
        assert max(samples) - idle < 50 * 1024, f"RSS grew by {(max(samples) - idle) // 1024} MiB"
        assert refusals(svc.url).get("headers_too_large") == 100
        assert loopback.get(f"{svc.url}/healthz", timeout=5).status_code == 200


async def _slow_client(port: int, drip: float, out: list[float | None]) -> None:
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        out.append(None)
        return
    opened = time.monotonic()
    try:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        while not reader.at_eof():
            try:
                await asyncio.wait_for(reader.read(200), drip)
            except TimeoutError:
                writer.write(b"x")  # one byte of a header that never ends
                await writer.drain()
                continue
            break
    except ConnectionError:
        pass
    finally:
        writer.close()
    out.append(time.monotonic() - opened)


def test_slow_clients_are_cut_off_and_healthz_keeps_answering(tmp_path: Path) -> None:
    deadline = 2.0
    clients = 3000
    with served(tmp_path, header_timeout_seconds=deadline) as svc:
        port = int(svc.url.rsplit(":", 1)[1])
        probes: list[int | None] = []
        stop = threading.Event()

        def probe() -> None:
            while not stop.is_set():
                try:
                    probes.append(loopback.get(f"{svc.url}/healthz", timeout=5).status_code)
                except httpx.HTTPError:
                    probes.append(None)
                stop.wait(0.05)

        prober = threading.Thread(target=probe, daemon=True)
        prober.start()
        lasted: list[float | None] = []

        async def crowd() -> None:
            await asyncio.gather(*(_slow_client(port, 0.5, lasted) for _ in range(clients)))

        try:
            asyncio.run(crowd())
        finally:
            stop.set()
            prober.join(timeout=10)
        assert len(lasted) == clients
        assert None not in lasted, "a slow client could not even connect"
        assert max(t for t in lasted if t is not None) < deadline + SLACK
        assert probes and all(p == 200 for p in probes), "/healthz failed under slow clients"
        assert refusals(svc.url).get("header_timeout", 0) >= clients


def test_connections_over_the_cap_are_refused_on_accept(tmp_path: Path) -> None:
    with served(tmp_path, max_connections=20) as svc:
        port = int(svc.url.rsplit(":", 1)[1])

        async def crowd() -> list[bytes]:
            held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(20)]
            # A request answered on the last one: the server accepts in the order the kernel
            # queued the connections, so all 20 are accepted (and still open) by then.
            reader, writer = held[-1]
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            assert head.startswith(b"HTTP/1.1 200"), head
            extra = [await asyncio.open_connection("127.0.0.1", port) for _ in range(5)]
            answers = [await asyncio.wait_for(r.read(200), 5) for r, _ in extra]
            for _, w in held + extra:
                w.close()
            return answers

        answers = asyncio.run(crowd())
        assert all(a.startswith(b"HTTP/1.1 503") for a in answers), answers
        assert refusals(svc.url).get("too_many_connections") == 5
