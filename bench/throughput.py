"""Operations per second through one service process, against a bare client's ceiling.

    python bench/throughput.py [--operations 1000] [--concurrency 64] [--duration 0.2]
        [--rounds 1] [--postgres] [--baseline TREE] [--ceiling-clients N]
        [--provider-server protocol|starlette] [--receiver-server protocol|starlette]
        [--py-spy DIR] [--stages] [--keep] [--traced] [--smoke]
    python bench/throughput.py frames FILE [--top 25]

Per round and backend (SQLite WAL file; PostgreSQL with ``--postgres``: a throw-away
database on ``$RECONCILER_TEST_POSTGRES_URL``, else a throw-away cluster as
``bench/soak_infra.py`` starts one), each run on a fresh database, a fresh provider and a
fresh receiver. The provider is the bench's own (``bench/fast_provider.py``, its own
process): the simulated provider's wire (``reconciler/demo/sim/sim.toml`` is the file the
service gets) without its chaos, answering in a fraction of a millisecond, with one
signed ``job.succeeded`` webhook per job. The receiver (``bench/throughput_parts.py
receiver``, its own process) verifies every callback's signature with the agent's own
secret. Both run on ``bench/fast_http.py`` and come from this checkout whatever tree is
measured, so that only the service differs between an A and a B.

* **ours**: one service process (``reconciler serve``, through
  ``bench/throughput_parts.py serve``) with one no-op completion hook. An agent submits
  ``--operations`` jobs (``POST /v1/operations``, at most ``--concurrency`` at a time),
  each succeeding ``--duration`` s after it is created, with one signed ``job.succeeded``
  webhook and a ``callback_url`` at the receiver. The first fallback read is 15-30 s
  away, so the webhook drives each completion.
* **bare**: a plain client in this process makes the same provider and receiver calls
  per operation (create, one status read, the result, one signed callback POST),
  ``--concurrency`` operations at a time, with the service's client library and
  connection limits: the service's httpx client (``reconciler/providers/client.py``)
  over its aiohttp transport (``reconciler/providers/aiohttp_transport.py``), the
  provider file's ``[http]`` pool
  (``max_connections``, ``max_keepalive_connections``, ``keepalive_expiry_seconds``) and
  the callback client's transport (no retries; plain-http connections kept alive briefly). Its
  calls to the provider wait for a pool slot in a semaphore of the pool's size.
* **provider ceiling** and **receiver ceiling**: a client alone against a fresh provider
  (create, status and result per operation: ops/s) or a fresh receiver (one signed
  callback per operation: callbacks/s). The provider's is driven by a raw kept-alive
  client on ``bench/fast_http.py`` (``--ceiling-client httpx``: the bare client's httpx
  instead, which on two cores tops out near twice the bare rate and so measures itself);
  the receiver's by the bare client, in a process of its own, or as
  ``--ceiling-clients`` processes at once of ``--operations`` each (on a machine with
  cores to spare, so that one client's own CPU is less of the ceiling; on two cores a
  second one only takes the peer's). **The run fails** (exit 1, a ``CEILING TOO LOW`` line with the
  figures) when either ceiling is under 5x the rate of the fastest service of its round:
  there that peer, not the service, may be what the service's figure shows. The bare
  clients' own CPU per operation is printed too; where it is many times the peer's, the
  clients, not the peer, set the ceiling, and the peer's own CPU per operation says how
  far above it the peer would go.

Measured from the first submission until every callback arrived at the receiver (its
clock: the time the last distinct one came in; a provider ceiling ends with its clients'
last answer). Printed per run: completed operations per second and the ratio ours / bare
(the bare run of the same round), the service's CPU per operation (``/proc/<pid>/stat``,
from the first submission until every operation's completion is recorded), the
provider's and the receiver's CPU per operation in the same window, write transactions
per operation (``reconciler_write_transactions_total`` on ``/metrics``) and status reads
per operation (``reconciler_status_requests_total``), with the machine's load average,
and what the agent and the provider waited (``bench/stages.py``: POST p50/p99, create ->
callback p50/p90, 503s); ``--stages`` adds where each operation waited inside the
service, stage by stage.
The bare run prints its own CPU per operation: what the same four outbound calls cost in
this HTTP stack with nothing else, a floor under the service's figure (which adds the two
inbound requests, the database and the completion bookkeeping).

``--traced`` adds a run of the measured checkout with tracing on (OpenTelemetry over
OTLP/HTTP to a sink of its own process, ``bench/throughput_parts.py otlp``), in every
round beside the others, and prints the spans it received per operation.

``--tree TREE`` measures another checkout (with its own ``.venv``) instead of this one;
``--baseline TREE``: another checkout (e.g. a worktree at the commit before a change)
run as a further run in every round, the order rotating between rounds, so that the load
of a shared machine falls on both alike. ``--provider-server starlette`` and
``--receiver-server starlette`` put the same peers on Starlette and uvicorn (httptools,
uvloop) instead, to compare. ``--py-spy DIR`` samples each service run with py-spy
(``pip install py-spy``) into raw collapsed stacks; ``frames FILE`` prints the top frames
of one (self and inclusive share of samples). Targets (one process): ours / bare >= 0.5
on SQLite and >= 0.35 on PostgreSQL, <= 8 ms of service CPU and <= 6 write transactions
per operation.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

ROOT = Path(__file__).resolve().parents[1]
# Run as a script, bench/ comes first on sys.path; its modules are imported as bench.*:
# leave only the repository's roots.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
for _path in (str(ROOT / "service"), str(ROOT)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import httpx  # noqa: E402
from bench import stages  # noqa: E402
from bench.poller import cpu_seconds  # noqa: E402
from bench.support import (  # noqa: E402
    SMOKE_HELP,
    Busy,
    BusyMeter,
    free_port,
    sampled,
    smoke,
    stop,
    wait_ready,
)
from tests.support import loopback  # noqa: E402

SIM_TOKEN = "bench-sim-token"
SUBMIT_TRIES = 3
RESENT = -1  # in a run's answers: a submission sent again after a dropped connection
AGENT = "bench-agent"
HOOK = "bench.throughput_parts:completion_hook"
# The first fallback read is 15-30 s after acceptance: each completion is the webhook's.
POLLING = {
    "base_delay_seconds": 30.0,
    "max_delay_seconds": 120.0,
    "deadline_seconds": 600.0,
    "max_status_requests": 60,
}
STAGES_HELP = "print where each operation waited in the service (bench/stages.py; costs CPU)"
SECRET_LINE = re.compile(r"callback secret for .*: (whsec_\S+)")
# The bare client's runs: against both peers, and against each alone (its ceiling).
BARE, PROVIDER, RECEIVER = "bare", "provider", "receiver"
HEADROOM = 5  # each peer's ceiling must be this many times the service's rate
# py-spy on the service: every thread, with who holds the GIL.
SPY_OPTIONS = ("--rate", "200", "--format", "raw", "--nonblocking", "--threads", "--gil")


@dataclass(frozen=True)
class Tree:
    """A checkout whose service is measured, with the Python of its own virtualenv."""

    label: str
    root: Path
    traced: bool = False  # telemetry on: spans exported over OTLP/HTTP to a local sink

    @property
    def python(self) -> str:
        own = self.root / ".venv" / "bin" / "python"
        return str(own) if own.exists() else sys.executable


@dataclass(frozen=True)
class Run:
    label: str
    backend: str
    operations: int
    seconds: float
    cpu_ms: float | None = None  # service CPU per operation
    writes: float | None = None  # write transactions per operation
    reads: float | None = None  # status reads per operation
    failed: int = 0
    peers_ms: tuple[float, float] | None = None  # the provider's and the receiver's CPU per op
    waits: stages.Waits | None = None  # what the agent and the provider waited
    busy: Busy | None = None  # the service's cores and the machine's over the CPU window

    @property
    def rate(self) -> float:
        return self.operations / self.seconds if self.seconds > 0 else float("nan")


# --- processes ---------------------------------------------------------------------------


def spawn(args: list[str], log: Path, env: dict[str, str] | None = None, python: str = "") -> Any:
    with log.open("ab") as out:
        return subprocess.Popen(
            [python or sys.executable, *args],
            cwd=ROOT,
            env={**os.environ, **(env or {})},
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def webhook_secret() -> str:
    from tests.support.stack import WEBHOOK_SECRET

    return WEBHOOK_SECRET


def callback_secret() -> str:
    from tests.support.stack import CALLBACK_SECRET

    return CALLBACK_SECRET


def start_provider(work: Path, service_port: int | None, server: str) -> tuple[Any, str]:
    """The bench's provider (``bench/fast_provider.py``), its own process, from this tree."""
    port = free_port()
    args = ["bench/fast_provider.py", "--port", str(port), "--token", SIM_TOKEN]
    args += ["--webhook-secret", webhook_secret(), "--server", server]
    if service_port is not None:
        args += ["--webhook-url", f"http://127.0.0.1:{service_port}/webhooks/sim"]
    provider = spawn(args, work / "provider.log")
    url = f"http://127.0.0.1:{port}"
    wait_ready(f"{url}/_fast/stats", timeout=60)
    return provider, url


