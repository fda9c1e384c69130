"""Hundreds of /wait long-polls answer at their timeout; SIGTERM stops without a traceback.

The strict figure (within 1 s of the timeout under 2,000 waits) is printed by
bench/faults.py. Here 500 waits, none answered before its timeout and every one within
four times it: the test's own client shares the machine (and, under pytest-xdist, the
cores) with the service and other tests, so lateness is a figure for the bench, not a
verdict. A wait its timeout does not end is woken by nothing else (the operation never
changes), so it misses the bound by any margin.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from reconciler.demo.sim import FaultRates, SimConfig, SimState
from reconciler.demo.sim import create_app as create_sim
from tests.support import loopback
from tests.support.process import (
    ServiceProcess,
    make_tokens,
    service_config,
    service_process,
    upgrade,
)
from tests.support.servers import serve_asgi
from tests.support.stack import SIM_TOKEN, WEBHOOK_SECRET
from tests.support.waiting import wait_until

WAITS = 500
TIMEOUT = 5.0
# 5.6 s late was seen with the machine's load at ten times its cores.
MARGIN = 3 * TIMEOUT


@contextmanager
def served(tmp_path: Path, sim: SimState) -> Iterator[tuple[ServiceProcess, str]]:
    with serve_asgi(create_sim(state=sim)) as sim_url:
        db_url = f"sqlite:///{tmp_path / 'reconciler.db'}"
        config, port = service_config(tmp_path, db_url, sim_url)
        upgrade(db_url)
        agent, _ = make_tokens(db_url)
        with service_process(config, port) as svc:
            yield svc, agent


def _create(url: str, agent: str, n: int) -> list[str]:
    headers = {"Authorization": f"Bearer {agent}"}
    ids = []
    with loopback.client(base_url=url, headers=headers, timeout=30) as client:
        for _ in range(n):
            body = {
                "provider": "sim",
                "request": {"scenario": "never_finishes"},
                "idempotency_key": uuid.uuid4().hex,
            }
            response = client.post("/v1/operations", json=body)
            response.raise_for_status()
            ids.append(response.json()["id"])
    return ids


async def _wait(port: int, agent: str, op_id: str, timeout: float) -> tuple[float, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    started = time.monotonic()
    writer.write(
        (
            f"GET /v1/operations/{op_id}/wait?timeout_seconds={timeout} HTTP/1.1\r\n"
            f"Host: x\r\nAuthorization: Bearer {agent}\r\nConnection: close\r\n\r\n"
        ).encode()
    )
    await writer.drain()
    head = await asyncio.wait_for(reader.read(16), TIMEOUT + MARGIN)
    took = time.monotonic() - started
    await reader.read()
    writer.close()
    return took, head


def test_hundreds_of_waits_answer_at_their_timeout(tmp_path: Path) -> None:
    sim = SimState(SimConfig(token=SIM_TOKEN, webhook_secret=WEBHOOK_SECRET))
    with served(tmp_path, sim) as (svc, agent):
        ops = _create(svc.url, agent, 100)
        port = int(svc.url.rsplit(":", 1)[1])

        async def crowd() -> list[tuple[float, bytes]]:
            return await asyncio.gather(
                *(_wait(port, agent, ops[i % len(ops)], TIMEOUT) for i in range(WAITS))
            )

        answers = asyncio.run(crowd())
    assert all(head.startswith(b"HTTP/1.1 200") for _, head in answers)
    early = min(took for took, _ in answers)
    assert early >= TIMEOUT - 0.05, f"a /wait answered {TIMEOUT - early:.2f} s before its timeout"
    late = max(took for took, _ in answers) - TIMEOUT
    assert late < MARGIN, f"the latest /wait answered {late:.1f} s after its timeout"


Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def _open_waits(port: int, agent: str, ops: list[str]) -> list[Stream]:
    """One /wait per operation, each request sent whole; returns the open connections (the
    writer too: a writer collected closes its connection)."""
    streams = []
    for op_id in ops:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            (
                f"GET /v1/operations/{op_id}/wait?timeout_seconds=30 HTTP/1.1\r\n"
                f"Host: x\r\nAuthorization: Bearer {agent}\r\nConnection: close\r\n\r\n"
            ).encode()
        )
        await writer.drain()
        streams.append((reader, writer))
    return streams


async def _round_trip(port: int) -> bytes:
    """A /healthz on a connection opened after the waits' and answered: by then the server has
    accepted every earlier connection (the kernel hands them over in order) and read what
    was already in their buffers, so each wait's request is parsed and in flight."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 30)
    writer.close()
    return answer


def test_sigterm_answers_open_waits_and_stops_without_a_traceback(tmp_path: Path) -> None:
    # Status reads hang, so steps are in flight when the stop comes.
    sim = SimState(
        SimConfig(
            token=SIM_TOKEN,
            webhook_secret=WEBHOOK_SECRET,
            endpoint_faults={"status": FaultRates(delay=1.0, delay_seconds=30)},
        )
    )
    with served(tmp_path, sim) as (svc, agent):
        ops = _create(svc.url, agent, 10)
        port = int(svc.url.rsplit(":", 1)[1])
        wait_until(lambda: any(r.endpoint == "status" for r in sim.requests), 30, "a status read")

        async def stop_while_waiting() -> list[bytes]:
            streams = await _open_waits(port, agent, ops)
            assert (await _round_trip(port)).startswith(b"HTTP/1.1 200")
            os.kill(svc.pid, signal.SIGTERM)
            answers = [await asyncio.wait_for(r.read(), 40) for r, _ in streams]
            for _, writer in streams:
                writer.close()
            return answers

        answers = asyncio.run(stop_while_waiting())
        code = svc.proc.wait(timeout=30)
    log = svc.log.read_text("utf-8")
    # A clean stop exits 0: supervisors report a death by signal as a failure.
    assert code == 0, f"exit status {code} after a clean SIGTERM"
    heads = [a.split(b"\r\n", 1)[0] for a in answers]
    assert all(h.startswith(b"HTTP/1.1 200") for h in heads), f"a /wait was cut off: {heads}"
    assert "Traceback" not in log and "CancelledError" not in log, log[-3000:]
