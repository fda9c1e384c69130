"""Operations per second through one service process, against a bare client's ceiling.

    python bench/throughput.py [--operations 1000] [--concurrency 64] [--duration 0.2]
        [--rounds 1] [--postgres] [--baseline TREE] [--py-spy DIR] [--keep]
    python bench/throughput.py frames FILE [--top 25]

Per round and backend (SQLite WAL file; PostgreSQL with ``--postgres``: a throw-away
database on ``$RECONCILER_TEST_POSTGRES_URL``, else a throw-away cluster as
``bench/soak_infra.py`` starts one), each run on a fresh database and a fresh simulated
provider (``python -m reconciler.demo.sim``, its own process):

* **ours**: one service process (``reconciler serve``, through
  ``bench/throughput_parts.py serve``) with one no-op completion hook. An agent submits
  ``--operations`` jobs (``POST /v1/operations``, at most ``--concurrency`` at a time),
  each succeeding ``--duration`` s after it is created, with one signed ``job.succeeded``
  webhook and a ``callback_url`` at the receiver (``bench/throughput_parts.py receiver``,
  its own process, which verifies every signature with the agent's own callback secret).
  The first fallback read is 15-30 s away, so the webhook drives each completion.
* **bare**: a plain client makes the same provider and receiver calls per operation
  (create, one status read, the result, one signed callback POST), ``--concurrency``
  operations at a time, against a fresh simulated provider and the same receiver.

Measured from the first submission until every callback arrived at the receiver (its
clock: the time the last distinct one came in). Printed per run: completed operations
per second and the ratio ours / bare (the bare run of the same round), the service's
CPU per operation (``/proc/<pid>/stat``, from the first submission until every
operation's completion is recorded), write transactions per operation
(``reconciler_write_transactions_total`` on ``/metrics``) and status reads per operation
(``reconciler_status_requests_total``), with the machine's load average. The bare run
prints its own CPU per operation (it runs in this process): what the same four outbound
calls cost in this HTTP stack with nothing else, a floor under the service's figure
(which adds the two inbound requests, the database and the completion bookkeeping).

``--tree TREE`` measures another checkout (with its own ``.venv``) instead of this one;
``--baseline TREE``: another checkout (e.g. a worktree at the commit before a change)
run as a third run in every round, the order rotating between
rounds, so that the load of a shared machine falls on both alike. ``--py-spy DIR``
samples each service run with py-spy (``pip install py-spy``) into raw collapsed stacks;
``frames FILE`` prints the top frames of one (self and inclusive share of samples).
Targets (SQLite, one process): ours / bare >= 0.5, <= 6 ms of service CPU and
<= 8 write transactions per operation; PostgreSQL: ours / bare >= 0.35.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# Run as a script, bench/ comes first on sys.path, and bench/mcp.py would then shadow the
# mcp package the service imports: leave only the repository's roots.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
for _path in (str(ROOT / "service"), str(ROOT)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import httpx  # noqa: E402
from bench.poller import cpu_seconds  # noqa: E402
from bench.support import free_port, stop, wait_ready  # noqa: E402

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
SECRET_LINE = re.compile(r"callback secret for .*: (whsec_\S+)")


@dataclass(frozen=True)
class Tree:
    """A checkout whose service is measured, with the Python of its own virtualenv."""

    label: str
    root: Path

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


def start_sim(work: Path, service_port: int | None) -> tuple[Any, str]:
    port = free_port()
    args = ["-m", "reconciler.demo.sim", "--port", str(port), "--token", SIM_TOKEN]
    args += ["--webhook-secret", webhook_secret()]
    if service_port is not None:
        args += ["--webhook-url", f"http://127.0.0.1:{service_port}/webhooks/sim"]
    sim = spawn(args, work / "sim.log")
    url = f"http://127.0.0.1:{port}"
    wait_ready(f"{url}/_sim/stats", timeout=60)
    return sim, url


@contextmanager
def receiver(work: Path, secret: str) -> Iterator[str]:
    port = free_port()
    proc = spawn(
        ["bench/throughput_parts.py", "receiver", "--port", str(port), "--secret", secret],
        work / "receiver.log",
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(f"{url}/stats", timeout=60)
        yield url
    finally:
        stop(proc)


def service_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECONCILER_")}
    env.update(
        SIM_TOKEN=SIM_TOKEN,
        SIM_WEBHOOK_SECRETS=webhook_secret(),
        RECONCILER_CALLBACK_SECRET=callback_secret(),
    )
    return env


def write_config(work: Path, db_url: str, sim_url: str, port: int) -> Path:
    from tests.support.process import _toml_value, provider_file

    providers = work / "providers"
    provider_file(providers, sim_url, **POLLING)
    lines = [
        f"database_url = {_toml_value(db_url)}",
        f"providers_dir = {_toml_value(str(providers))}",
        f"hooks = {_toml_value([HOOK])}",
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
        env=service_env(),
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
    text = httpx.get(f"{url}/metrics", timeout=60).text
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
    data: dict[str, Any] = httpx.get(f"{url}/stats", timeout=30).json()
    return data


def await_callbacks(url: str, count: int, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    stats = receiver_stats(url)
    while stats["distinct"] < count and time.monotonic() < deadline:
        time.sleep(0.05)
        stats = receiver_stats(url)
    return stats


async def submit(url: str, token: str, args: argparse.Namespace, callback: str) -> Counter[int]:
    """Every operation through ``POST /v1/operations``, ``--concurrency`` at a time."""
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
                    try:
                        response = await client.post("/v1/operations", json=body, headers=headers)
                    except httpx.TransportError:
                        if attempt + 1 < SUBMIT_TRIES:
                            answers[RESENT] += 1
                            continue
                        answers[0] += 1
                    else:
                        answers[response.status_code] += 1
                    break

        await asyncio.gather(*(one(i) for i in range(args.operations)))
    return answers


@contextmanager
def sampled(pid: int, out: Path | None) -> Iterator[None]:
    """py-spy samples of ``pid`` while the block runs (raw collapsed stacks in ``out``)."""
    if out is None:
        yield
        return
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    options = ["--rate", "200", "--format", "raw", "--nonblocking", "--threads", "--gil"]
    proc = subprocess.Popen(
        [spy, "record", "--pid", str(pid), "--output", str(out), *options],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.5)  # attached before the first submission
        yield
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def run_ours(
    tree: Tree,
    backend: str,
    args: argparse.Namespace,
    dbs: Databases,
    work: Path,
    spy: Path | None,
) -> Run:
    with dbs.fresh(backend, work) as db_url:
        port = free_port()
        sim, sim_url = start_sim(work, port)
        try:
            config = write_config(work, db_url, sim_url, port)
            token, secret = prepare(tree, config)
            with receiver(work, secret) as rcv:
                cmd = ["bench/throughput_parts.py", "serve", "--root", str(tree.root)]
                cmd += ["--config", str(config)]
                service = spawn(cmd, work / "service.log", service_env(), tree.python)
                url = f"http://127.0.0.1:{port}"
                try:
                    wait_ready(f"{url}/readyz", timeout=120)
                    writes0, reads0 = scrape(url)
                    with sampled(service.pid, spy):
                        cpu0 = cpu_seconds(service.pid)
                        started = time.time()
                        answers = asyncio.run(submit(url, token, args, f"{rcv}/cb"))
                        created = sum(n for code, n in answers.items() if 200 <= code < 300)
                        if created < args.operations or answers[RESENT]:
                            # 0: no answer after every try; -1: sent again after no answer
                            print(f"    submissions of {tree.label} answered {dict(answers)}")
                        stats = await_callbacks(rcv, created, timeout=max(300, created))
                        deadline = time.monotonic() + 60
                        while finished(db_url) < created and time.monotonic() < deadline:
                            time.sleep(0.05)
                        cpu = cpu_seconds(service.pid) - cpu0
                    writes1, reads1 = scrape(url)
                finally:
                    stop(service)
        finally:
            stop(sim)
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
        cpu_ms=cpu * 1000 / n,
        writes=(writes1 - writes0) / n,
        reads=(reads1 - reads0) / n,
        failed=args.operations - arrived,
    )


async def bare_client(sim_url: str, rcv: str, secret: str, args: argparse.Namespace) -> int:
    """The same calls per operation as the service makes, without the service."""
    import json

    from reconciler.core.signatures import decode_whsec, sign_standard_webhook

    key = decode_whsec(secret)
    headers = {"Authorization": f"Bearer {SIM_TOKEN}"}
    limits = httpx.Limits(max_connections=args.concurrency, max_keepalive_connections=None)
    gate = asyncio.Semaphore(args.concurrency)
    done = 0
    async with (
        httpx.AsyncClient(base_url=sim_url, timeout=60, limits=limits, headers=headers) as sim,
        httpx.AsyncClient(timeout=60, limits=limits) as out,
    ):

        async def call(client: httpx.AsyncClient, method: str, url: str, **kw: Any) -> Any:
            # A loaded machine drops a kept-alive connection now and then: every call here
            # is safe to repeat (the create carries its idempotency key).
            for attempt in range(5):
                try:
                    return await client.request(method, url, **kw)
                except httpx.TransportError:
                    if attempt == 4:
                        raise
                    await asyncio.sleep(0.05)
            raise AssertionError("unreachable")

        async def one(index: int) -> None:
            nonlocal done
            request = {"scenario": "success", "duration": 0, "webhooks": "never", "n": index}
            async with gate:
                created = await call(
                    sim, "POST", "/v1/jobs", json=request, headers={"Idempotency-Key": f"b{index}"}
                )
                job_id = created.json()["job_id"]
                status = (await call(sim, "GET", f"/v1/jobs/{job_id}")).json()
                result = (await call(sim, "GET", f"/v1/jobs/{job_id}/result")).json()
                op_id = f"op_bare_{index}"
                event = {
                    "type": "operation.completed",
                    "operation": {
                        "id": op_id,
                        "provider": "sim",
                        "state": "succeeded",
                        "done": True,
                        "remote_job_id": job_id,
                        "remote_state": status.get("state"),
                        "message": "The job SUCCEEDED and its result was verified.",
                        "result": {"summary": result.get("summary")},
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
                    f"{rcv}/cb",
                    content=body,
                    headers={**signed, "content-type": "application/json"},
                )
                if answer.status_code == 204:
                    done += 1

        await asyncio.gather(*(one(i) for i in range(args.operations)))
    return done


def run_bare(backend: str, args: argparse.Namespace, work: Path) -> Run:
    sim, sim_url = start_sim(work, None)
    secret = callback_secret()
    try:
        with receiver(work, secret) as rcv:
            started = time.time()
            # The bare client runs in this process: its CPU is this process's, and it shows
            # what the same outbound calls cost in this HTTP stack with nothing else.
            cpu0 = time.process_time()
            done = asyncio.run(bare_client(sim_url, rcv, secret, args))
            cpu = time.process_time() - cpu0
            stats = await_callbacks(rcv, done, timeout=60)
    finally:
        stop(sim)
    last = stats["last_at"] or time.time()
    if stats["rejected"]:
        raise RuntimeError(f"the receiver refused {stats['rejected']} bare callbacks")
    arrived = int(stats["distinct"])
    return Run("bare", backend, arrived, last - started, cpu_ms=cpu * 1000 / max(1, arrived))


# --- report ------------------------------------------------------------------------------


def describe(run: Run, bare: Run | None) -> str:
    ratio = (
        f"  ours/bare {run.rate / bare.rate:5.2f}" if bare is not None and run is not bare else ""
    )
    parts = [f"{run.label:<10} {run.backend:<10} {run.rate:7.1f} ops/s{ratio}"]
    if run.cpu_ms is not None:
        parts.append(f"CPU {run.cpu_ms:5.1f} ms/op")
    if run.writes is not None:
        parts.append(f"writes {run.writes:5.2f}/op")
    if run.reads is not None:
        parts.append(f"status reads {run.reads:4.2f}/op")
    parts.append(f"({run.operations} in {run.seconds:.2f} s; load {os.getloadavg()[0]:.1f})")
    if run.failed:
        parts.append(f"MISSING {run.failed}")
    return "  ".join(parts)


def summary(runs: list[Run], bares: dict[tuple[str, int], Run]) -> None:
    print("medians over rounds:")
    keys = sorted({(r.label, r.backend) for r in runs if r.label != "bare"})
    for label, backend in keys:
        mine = [r for r in runs if (r.label, r.backend) == (label, backend)]
        ratios = [
            r.rate / bares[(backend, i)].rate
            for i, r in enumerate(mine)
            if (backend, i) in bares and bares[(backend, i)].rate > 0
        ]
        bare = [b.rate for (be, _), b in bares.items() if be == backend]

        def med(values: list[float | None]) -> float:
            found = [v for v in values if v is not None]
            return statistics.median(found) if found else float("nan")

        print(
            f"  {label:<10} {backend:<10} {med([r.rate for r in mine]):7.1f} ops/s "
            f"(bare {med(list(bare)):6.1f})  ours/bare {med(list(ratios)):5.2f}  "
            f"CPU {med([r.cpu_ms for r in mine]):5.1f} ms/op  "
            f"writes {med([r.writes for r in mine]):5.2f}/op  "
            f"status reads {med([r.reads for r in mine]):4.2f}/op"
        )


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


def main() -> int:
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
    parser.add_argument("--no-bare", action="store_true")
    parser.add_argument("--py-spy", type=Path, default=None, help="sample the service into DIR")
    parser.add_argument("--keep", action="store_true", help="keep each run's files")
    args = parser.parse_args()
    trees = [Tree(args.label, args.tree.resolve())]
    if args.baseline is not None:
        trees.append(Tree("baseline", args.baseline.resolve()))
    backends = (["sqlite"] if args.sqlite else []) + (["postgresql"] if args.postgres else [])
    if args.py_spy is not None:
        args.py_spy.mkdir(parents=True, exist_ok=True)
    print(
        f"{args.operations} operations, {args.concurrency} at a time, jobs of "
        f"{args.duration:g} s, one hook and one callback each; {os.cpu_count()} CPUs, "
        f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )
    runs: list[Run] = []
    bares: dict[tuple[str, int], Run] = {}
    with Databases(args.postgres) as dbs:
        for number in range(args.rounds):
            for backend in backends:
                order: list[Tree | None] = [*trees] + ([] if args.no_bare else [None])
                shift = number % len(order)
                order = order[shift:] + order[:shift]
                for tree in order:
                    work = Path(tempfile.mkdtemp(prefix="bench-throughput-"))
                    try:
                        if tree is None:
                            run = run_bare(backend, args, work)
                            bares[(backend, number)] = run
                        else:
                            spy = None
                            if args.py_spy is not None:
                                spy = args.py_spy / f"{tree.label}-{backend}-{number + 1}.txt"
                            run = run_ours(tree, backend, args, dbs, work, spy)
                            runs.append(run)
                    finally:
                        if args.keep:
                            print(f"    kept {work}")
                        else:
                            with contextlib.suppress(OSError):
                                shutil.rmtree(work)
                    print(f"  round {number + 1}  {describe(run, bares.get((backend, number)))}")
    summary(runs, bares)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