@contextmanager
def receiver(work: Path, secret: str, server: str) -> Iterator[tuple[str, int]]:
    """The callback receiver, its own process: its URL and PID."""
    port = free_port()
    args = ["bench/throughput_parts.py", "receiver", "--port", str(port), "--secret", secret]
    proc = spawn([*args, "--server", server], work / "receiver.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(f"{url}/stats", timeout=60)
        yield url, proc.pid
    finally:
        stop(proc)


@contextlib.contextmanager
def otlp_sink(work: Path) -> Iterator[str]:
    """The traced run's OTLP/HTTP receiver, its own process: its base URL."""
    port = free_port()
    proc = spawn(["bench/throughput_parts.py", "otlp", "--port", str(port)], work / "otlp.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(f"{url}/stats", timeout=60)
        yield url
    finally:
        stop(proc)


def service_env(otlp: str | None = None) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("RECONCILER_") and not k.startswith("OTEL_")
    }
    if otlp is not None:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = otlp
    env.update(
        SIM_TOKEN=SIM_TOKEN,
        SIM_WEBHOOK_SECRETS=webhook_secret(),
        RECONCILER_CALLBACK_SECRET=callback_secret(),
    )
    return env


def write_config(work: Path, db_url: str, sim_url: str, port: int) -> Path:
    from tests.support.process import provider_file, toml_value

    providers = work / "providers"
    provider_file(providers, sim_url, **POLLING)
    lines = [
        f"database_url = {toml_value(db_url)}",
        f"providers_dir = {toml_value(str(providers))}",
        f"hooks = {toml_value([HOOK])}",
        'log_level = "WARNING"',
        "[server]",
        'host = "127.0.0.1"',
        f"port = {port}",
        "[callbacks]",
        'allow_hosts = ["127.0.0.1"]',
        # The burst is one agent's: its quotas would be the figure otherwise.
        "[limits]",
        "max_operations_in_flight = 0",
        "max_creates_per_minute = 0",
    ]
    config = work / "reconciler.toml"
    config.write_text("\n".join(lines) + "\n", "utf-8")
    return config


def cli(tree: Tree, config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tree.python, "-m", "reconciler", *args, "--config", str(config)],
        cwd=tree.root,
        # The tree's own package first: a checkout without a virtualenv of its own runs on
        # this one's Python, whose editable install would otherwise migrate the baseline's
        # database to this tree's schema.
        env={**service_env(), "PYTHONPATH": str(tree.root / "service")},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def prepare(tree: Tree, config: Path) -> tuple[str, str]:
    """Migrate the database with the tree's own CLI and make the agent: (token, secret)."""
    done = cli(tree, config, "db", "upgrade")
    if done.returncode != 0:
        raise RuntimeError(f"db upgrade failed: {done.stderr.strip()}")
    made = cli(tree, config, "tokens", "create", "--name", AGENT, "--scope", "agent")
    if made.returncode != 0:
        raise RuntimeError(f"tokens create failed: {made.stderr.strip()}")
    found = SECRET_LINE.search(made.stderr)
    if found is None:
        raise RuntimeError(f"no callback secret shown: {made.stderr.strip()}")
    return made.stdout.strip(), found.group(1)


class Databases:
    """A fresh database per run: a SQLite file, or one on a PostgreSQL server."""

    def __init__(self, postgres: bool) -> None:
        self.postgres = postgres
        self.admin: str | None = None
        self.cluster: Any = None

    def __enter__(self) -> Databases:
        if self.postgres:
            self.admin = os.environ.get("RECONCILER_TEST_POSTGRES_URL")
            if not self.admin:
                from bench.soak_infra import ThrowawayPostgres

                self.cluster = ThrowawayPostgres()
                self.admin = self.cluster.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.cluster is not None:
            self.cluster.stop()

    @contextmanager
    def fresh(self, backend: str, work: Path) -> Iterator[str]:
        if backend == "sqlite":
            yield f"sqlite:///{work / 'throughput.db'}"
            return
        from bench.soak_infra import create_database, drop_database

        assert self.admin is not None
        url = create_database(self.admin)
        try:
            yield url
        finally:
            drop_database(self.admin, url)


# --- measuring ---------------------------------------------------------------------------


def metric_sum(text: str, name: str) -> float:
    """The sum of a counter's samples over all its labels."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and (line[len(name)] in " {"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def scrape(url: str) -> tuple[float, float]:
    text = loopback.get(f"{url}/metrics", timeout=60).text
    writes = metric_sum(text, "reconciler_write_transactions_total")
    reads = metric_sum(text, "reconciler_status_requests_total")
    return writes, reads


def finished(db_url: str) -> int:
    """Operations in an end state whose completion handler has finished."""
    import sqlalchemy as sa

    engine = sa.create_engine(db_url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            value = conn.execute(
                sa.text(
                    "SELECT count(*) FROM operations "
                    "WHERE done_at IS NOT NULL AND completion_pending = :no"
                ),
                {"no": False},
            ).scalar_one()
    finally:
        engine.dispose()
    return int(value)


def receiver_stats(url: str) -> dict[str, Any]:
    data: dict[str, Any] = loopback.get(f"{url}/stats", timeout=30).json()
    return data


def await_callbacks(url: str, count: int, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    stats = receiver_stats(url)
    while stats["distinct"] < count and time.monotonic() < deadline:
        # The receiver's clock times the last arrival; polling more often would only
        # spend the receiver's CPU, which the run reports.
        time.sleep(0.2)
        stats = receiver_stats(url)
    return stats


async def submit(
    url: str,
    token: str,
    args: argparse.Namespace,
    callback: str,
    timings: list[tuple[str, float, float, int]] | None = None,
) -> Counter[int]:
    """Every operation through ``POST /v1/operations``, ``--concurrency`` at a time;
    ``timings`` gets (operation id, sent, answered, status) for each answer."""
    headers = {"Authorization": f"Bearer {token}"}
    limits = httpx.Limits(max_connections=args.concurrency, max_keepalive_connections=None)
    answers: Counter[int] = Counter()
    gate = asyncio.Semaphore(args.concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:

        async def one(index: int) -> None:
            request = {
                "scenario": "success",
                "duration": args.duration,
                "webhooks": "normal",
                "webhook_on_running": False,
                "n": index,
            }
            # An agent's submission carries a key, so a call whose kept-alive connection
            # was dropped is simply sent again (the key makes it the same operation).
            body = {
                "provider": "sim",
                "request": request,
                "callback_url": callback,
                "idempotency_key": f"bench-{index}",
            }
            async with gate:
                for attempt in range(SUBMIT_TRIES):
                    sent = time.time()
                    try:
                        response = await client.post("/v1/operations", json=body, headers=headers)
                    except httpx.TransportError:
                        if attempt + 1 < SUBMIT_TRIES:
                            answers[RESENT] += 1
                            continue
                        answers[0] += 1
                    else:
                        answers[response.status_code] += 1
                        if timings is not None:
                            found = response.json() if response.status_code < 300 else {}
                            answered = (str(found.get("id", "")), sent, time.time())
                            timings.append((*answered, response.status_code))
                    break

        await asyncio.gather(*(one(i) for i in range(args.operations)))
    return answers


class Meter(Protocol):
    """Figures taken outside the service over a run (``bench/peer_dbos.py``: the
    PostgreSQL server's CPU, commits and statements)."""

    def begin(self, db_url: str) -> None:
        """Just before the first submission."""

    def finished(self) -> None:
        """Once every operation's completion is recorded (the CPU window's end)."""

    def after_stop(self) -> None:
        """Once the service stopped (its connections closed, their counters flushed)."""


def run_ours(
    tree: Tree,
    backend: str,
    args: argparse.Namespace,
    dbs: Databases,
    work: Path,
    spy: Path | None,
    meter: Meter | None = None,
) -> Run:
    with dbs.fresh(backend, work) as db_url:
        port = free_port()
        provider, provider_url = start_provider(work, port, args.provider_server)
        try:
            config = write_config(work, db_url, provider_url, port)
            token, secret = prepare(tree, config)
            with (
                receiver(work, secret, args.receiver_server) as (rcv, rcv_pid),
                otlp_sink(work) if tree.traced else contextlib.nullcontext("") as otlp,
            ):
                cmd = ["bench/throughput_parts.py", "serve", "--root", str(tree.root)]
                cmd += ["--config", str(config)]
                staged = work / "stages.json" if getattr(args, "stages", False) else None
                if staged is not None:
                    cmd += ["--stages", str(staged)]
                env = service_env(otlp or None)
                service = spawn(cmd, work / "service.log", env, tree.python)
                url = f"http://127.0.0.1:{port}"
                try:
                    wait_ready(f"{url}/readyz", timeout=120)
                    writes0, reads0 = scrape(url)
                    with sampled(service.pid, spy, SPY_OPTIONS):
                        pids = (service.pid, provider.pid, rcv_pid)
                        if meter is not None:
                            meter.begin(db_url)
                        cpu0 = [cpu_seconds(pid) for pid in pids]
                        busy = BusyMeter(service.pid)
                        started = time.time()
                        timings: list[tuple[str, float, float, int]] = []
                        answers = asyncio.run(submit(url, token, args, f"{rcv}/cb", timings))
                        created = sum(n for code, n in answers.items() if 200 <= code < 300)
                        if created < args.operations or answers[RESENT]:
                            # 0: no answer after every try; -1: sent again after no answer
                            print(f"    submissions of {tree.label} answered {dict(answers)}")
                        stats = await_callbacks(rcv, created, timeout=max(300, created))
                        deadline = time.monotonic() + 60
                        while finished(db_url) < created and time.monotonic() < deadline:
                            time.sleep(0.05)
                        cpu = [cpu_seconds(pid) - c for pid, c in zip(pids, cpu0, strict=True)]
                        busied = busy.stop()
                        seen = peer_waits(timings, rcv, provider_url)
                        if meter is not None:
                            meter.finished()
                    writes1, reads1 = scrape(url)
                finally:
                    stop(service)
                if staged is not None and staged.exists():
                    stages.report(staged)
                if meter is not None:
                    meter.after_stop()
                if otlp:
                    # Read after the service stopped: the spans still queued went at shutdown.
                    spans = loopback.get(f"{otlp}/stats", timeout=30).json()["spans"]
                    print(f"    {tree.label}: {spans} spans exported, {spans / created:.1f}/op")
        finally:
            stop(provider)
    if stats["rejected"]:
        print(f"    the receiver refused {stats['rejected']} deliveries of {tree.label}")
    arrived = int(stats["distinct"])
    last = stats["last_at"] or time.time()
    n = max(1, arrived)
    return Run(
        tree.label,
        backend,
        arrived,
        last - started,
        cpu_ms=cpu[0] * 1000 / n,
        writes=(writes1 - writes0) / n,
        reads=(reads1 - reads0) / n,
        failed=args.operations - arrived,
        peers_ms=(cpu[1] * 1000 / n, cpu[2] * 1000 / n),
        waits=seen,
        busy=busied,
    )


def peer_waits(
    timings: list[tuple[str, float, float, int]], rcv: str, provider_url: str
) -> stages.Waits:
    """The run's waits as the agent and the provider saw them (``bench/stages.py``)."""
    arrived = loopback.get(f"{rcv}/arrivals", timeout=30).json()
    refused = loopback.get(f"{provider_url}/_fast/stats", timeout=30).json().get("refused", {})
    return stages.waits(timings, arrived, refused)


@dataclass(frozen=True)
class Peers:
    """Where the bare client's calls go: None leaves that half of each operation out."""

    provider: str | None
    receiver: str | None


def provider_limits(work: Path, provider_url: str) -> httpx.Limits:
    """The service's pool to the provider: the ``[http]`` table of the file it is given."""
    from tests.support.process import provider_file

    from reconciler.providers.loader import load_providers

    providers = work / "bare-providers"
    provider_file(providers, provider_url, **POLLING)
    spec = load_providers(providers, {}, {}, check_secrets=False)["sim"]
    return httpx.Limits(
        max_connections=spec.http.max_connections,
        max_keepalive_connections=spec.http.max_keepalive_connections,
        keepalive_expiry=spec.http.keepalive_expiry_seconds,
    )


def callback_transport() -> httpx.AsyncBaseTransport:
    """The service's callback transport (``reconciler/outbound/callbacks.py``): aiohttp's
    under httpx, no retries, plain-http connections kept alive briefly, https ones fresh."""
    from reconciler.outbound.callbacks import DeliveryTransport

    return DeliveryTransport()


def provider_transport(limits: httpx.Limits) -> httpx.AsyncBaseTransport:
    """The service's transport to a provider (``reconciler/providers/http_adapter.py``)."""
    from reconciler.providers.aiohttp_transport import AiohttpTransport

    return AiohttpTransport(limits=limits)


async def _request(
    client: httpx.AsyncClient,
    gate: asyncio.Semaphore | None,
    method: str,
    url: str,
    **kw: Any,
) -> httpx.Response:
    # A loaded machine drops a kept-alive connection now and then: every call here is
    # safe to repeat (the create carries its idempotency key).
    for attempt in range(5):
        try:
            if gate is None:
                return await client.request(method, url, **kw)
            # A pool's worth of calls at a time; the rest wait here, in order.
            async with gate:
                return await client.request(method, url, **kw)
        except httpx.TransportError:
            if attempt == 4:
                raise
            await asyncio.sleep(0.05)
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class Timed:
    """What the bare client did: operations done, from when, and its own CPU seconds."""

    done: int
    started: float
    ended: float
    cpu: float


def bare_job(index: int) -> dict[str, Any]:
    """The job a bare client asks the provider for: done at once, no webhook."""
    return {"scenario": "success", "duration": 0, "webhooks": "never", "n": index}


async def bare_client(
    peers: Peers,
    secret: str,
    args: argparse.Namespace,
    limits: httpx.Limits,
    first: int = 0,
    when_ready: Callable[[], Awaitable[None]] | None = None,
) -> Timed:
    """The same calls per operation as the service makes, without the service: create, one
    status read and the result at the provider, one signed callback POST to the receiver."""
    from reconciler.core.signatures import decode_whsec, sign_standard_webhook
    from reconciler.providers.client import OutboundClient

    key = decode_whsec(secret)
    headers = {"Authorization": f"Bearer {SIM_TOKEN}", "Accept": "application/json"}
    gate = asyncio.Semaphore(args.concurrency)
    pool_gate = asyncio.Semaphore(limits.max_connections or args.concurrency)
    done = 0
    # Both clients are made before the clock starts, as the service makes its own at startup.
    async with (
        OutboundClient(
            base_url=peers.provider or "http://127.0.0.1",
            timeout=60,
            transport=provider_transport(limits),
            headers=headers,
        ) as sim,
        OutboundClient(transport=callback_transport(), timeout=10) as out,
    ):

        async def call(client: httpx.AsyncClient, method: str, url: str, **kw: Any) -> Any:
            return await _request(client, pool_gate if client is sim else None, method, url, **kw)

        async def at_provider(index: int) -> tuple[str, dict[str, Any], dict[str, Any]]:
            request = bare_job(index)
            created = await call(
                sim, "POST", "/v1/jobs", json=request, headers={"Idempotency-Key": f"b{index}"}
            )
            job_id = created.json()["job_id"]
            status = (await call(sim, "GET", f"/v1/jobs/{job_id}")).json()
            result = (await call(sim, "GET", status["result"]["url"])).json()
            return job_id, status, result

        async def callback(index: int, job_id: str, state: str, summary: Any) -> bool:
            assert peers.receiver is not None
            op_id = f"op_bare_{index}"
            event = {
                "type": "operation.completed",
                "operation": {
                    "id": op_id,
                    "provider": "sim",
                    "state": "succeeded",
                    "done": True,
                    "remote_job_id": job_id,
                    "remote_state": state,
                    "message": "The job SUCCEEDED and its result was verified.",
                    "result": {"summary": summary},
                    "budget": {"status_requests_used": 1, "max_status_requests": 60},
                    "error": None,
                    "escalation": None,
                },
            }
            body = json.dumps(event).encode()
            signed = sign_standard_webhook(key, op_id, int(time.time()), body)
            answer = await call(
                out,
                "POST",
                f"{peers.receiver}/cb",
                content=body,
                headers={**signed, "content-type": "application/json"},
            )
            return bool(answer.status_code == 204)

        async def one(index: int) -> None:
            nonlocal done
            async with gate:
                job_id, state, summary = f"job_bare_{index}", "succeeded", None
                if peers.provider is not None:
                    job_id, status, result = await at_provider(index)
                    state, summary = status.get("state"), result.get("summary")
                    if state != "succeeded" or summary is None:
                        return
                if peers.receiver is None or await callback(index, job_id, state, summary):
                    done += 1

        if when_ready is not None:  # several clients at once start together
            await when_ready()
        started, cpu0 = time.time(), time.process_time()
        await asyncio.gather(*(one(first + i) for i in range(args.operations)))
        cpu, ended = time.process_time() - cpu0, time.time()
    return Timed(done, started, ended, cpu)


def run_bare(backend: str, args: argparse.Namespace, work: Path, kind: str = BARE) -> Run:
    """The bare client against a fresh provider and receiver (``BARE``), or against one of
    them alone: that one's ceiling (``PROVIDER``: create, status and result per operation;
    ``RECEIVER``: one signed callback per operation), driven by ``--ceiling-clients``
    bare clients at once."""
    secret = callback_secret()
    with contextlib.ExitStack() as stack:
        provider_url = rcv = None
        pids = []
        if kind in (BARE, PROVIDER):
            provider, provider_url = start_provider(work, None, args.provider_server)
            stack.callback(stop, provider)
            pids.append(provider.pid)
        if kind in (BARE, RECEIVER):
            rcv, rcv_pid = stack.enter_context(receiver(work, secret, args.receiver_server))
            pids.append(rcv_pid)
        limits = provider_limits(work, provider_url or "http://127.0.0.1:9")
        peers = Peers(provider_url, rcv)
        peer0 = [cpu_seconds(pid) for pid in pids]
        if kind == BARE:
            # The bare client runs in this process: its CPU is this process's, and it
            # shows what the same outbound calls cost in this HTTP stack with nothing else.
            timed = asyncio.run(bare_client(peers, secret, args, limits))
        else:
            timed = (
                asyncio.run(raw_provider_client(peers, args, limits))
                if kind == PROVIDER and args.ceiling_client == "raw"
                else clients(peers, args, limits, work)
            )
        done, ended = timed.done, timed.ended
        if rcv is not None:
            stats = await_callbacks(rcv, done, timeout=60)
            if stats["rejected"]:
                raise RuntimeError(f"the receiver refused {stats['rejected']} bare callbacks")
            done, ended = int(stats["distinct"]), stats["last_at"] or ended
        n = max(1, done)
        used = [(cpu_seconds(pid) - c) * 1000 / n for pid, c in zip(pids, peer0, strict=True)]
    return Run(
        kind,
        backend,
        done,
        ended - timed.started,
        cpu_ms=timed.cpu * 1000 / n,
        failed=args.operations * (1 if kind == BARE else args.ceiling_clients) - done,
        peers_ms=(
            used[0] if provider_url else float("nan"),
            used[-1] if rcv else float("nan"),
        ),
    )


async def raw_provider_client(
    peers: Peers, args: argparse.Namespace, limits: httpx.Limits
) -> Timed:
    """The provider ceiling's client: the bare client's create, status and result calls on
    ``bench/fast_http.py``'s kept-alive connections (as many as the provider file allows),
    several times cheaper a call than httpx, so the provider, not its client, is measured."""
    from bench.fast_http import Poster

    assert peers.provider is not None
    url = httpx.URL(peers.provider)
    assert url.host and url.port
    caller = Poster(url.host, url.port, limits.max_connections or args.concurrency)
    headers = {"authorization": f"Bearer {SIM_TOKEN}", "accept": "application/json"}
    posting = {**headers, "content-type": "application/json"}
    gate = asyncio.Semaphore(args.concurrency)
    done = 0

    async def one(index: int) -> None:
        nonlocal done
        body = json.dumps(bare_job(index))
        async with gate:
            key = {**posting, "idempotency-key": f"c{index}"}
            status, created = await caller.request("POST", "/v1/jobs", key, body.encode())
            if status != 202:
                return
            job_id = json.loads(created)["job_id"]
            status, read = await caller.request("GET", f"/v1/jobs/{job_id}", headers)
            target = httpx.URL(json.loads(read)["result"]["url"]).raw_path.decode()
            status, _ = await caller.request("GET", target, headers)
            done += status == 200

    cpu0, started = time.process_time(), time.time()
    try:
        await asyncio.gather(*(one(i) for i in range(args.operations)))
    finally:
        caller.close()
    return Timed(done, started, time.time(), time.process_time() - cpu0)


def clients(peers: Peers, args: argparse.Namespace, limits: httpx.Limits, work: Path) -> Timed:
    """``--ceiling-clients`` bare clients, each its own process with ``--operations``
    operations, started together once each is ready (its imports done, its clients made):
    their operations, first start, last end and CPU."""
    procs = []
    with contextlib.ExitStack() as stack:
        for number in range(args.ceiling_clients):
            cmd = [
                sys.executable,
                "bench/throughput.py",
                "client",
                "--first",
                str(number * args.operations),
            ]
            cmd += ["--operations", str(args.operations), "--concurrency", str(args.concurrency)]
            pool = [limits.max_connections, limits.max_keepalive_connections]
            cmd += ["--limits", json.dumps([*pool, limits.keepalive_expiry])]
            if peers.provider:
                cmd += ["--provider", peers.provider]
            if peers.receiver:
                cmd += ["--receiver", peers.receiver]
            log = stack.enter_context((work / f"client-{number}.log").open("wb"))
            proc = subprocess.Popen(
                cmd, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log
            )
            stack.callback(stop, proc)  # by its PID, should another client fail
            procs.append(proc)
        for proc in procs:
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != b"ready":
                raise RuntimeError(f"a bare client did not start (see {work}/client-*.log)")
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(b"go\n")
            proc.stdin.flush()
        answers = []
        for proc in procs:
            out, _ = proc.communicate(timeout=600)
            if proc.returncode != 0:
                raise RuntimeError(f"a bare client failed (see {work}/client-*.log)")
            answers.append(Timed(**json.loads(out)))
    return Timed(
        sum(t.done for t in answers),
        min(t.started for t in answers),
        max(t.ended for t in answers),
        sum(t.cpu for t in answers),
    )


def client_main(argv: list[str]) -> int:
    """One bare client of a ceiling run: prints its ``Timed`` as JSON."""
    parser = argparse.ArgumentParser(prog="throughput.py client")
    parser.add_argument("--provider", default=None)
    parser.add_argument("--receiver", default=None)
    parser.add_argument("--operations", type=int, required=True)
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--limits", required=True, help="[max, keepalive, expiry]")
    args = parser.parse_args(argv)
    most, keep, expiry = json.loads(args.limits)
    limits = httpx.Limits(
        max_connections=most, max_keepalive_connections=keep, keepalive_expiry=expiry
    )
    peers = Peers(args.provider, args.receiver)

    async def ready() -> None:
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)

    timed = asyncio.run(bare_client(peers, callback_secret(), args, limits, args.first, ready))
    print(json.dumps(dataclasses.asdict(timed)))
    return 0


# --- report ------------------------------------------------------------------------------


def describe(run: Run, bare: Run | None) -> str:
    ratio = ""
    if bare is not None and run.label not in (BARE, PROVIDER, RECEIVER):
        ratio = f"  ours/bare {run.rate / bare.rate:5.2f}"
    unit = "callbacks/s" if run.label == RECEIVER else "ops/s"
    label = f"{run.label} ceiling" if run.label in (PROVIDER, RECEIVER) else run.label
    parts = [f"{label:<16} {run.backend:<10} {run.rate:7.1f} {unit}{ratio}"]
    if run.cpu_ms is not None:
        parts.append(f"CPU {run.cpu_ms:5.2f} ms/op")
    if run.label in (PROVIDER, RECEIVER) and run.peers_ms is not None:
        own = run.peers_ms[0 if run.label == PROVIDER else 1]
        # What the peer alone would serve on one core, were its clients free (a short run
        # may use less CPU than the clock's tick can show).
        core = f"{1000 / own:6.0f}/s a core" if own > 0 else "under a clock tick"
        parts.append(f"({run.label} {own:4.2f} ms/op: {core})")
    elif run.peers_ms is not None:
        parts.append(f"(provider {run.peers_ms[0]:4.2f}, receiver {run.peers_ms[1]:4.2f})")
    if run.writes is not None:
        parts.append(f"writes {run.writes:5.2f}/op")
    if run.reads is not None:
        parts.append(f"status reads {run.reads:4.2f}/op")
    parts.append(f"({run.operations} in {run.seconds:.2f} s; load {os.getloadavg()[0]:.1f})")
    if run.failed:
        parts.append(f"MISSING {run.failed}")
    if run.waits is not None:
        parts.append(f"\n      {run.waits.describe()}")
    if run.busy is not None:
        parts.append(f"\n      {run.busy.describe()}")
    return "  ".join(parts)


def _median(values: list[float | None]) -> float:
    found = [v for v in values if v is not None]
    return statistics.median(found) if found else float("nan")


def summary(runs: list[Run], bares: dict[tuple[str, int, str], Run]) -> None:
    print("medians over rounds:")
    keys = sorted({(r.label, r.backend) for r in runs})
    for label, backend in keys:
        mine = [r for r in runs if (r.label, r.backend) == (label, backend)]
        ratios = [
            r.rate / bares[(backend, i, BARE)].rate
            for i, r in enumerate(mine)
            if (backend, i, BARE) in bares and bares[(backend, i, BARE)].rate > 0
        ]

        def rates(kind: str, be: str = backend) -> float:
            return _median([b.rate for (b_be, _, k), b in bares.items() if (b_be, k) == (be, kind)])

        print(
            f"  {label:<10} {backend:<10} {_median([r.rate for r in mine]):7.1f} ops/s "
            f"(bare {rates(BARE):6.1f}; ceilings: provider {rates(PROVIDER):6.1f} ops/s, "
            f"receiver {rates(RECEIVER):6.1f} callbacks/s)  ours/bare {_median(list(ratios)):5.2f}"
            f"  CPU {_median([r.cpu_ms for r in mine]):5.1f} ms/op  "
            f"writes {_median([r.writes for r in mine]):5.2f}/op  "
            f"status reads {_median([r.reads for r in mine]):4.2f}/op"
        )


def short_ceilings(
    runs: dict[tuple[str, int], list[Run]], bares: dict[tuple[str, int, str], Run]
) -> list[str]:
    """A line for each peer whose ceiling, in a round, was under ``HEADROOM`` times the
    fastest service of that round: there the peer, not the service, may set the rate."""
    lines = []
    for (backend, number), services in sorted(runs.items()):
        fastest = max(services, key=lambda r: r.rate)
        for kind in (PROVIDER, RECEIVER):
            ceiling = bares.get((backend, number, kind))
            if ceiling is not None and ceiling.rate < HEADROOM * fastest.rate:
                lines.append(
                    f"round {number + 1} {backend}: the {kind} ceiling {ceiling.rate:.1f}/s is "
                    f"under {HEADROOM} x {fastest.rate:.1f} ops/s, the rate of {fastest.label} "
                    f"(= {HEADROOM * fastest.rate:.1f}/s)"
                )
    return lines


def frames(path: Path, top: int) -> None:
    """Top frames of a py-spy raw profile: by samples where they ran (self) and below them."""
    own: Counter[str] = Counter()
    below: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        names = [f for f in stack.split(";") if not f.startswith("thread ")]
        if not names:
            continue
        total += n
        own[names[-1]] += n
        for name in set(names):
            below[name] += n
    print(f"{path.name}: {total} samples")
    print("  self:")
    for name, n in own.most_common(top):
        print(f"    {n * 100 / total:5.1f}%  {name}")
    print("  inclusive:")
    for name, n in below.most_common(top):
        print(f"    {n * 100 / total:5.1f}%  {name}")


def trees_of(args: argparse.Namespace) -> list[Tree]:
    """The checkouts measured, in the order of a round's first rotation."""
    trees = [Tree(args.label, args.tree.resolve())]
    if args.baseline is not None:
        trees.append(Tree("baseline", args.baseline.resolve()))
    if args.traced:
        trees.append(Tree("traced", args.tree.resolve(), traced=True))
    return trees


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "client":
        return client_main(sys.argv[2:])
    if len(sys.argv) > 1 and sys.argv[1] == "frames":
        parser = argparse.ArgumentParser(prog="throughput.py frames")
        parser.add_argument("file", type=Path)
        parser.add_argument("--top", type=int, default=25)
        parsed = parser.parse_args(sys.argv[2:])
        frames(parsed.file, parsed.top)
        return 0
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--operations", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--duration", type=float, default=0.2)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--postgres", action="store_true")
    parser.add_argument("--sqlite", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout to measure")
    parser.add_argument("--baseline", type=Path, default=None, help="a checkout to compare")
    parser.add_argument("--label", default="ours")
    parser.add_argument(
        "--traced", action="store_true", help="also run this checkout with tracing on"
    )
    parser.add_argument("--no-bare", action="store_true")
    parser.add_argument("--py-spy", type=Path, default=None, help="sample the service into DIR")
    parser.add_argument("--stages", action="store_true", help=STAGES_HELP)
    parser.add_argument("--keep", action="store_true", help="keep each run's files")
    parser.add_argument(
        "--ceiling-clients",
        type=int,
        default=1,
        help="bare client processes at once in a ceiling run (for machines with cores to spare)",
    )
    parser.add_argument(
        "--ceiling-client",
        choices=("raw", "httpx"),
        default="raw",
        help="the provider ceiling's client: fast_http's (default) or the bare httpx client",
    )
    parser.add_argument("--provider-server", choices=("protocol", "starlette"), default="protocol")
    parser.add_argument("--receiver-server", choices=("protocol", "starlette"), default="protocol")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args()
    smoke(args, operations=40, concurrency=8, duration=0.05, rounds=1, postgres=False)
    trees = trees_of(args)
    backends = (["sqlite"] if args.sqlite else []) + (["postgresql"] if args.postgres else [])
    if args.py_spy is not None:
        args.py_spy.mkdir(parents=True, exist_ok=True)
    print(
        f"{args.operations} operations, {args.concurrency} at a time, jobs of "
        f"{args.duration:g} s, one hook and one callback each; {os.cpu_count()} CPUs, "
        f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )
    runs: list[Run] = []
    bares: dict[tuple[str, int, str], Run] = {}  # (backend, round, kind)
    services: dict[tuple[str, int], list[Run]] = {}
    with Databases(args.postgres) as dbs:
        for number in range(args.rounds):
            for backend in backends:
                order: list[Tree | str] = [*trees] + ([] if args.no_bare else [BARE])
                order += [PROVIDER, RECEIVER]
                shift = number % len(order)
                order = order[shift:] + order[:shift]
                for item in order:
                    work = Path(tempfile.mkdtemp(prefix="bench-throughput-"))
                    try:
                        if isinstance(item, str):
                            run = run_bare(backend, args, work, item)
                            bares[(backend, number, item)] = run
                        else:
                            spy = None
                            if args.py_spy is not None:
                                spy = args.py_spy / f"{item.label}-{backend}-{number + 1}.txt"
                            run = run_ours(item, backend, args, dbs, work, spy)
                            runs.append(run)
                            services.setdefault((backend, number), []).append(run)
                    finally:
                        if args.keep:
                            print(f"    kept {work}")
                        else:
                            with contextlib.suppress(OSError):
                                shutil.rmtree(work)
                    bare = bares.get((backend, number, BARE))
                    print(f"  round {number + 1}  {describe(run, bare)}")
    summary(runs, bares)
    short = short_ceilings(services, bares)
    for line in short:
        print(f"CEILING TOO LOW: {line}")
    return 1 if short and not args.smoke else 0


if __name__ == "__main__":
    raise SystemExit(main())
