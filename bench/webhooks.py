"""Webhook ingest throughput and latency against a bare Starlette route, in one run.

    python bench/webhooks.py [--seconds 6] [--connections 16] [--rounds 3] [--baseline TREE]
        [--hints] [--py-spy DIR] [--smoke]

Every server is one uvicorn process (uvloop, httptools, no access log) on 127.0.0.1:

* ``bare``: one Starlette route answering 204: the ceiling the service is judged against;
* ``ours``: this checkout's service as ``reconciler serve`` runs it (its front door's
  protocol with the limits of ``[server]``, its process settings) on a fresh SQLite file;
* ``baseline`` (with ``--baseline TREE``, which may be given more than once): the same
  for another checkout (e.g. a ``git archive`` of the commit before a change), so every
  figure is an A/B on one machine.

The load is this bench's own client (``bench/fast_http.Poster`` on uvloop, one process,
``--connections`` kept-alive connections each sending its next request when the last is
answered), with pre-signed Standard Webhooks deliveries, each a new event id; by default
for jobs the service has never heard of (orphan events: stored, no hint), with
``--hints`` for 1,000 observed operations. Its own ceiling (the same client against
``fast_http``'s protocol server answering 204) is printed too, so a bare rate near it
says the client, not Starlette, set it. The order of the runs rotates between rounds.
Printed per run: requests/s, p50/p99 latency, the server's CPU (user and system, from
``/proc``) per request, which a shared machine's load disturbs less than the rates, the
answers by status and, for a service,
the events stored (every 2xx must be; the run fails otherwise); then each figure's
median with its spread, and the ratio ours / bare of each round.
Targets: ours / bare >= 0.35, p99 <= 20 ms, every 2xx stored.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if __name__ == "__main__":
    # bench/ itself off the path: its modules are imported as bench.*.
    sys.path[:] = [str(ROOT)] + [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]

from bench.poller import cpu_seconds  # noqa: E402
from bench.support import (  # noqa: E402
    SMOKE_HELP,
    free_port,
    percentile,
    sampled,
    smoke,
    stop,
    wait_ready,
)

SECRET = "whsec_" + base64.b64encode(b"bench-webhook-secret-0123456789a").decode()
OPERATIONS = 1000
BARE, CLIENT_CEILING = "bare", "client-ceiling"
SPY_OPTIONS = ("--rate", "200", "--format", "raw", "--nonblocking", "--gil")


# -- the servers -----------------------------------------------------------------------


def serve_ceiling(port: int) -> None:
    from bench.fast_http import Answer, Request, run, start_server

    def handle(request: Request) -> Answer:
        return Answer(204)

    async def main() -> None:
        async with await start_server(handle, "127.0.0.1", port) as listening:
            await listening.serve_forever()

    run(main)


def serve_bare(port: int) -> None:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    async def bare(request: Request) -> Response:
        await request.body()
        return Response(status_code=204)

    app = Starlette(
        routes=[
            Route("/webhooks/sim", bare, methods=["POST"]),
            Route("/healthz", bare, methods=["GET"]),
        ]
    )
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        loop="uvloop",
        http="httptools",
        log_level="warning",
        access_log=False,
    )


def serve_service(root: Path, db_url: str, port: int) -> None:
    """The service of the checkout ``root``, which ``measure`` put first on the path."""
    from tests.support.stack import sim_provider_table

    import reconciler

    served = Path(reconciler.__file__).resolve()
    if not served.is_relative_to((root / "service").resolve()):
        raise SystemExit(f"the service for {root} would be imported from {served}")
    from reconciler.api.server import Server, server_config, tune_process
    from reconciler.app import create_app
    from reconciler.config import ServerSettings, Settings
    from reconciler.runtime import Runtime

    # The provider is inline; the configured directory must exist: an empty one beside the
    # database, in the round's work directory, which the bench removes.
    empty = Path(db_url.removeprefix("sqlite:///")).parent / "providers"
    empty.mkdir(exist_ok=True)
    settings = Settings(
        database_url=db_url,
        providers_dir=str(empty),
        providers={"sim": sim_provider_table("http://127.0.0.1:9")},
        server=ServerSettings(host="127.0.0.1", port=port),
    )
    runtime = Runtime.build(settings, environ={"SIM_TOKEN": "x", "SIM_WEBHOOK_SECRETS": SECRET})
    app = create_app(runtime, background=False)
    config = server_config(app, settings, runtime)
    config.loop = "uvloop"
    config.log_level = "warning"
    tune_process()
    Server(config, runtime).run()


def seed(root: Path, db_url: str, operations: int) -> None:
    """The schema, and ``operations`` observed operations whose jobs the hints name."""
    code = f"""
