"""The agent tools over MCP against the HTTP API: the same jobs, the same service, one run.

    python bench/mcp_vs_http.py [--jobs 200] [--concurrency 8] [--rounds 4] [--reads 200]
        [--smoke]

The service (uvicorn, one process, SQLite) and the simulated provider run as
subprocesses on 127.0.0.1; this process is the agent. Each job is started and
then awaited until done: over HTTP with ``POST /v1/operations`` and
``GET .../wait``, over MCP with the official SDK's client calling ``start_job``
and ``wait_job`` (streamable HTTP at ``/mcp``). Rounds alternate HTTP and MCP so
both see the same machine. Prints, per call, p50/p99 for each path, the latency
MCP adds, the ratio of their p99s (target: at most 1.5) and the ratio of
throughputs (jobs/s, MCP over HTTP). Then, one call at a time, ``get_job``
against ``GET /v1/operations/{id}`` on a finished job: the protocol's own cost,
without the job's wait around it.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Run as a script, this file's folder comes first on sys.path; its modules are imported as
# bench.*: leave only the repository's roots.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path[:0] = [
    str(Path(__file__).resolve().parents[1]),
    str(Path(__file__).resolve().parents[1] / "service"),
]

from bench.support import (  # noqa: E402
    ROOT,
    SMOKE_HELP,
    free_port,
    percentile,
    smoke,
    stop,
    wait_ready,
)

SIM_TOKEN = "bench-sim-token"
WEBHOOK_SECRET = "whsec_" + base64.b64encode(b"bench-mcp-webhook-secret-012345").decode()
JOB = {"scenario": "success", "duration": 0.2}
WAIT_SECONDS = 20.0
TARGET_P99_RATIO = 1.5


def serve(db_url: str, port: int, sim_url: str) -> None:
    import uvicorn
    from tests.support.stack import sim_provider_table

    from reconciler import logs
    from reconciler.api.server import tune_process
    from reconciler.app import create_app
    from reconciler.config import SchedulerSettings, ServerSettings, Settings
    from reconciler.runtime import Runtime

    logs.configure("WARNING")  # into the service log file: anything that slowed a job down
    # The provider is inline; the configured directory must exist: an empty one beside the
    # database, in the run's work directory, which the run removes.
    empty = Path(db_url.removeprefix("sqlite:///")).parent / "providers"
    empty.mkdir(exist_ok=True)
    table = sim_provider_table(
        sim_url, polling={"base_delay_seconds": 0.2, "max_delay_seconds": 1.0}
    )
    settings = Settings(
        database_url=db_url,
        providers_dir=str(empty),
        providers={"sim": table},
        server=ServerSettings(wait_max_seconds=30.0),
        scheduler=SchedulerSettings(tick_seconds=0.2, lease_seconds=10.0),
    )
    environ = {"SIM_TOKEN": SIM_TOKEN, "SIM_WEBHOOK_SECRETS": WEBHOOK_SECRET}
    app = create_app(Runtime.build(settings, environ=environ))
    tune_process()
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        loop="uvloop",
        http="httptools",
        log_level="warning",
        access_log=False,
    )


def prepare(db_url: str) -> str:
    """A migrated database with one agent token; returns the token."""
    from datetime import UTC, datetime

    from reconciler.storage import migrate
    from reconciler.storage.database import Database
    from reconciler.storage.tokens import create_token

    db = Database(db_url)
    migrate.upgrade(db)
    with db.write() as conn:
        token = create_token(conn, "bench-agent", "agent", datetime.now(UTC))
    db.dispose()
    return token


@dataclass
class Sample:
    """Per-call latencies (seconds) and the wall time of one round of one path."""

    start: list[float] = field(default_factory=list)
    wait: list[float] = field(default_factory=list)
    calls_per_job: list[int] = field(default_factory=list)
    wall: float = 0.0
    jobs: int = 0

    def add(self, other: Sample) -> None:
        self.start += other.start
        self.wait += other.wait
        self.calls_per_job += other.calls_per_job
        self.wall += other.wall
        self.jobs += other.jobs


Job = Callable[[int, Sample], Awaitable[None]]


async def _timed(samples: list[float], call: Awaitable[Any]) -> Any:
    began = time.perf_counter()
    result = await call
    samples.append(time.perf_counter() - began)
    return result


async def _drive(jobs: int, concurrency: int, one: Job) -> Sample:
    sample = Sample(jobs=jobs)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(jobs):
        queue.put_nowait(i)

    async def worker() -> None:
        while not queue.empty():
            await one(queue.get_nowait(), sample)

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    sample.wall = time.perf_counter() - began
    return sample


async def http_round(url: str, token: str, tag: str, jobs: int, concurrency: int) -> Sample:
    import httpx

    headers = {"Authorization": f"Bearer {token}"}
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(
        base_url=url, headers=headers, timeout=60.0, limits=limits, trust_env=False
    ) as http:

        async def one(i: int, sample: Sample) -> None:
            body = {"provider": "sim", "request": JOB, "idempotency_key": f"{tag}-{i}"}
            answer = await _timed(sample.start, http.post("/v1/operations", json=body))
            op = answer.raise_for_status().json()
            calls = 1
            while not op["done"]:
                params = {"timeout_seconds": WAIT_SECONDS}
                answer = await _timed(
                    sample.wait, http.get(f"/v1/operations/{op['id']}/wait", params=params)
                )
                op = answer.raise_for_status().json()
                calls += 1
            sample.calls_per_job.append(calls)

        return await _drive(jobs, concurrency, one)


async def mcp_round(url: str, token: str, tag: str, jobs: int, concurrency: int) -> Sample:
    from contextlib import AsyncExitStack

    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    async with AsyncExitStack() as stack:
        clients = []
        for _ in range(concurrency):
            http = await stack.enter_async_context(
                httpx2.AsyncClient(
                    headers={"Authorization": f"Bearer {token}"},
                    timeout=httpx2.Timeout(60.0),
                    trust_env=False,
                )
            )
            client = await stack.enter_async_context(
                Client(streamable_http_client(f"{url}/mcp", http_client=http))
            )
            await client.list_tools()  # the client caches the output schemas it validates with
            clients.append(client)
        free: asyncio.Queue[Any] = asyncio.Queue()
        for client in clients:
            free.put_nowait(client)

        async def one(i: int, sample: Sample) -> None:
            client = await free.get()
            try:
                args = {"provider": "sim", "request": JOB, "idempotency_key": f"{tag}-{i}"}
                result = await _timed(sample.start, client.call_tool("start_job", args))
                if result.is_error:
                    raise RuntimeError(f"start_job failed: {result.content}")
                op = result.structured_content
                calls = 1
                while not op["done"]:
                    wait = {"id": op["id"], "timeout_seconds": WAIT_SECONDS}
                    result = await _timed(sample.wait, client.call_tool("wait_job", wait))
                    if result.is_error:
                        raise RuntimeError(f"wait_job failed: {result.content}")
                    op = result.structured_content
                    calls += 1
                sample.calls_per_job.append(calls)
            finally:
                free.put_nowait(client)

        return await _drive(jobs, concurrency, one)


def _ms(values: list[float], q: float) -> float:
    return percentile(values, q) * 1000


def report(http: Sample, mcp: Sample) -> bool:
    ok = True
    print(f"{'call':<10} {'path':<5} {'n':>5} {'p50 ms':>9} {'p99 ms':>9}")
    for name in ("start", "wait"):
        h, m = getattr(http, name), getattr(mcp, name)
        print(f"{name:<10} {'http':<5} {len(h):>5} {_ms(h, 50):>9.1f} {_ms(h, 99):>9.1f}")
        print(f"{'':<10} {'mcp':<5} {len(m):>5} {_ms(m, 50):>9.1f} {_ms(m, 99):>9.1f}")
        ratio = _ms(m, 99) / _ms(h, 99)
        verdict = "ok" if ratio <= TARGET_P99_RATIO else "OVER TARGET"
        print(
            f"{'':<10} added by MCP: p50 {_ms(m, 50) - _ms(h, 50):+.1f} ms, "
            f"p99 {_ms(m, 99) - _ms(h, 99):+.1f} ms; p99 ratio {ratio:.2f} "
            f"(target <= {TARGET_P99_RATIO}) -> {verdict}"
        )
        ok = ok and ratio <= TARGET_P99_RATIO
    http_rate, mcp_rate = http.jobs / http.wall, mcp.jobs / mcp.wall
    print(
        f"throughput: http {http_rate:.1f} jobs/s, mcp {mcp_rate:.1f} jobs/s, "
        f"ratio mcp/http {mcp_rate / http_rate:.2f}"
    )
    calls = sum(mcp.calls_per_job) / max(1, len(mcp.calls_per_job))
    print(f"calls per job: http {sum(http.calls_per_job) / http.jobs:.2f}, mcp {calls:.2f}")
    return ok


async def read_costs(url: str, token: str, reads: int) -> tuple[list[float], list[float]]:
    """Sequential reads of one finished job: GET /v1/operations/{id} against get_job."""
    import httpx
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {token}"}
    http_times: list[float] = []
    mcp_times: list[float] = []
    async with httpx.AsyncClient(base_url=url, headers=headers, trust_env=False) as http:
        body = {"provider": "sim", "request": JOB, "idempotency_key": "read-probe"}
        op = (await http.post("/v1/operations", json=body)).raise_for_status().json()
        params = {"timeout_seconds": WAIT_SECONDS}
        await http.get(f"/v1/operations/{op['id']}/wait", params=params)
        for _ in range(reads):
            await _timed(http_times, http.get(f"/v1/operations/{op['id']}"))
    async with (
        httpx2.AsyncClient(headers=headers, trust_env=False) as raw,
        Client(streamable_http_client(f"{url}/mcp", http_client=raw)) as client,
    ):
        await client.list_tools()
        for _ in range(reads):
            await _timed(mcp_times, client.call_tool("get_job", {"id": op["id"]}))
    return http_times, mcp_times


async def measure(url: str, token: str, args: argparse.Namespace) -> tuple[Sample, Sample]:
    # Warm both paths (connections, caches, the service's first queries) before measuring.
    await http_round(url, token, "warm-http", 10, args.concurrency)
    await mcp_round(url, token, "warm-mcp", 10, args.concurrency)
    http, mcp = Sample(), Sample()
    per_round = max(1, args.jobs // args.rounds)
    for r in range(args.rounds):
        http.add(await http_round(url, token, f"http-{r}", per_round, args.concurrency))
        mcp.add(await mcp_round(url, token, f"mcp-{r}", per_round, args.concurrency))
    return http, mcp


def start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """A child process whose output goes to a file (a pipe nobody reads would fill and stall it)."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, *args], cwd=ROOT, env={**os.environ, **env}, stdout=out, stderr=out
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    srv = sub.add_parser("serve")
    srv.add_argument("--db", required=True)
    srv.add_argument("--port", type=int, required=True)
    srv.add_argument("--sim-url", required=True)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--reads", type=int, default=200)
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    parser.add_argument("--keep", action="store_true", help="keep the work directory and logs")
    args = parser.parse_args()
    smoke(args, jobs=4, concurrency=2, rounds=2, reads=5)
    if args.command == "serve":
        serve(args.db, args.port, args.sim_url)
        return 0

    workdir = Path(tempfile.mkdtemp(prefix="bench-mcp-"))
    db_url = f"sqlite:///{workdir / 'reconciler.db'}"
    token = prepare(db_url)
    sim_port, port = free_port(), free_port()
    sim_url, url = f"http://127.0.0.1:{sim_port}", f"http://127.0.0.1:{port}"
    env = {"PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]), "service"])}
    sim = start(
        [
            "-m",
            "reconciler.demo.sim",
            "--port",
            str(sim_port),
            "--token",
            SIM_TOKEN,
            "--webhook-secret",
            WEBHOOK_SECRET,
            "--webhook-url",
            f"{url}/webhooks/sim",
        ],
        env,
        workdir / "sim.log",
    )
    service = None
    try:
        wait_ready(f"{sim_url}/_sim/stats", timeout=60.0)
        service = start(
            [__file__, "serve", "--db", db_url, "--port", str(port), "--sim-url", sim_url],
            env,
            workdir / "service.log",
        )
        wait_ready(f"{url}/healthz", timeout=60.0)
        print(
            f"{args.jobs} jobs per path in {args.rounds} alternating rounds, "
            f"{args.concurrency} at a time; SQLite"
        )
        http, mcp = asyncio.run(measure(url, token, args))
        http_reads, mcp_reads = asyncio.run(read_costs(url, token, args.reads))
    finally:
        if service is not None:
            stop(service)
        stop(sim)
        if args.keep:
            print(f"kept {workdir} (logs: sim.log, service.log)")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    ok = report(http, mcp)
    print(
        f"one read at a time ({args.reads}): GET p50 {_ms(http_reads, 50):.1f} ms p99 "
        f"{_ms(http_reads, 99):.1f} ms; get_job p50 {_ms(mcp_reads, 50):.1f} ms p99 "
        f"{_ms(mcp_reads, 99):.1f} ms; added by MCP p50 "
        f"{_ms(mcp_reads, 50) - _ms(http_reads, 50):+.1f} ms"
    )
    return 0 if ok or args.smoke else 1


if __name__ == "__main__":
    raise SystemExit(main())