import sys
sys.path[:0] = [{str(root / "service")!r}]
from datetime import UTC, datetime, timedelta
from reconciler.core import ids
from reconciler.core.canonical import request_fingerprint
from reconciler.core.records import new_operation
from reconciler.storage import migrate
from reconciler.storage.database import Database
from reconciler.storage.journal import Journal

db = Database({db_url!r})
migrate.upgrade(db)
journal = Journal()
now = datetime.now(UTC)
with db.write() as conn:
    for i in range({operations}):
        op = new_operation(
            id=ids.operation_id(now), provider="sim", caller="bench", request={{"i": i}},
            request_fingerprint=request_fingerprint("sim", {{"i": i}}),
            idempotency_token=ids.idempotency_token(), trace_id=ids.trace_id(),
            state="observing", remote_job_id=f"job_{{i}}", created_at=now, updated_at=now,
            create_deadline_at=now, deadline_at=now + timedelta(hours=1),
            max_status_requests=12, max_transport_failures=3,
            next_poll_at=now + timedelta(hours=1),
        )
        journal.insert(conn, op, actor="bench", cause="seed", now=now)
db.dispose()
"""
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root)


def count_events(db_url: str) -> int:
    import sqlalchemy as sa

    engine = sa.create_engine(db_url)
    with engine.connect() as conn:
        value = conn.execute(sa.text("SELECT count(*) FROM webhook_events")).scalar_one()
    engine.dispose()
    return int(value)


# -- the load ----------------------------------------------------------------------------


def write_requests(path: Path, count: int, prefix: str, hints: bool) -> None:
    """Pre-signed deliveries, one JSON line each (headers, body), signed with the
    standardwebhooks package."""
    from standardwebhooks.webhooks import Webhook

    hook = Webhook(SECRET)
    when = datetime.now(UTC)
    ts = str(int(when.timestamp()))
    with path.open("w") as out:
        for i in range(count):
            event_id = f"evt_{prefix}_{i:08d}"
            job = f"job_{i % OPERATIONS}" if hints else f"job_orphan_{prefix}_{i}"
            data = {"job_id": job, "state": "running"}
            body = json.dumps({"type": "job.running", "id": event_id, "data": data})
            headers = {
                "webhook-id": event_id,
                "webhook-timestamp": ts,
                "webhook-signature": hook.sign(event_id, when, body),
                "content-type": "application/json",
            }
            out.write(json.dumps([headers, body]) + "\n")


def client(port: int, requests: Path, connections: int, seconds: float, out: Path) -> None:
    """Drive one server for ``seconds``; write what it answered (statuses, latencies)."""
    from bench.fast_http import Poster, run

    deliveries = [json.loads(line) for line in requests.read_text().splitlines()]
    prepared = [(headers, body.encode()) for headers, body in deliveries]

    async def main() -> None:
        poster = Poster("127.0.0.1", port, connections)
        statuses: Counter[int] = Counter()
        latencies: list[float] = []
        ended = time.monotonic() + seconds
        cursor = iter(prepared)

        async def one_connection() -> None:
            while (now := time.monotonic()) < ended:
                item = next(cursor, None)
                if item is None:
                    statuses[-1] += 1  # ran out of distinct deliveries: raise --max-rate
                    return
                try:
                    status = await poster.post("/webhooks/sim", item[0], item[1])
                except (OSError, ConnectionError, asyncio.IncompleteReadError):
                    status = 0
                latencies.append(time.monotonic() - now)
                statuses[status] += 1

        started = time.monotonic()
        await asyncio.gather(*(one_connection() for _ in range(connections)))
        elapsed = time.monotonic() - started
        poster.close()
        summary = {
            "seconds": elapsed,
            "statuses": {str(k): v for k, v in statuses.items()},
            "p50_ms": percentile(latencies, 50) * 1000,
            "p99_ms": percentile(latencies, 99) * 1000,
        }
        out.write_text(json.dumps(summary))

    run(main)


# -- the driver --------------------------------------------------------------------------


@dataclass(frozen=True)
class Result:
    label: str
    rate: float
    p50_ms: float
    p99_ms: float
    statuses: dict[str, int]
    stored: int | None
    cpu_us: float  # the server's CPU (user + system) per answered request

    @property
    def ok(self) -> int:
        return sum(n for code, n in self.statuses.items() if 200 <= int(code) < 300)


def python_of(root: Path) -> str:
    own = root / ".venv" / "bin" / "python"
    return str(own) if own.exists() else sys.executable


def measure(
    label: str, root: Path | None, args: argparse.Namespace, work: Path, number: int
) -> Result:
    requests = work / f"{label}-{number}.jsonl"
    write_requests(requests, args.max_rate * args.seconds, f"{label}{number}", args.hints)
    mode = label if root is None else "reconciler"
    db_url = f"sqlite:///{work / f'{label}-{number}.db'}"
    if root is not None:
        seed(root, db_url, OPERATIONS if args.hints else 0)
    port = free_port()
    cmd = [python_of(root or ROOT), str(ROOT / "bench" / "webhooks.py"), "serve"]
    cmd += ["--mode", mode, "--root", str(root or ROOT), "--db", db_url, "--port", str(port)]
    log = (work / f"{label}-{number}.log").open("wb")
    tree = root or ROOT
    # The tree's package first from the interpreter's start: the bench's own helpers
    # import the service before ``serve_service`` could put the tree first on the path.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree / "service"), str(tree)])}
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log, env=env)
    out = work / f"{label}-{number}.json"
    try:
        try:
            wait_ready(f"http://127.0.0.1:{port}/healthz", timeout=60)
        except RuntimeError:
            sys.stderr.write((work / f"{label}-{number}.log").read_text())
            raise
        time.sleep(0.5)
        spy = None
        if args.py_spy is not None and root is not None:
            spy = args.py_spy / f"{label}-{number + 1}.txt"
        cpu0 = cpu_seconds(proc.pid)
        with sampled(proc.pid, spy, SPY_OPTIONS):
            load = [sys.executable, str(ROOT / "bench" / "webhooks.py"), "client"]
            load += ["--port", str(port), "--requests", str(requests), "--out", str(out)]
            load += ["--connections", str(args.connections), "--seconds", str(args.seconds)]
            subprocess.run(load, check=True, cwd=ROOT)
        cpu = cpu_seconds(proc.pid) - cpu0
    finally:
        stop(proc)
        log.close()
    data = json.loads(out.read_text())
    total = sum(n for code, n in data["statuses"].items() if int(code) > 0)
    stored = count_events(db_url) if root is not None else None
    rate = total / data["seconds"]
    cpu_us = cpu * 1e6 / max(1, total)
    return Result(label, rate, data["p50_ms"], data["p99_ms"], data["statuses"], stored, cpu_us)


def spread(values: list[float]) -> str:
    return (
        f"median {statistics.median(values):.2f} (min {min(values):.2f}, max {max(values):.2f}; "
        f"{', '.join(f'{v:.2f}' for v in values)})"
    )


def describe(number: int, result: Result) -> str:
    stored = ""
    if result.stored is not None:
        stored = f"  stored {result.stored} of {result.ok} 2xx"
        if result.stored < result.ok:
            stored += "  MISSING"
    return (
        f"  round {number + 1}  {result.label:<14} {result.rate:8.0f} req/s  "
        f"p50 {result.p50_ms:6.2f} ms  p99 {result.p99_ms:6.2f} ms  "
        f"CPU {result.cpu_us:5.0f} us/req  answers {result.statuses}{stored}"
    )


def part(command: str, argv: list[str]) -> int:
    """One process of the bench: a server or the load."""
    parser = argparse.ArgumentParser(prog=f"webhooks.py {command}")
    parser.add_argument("--port", type=int, required=True)
    if command == "serve":
        parser.add_argument("--mode", choices=[BARE, CLIENT_CEILING, "reconciler"])
        parser.add_argument("--root", type=Path, required=True)
        parser.add_argument("--db", required=True)
        parsed = parser.parse_args(argv)
        if parsed.mode == BARE:
            serve_bare(parsed.port)
        elif parsed.mode == CLIENT_CEILING:
            serve_ceiling(parsed.port)
        else:
            serve_service(parsed.root, parsed.db, parsed.port)
        return 0
    parser.add_argument("--requests", type=Path, required=True)
    parser.add_argument("--connections", type=int, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parsed = parser.parse_args(argv)
    client(parsed.port, parsed.requests, parsed.connections, parsed.seconds, parsed.out)
    return 0


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] in ("serve", "client"):
        return part(sys.argv[1], sys.argv[2:])
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=int, default=6)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--baseline", type=Path, action="append", default=[], help="a checkout to compare"
    )
    parser.add_argument("--hints", action="store_true", help="events for observed operations")
    parser.add_argument("--no-ceiling", action="store_true", help="skip the client's ceiling")
    parser.add_argument("--max-rate", type=int, default=15_000, help="deliveries per second")
    parser.add_argument("--py-spy", type=Path, default=None, help="sample each service into DIR")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args()
    smoke(args, seconds=1, rounds=1, no_ceiling=True, baseline=[])
    if args.py_spy is not None:
        args.py_spy.mkdir(parents=True, exist_ok=True)
    runs: list[tuple[str, Path | None]] = [("ours", ROOT)]
    for index, tree in enumerate(args.baseline):
        runs.append((f"baseline{index + 1 if len(args.baseline) > 1 else ''}", tree.resolve()))
    runs.append((BARE, None))
    if not args.no_ceiling:
        runs.append((CLIENT_CEILING, None))
    kind = "hints for 1000 observed operations" if args.hints else "orphan events"
    print(
        f"{args.connections} connections, {args.seconds} s per run, {kind}; SQLite (WAL); "
        f"{os.cpu_count()} CPUs, load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )
    work = Path(tempfile.mkdtemp(prefix="bench-webhooks-"))
    results: dict[str, list[Result]] = {label: [] for label, _ in runs}
    ratios: dict[str, list[float]] = {label: [] for label, root in runs if root is not None}
    try:
        for number in range(args.rounds):
            shift = number % len(runs)
            for label, root in runs[shift:] + runs[:shift]:
                results[label].append(measure(label, root, args, work, number))
                print(describe(number, results[label][-1]), flush=True)
            for label in ratios:
                ratios[label].append(results[label][-1].rate / results[BARE][-1].rate)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for label, rs in results.items():
        print(f"{label:<14} req/s  {spread([r.rate for r in rs])}")
        print(f"{'':<14} p99 ms {spread([r.p99_ms for r in rs])}")
        print(f"{'':<14} CPU us/req {spread([r.cpu_us for r in rs])}")
    for label, values in ratios.items():
        print(f"ratio {label}/bare: {spread(values)}; target >= 0.35, p99 <= 20 ms")
    missing = [r for rs in results.values() for r in rs if r.stored is not None and r.stored < r.ok]
    for r in missing:
        print(f"NOT STORED: {r.label} answered {r.ok} 2xx and stored {r.stored}")
    return 1 if missing else 0


if __name__ == "__main__":
    raise SystemExit(main())
