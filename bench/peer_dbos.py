"""reconciler against DBOS Transact doing the same job, on SQLite and on PostgreSQL.

    python bench/peer_dbos.py [--operations 1000] [--concurrency 32] [--duration 0.2]
        [--rounds 3] [--backends sqlite,postgresql] [--systems reconciler,dbos]
        [--dbos-polls 0.2,defaults]
        [--statements N] [--py-spy DIR] [--stages] [--keep] [--smoke]

The peer is the library a user would pick instead: a Starlette app on DBOS Transact 3.4,
as lean as a DBOS user writes it (``bench/peer_dbos_app.py``: one durable workflow per
operation on a DBOS queue; a step creates the job and keeps its id in a table of the
app's, where the webhook route finds the workflow; it waits for the webhook's message or
the fallback read, reads the status, fetches and checks the result and sends the signed
callback). It runs once per ``--dbos-polls`` entry: the queue polled every 0.2 s
(``dbos@0.2s``) and at DBOS's own defaults (``dbos@defaults``: every second), so it can
show where it is faster than us. Its CPU an operation is printed with what that makes
of one core (``ops/s a core``: the rate of a process held to one core by its own CPU),
as ours is. It runs in a virtualenv of its own, made on first use
under ``~/.cache/reconciler-bench/dbos-3.4.0`` (``$RECONCILER_BENCH_CACHE`` instead of
``~/.cache/reconciler-bench``), with ``dbos==3.4.0``, Starlette, uvicorn and httpx from
the package index.

Both systems get the same agent burst (``bench/throughput.py``'s submitter: ``--operations``
jobs, ``--concurrency`` at a time, each done ``--duration`` s after its create with one
signed webhook), the same provider (``bench/fast_provider.py``) and the same receiver
(which verifies every callback's signature), each run fresh. ``reconciler`` is
``reconciler serve`` with one no-op hook, exactly as ``bench/throughput.py`` runs it.

PostgreSQL: the bench starts its own PostgreSQL 15 cluster (``initdb`` and ``pg_ctl`` as
``bench/soak_infra.py`` runs them: loopback, a free port, fsync on as on a real server,
``shared_preload_libraries=pg_stat_statements``) and stops it at the end; every run gets
a database of its own in it. SQLite: a file per run (DBOS keeps its system database in
it too).

Per run: completed operations per second (first submission to the last callback at the
receiver), the service's CPU per operation (``/proc``, until every operation is recorded
done), and on PostgreSQL the server's CPU per operation (the postmaster and every
backend, background work included), commits (``pg_stat_database.xact_commit`` of the
run's database) and statements per operation (``pg_stat_statements`` calls in that
database, BEGIN and COMMIT included), counted until the service has stopped so that every
connection's counters are flushed. ``--statements N`` prints each system's N most
frequent statements per operation. Each run also prints how busy it kept the system's
process, that process's main thread (the event loop) and the whole machine, in cores over
the same window (``bench/support.py``'s ``BusyMeter``): whether the process ran out of an
interpreter's one core, the machine ran out of cores, or neither. Every run also prints
what the agent and the provider waited (``bench/stages.py``'s ``Waits``): the POST's
p50/p99, create -> callback p50/p90 (the POST sent to the callback's arrival at the
receiver), POSTs answered 503 and webhook deliveries refused, by status; ``--stages``
adds, for reconciler, where each operation waited inside the service
(``bench/stages.py``). Each round also runs the bare client of ``bench/throughput.py``
(the same provider and callback calls with no service: the ceiling both systems share)
and the provider's and the receiver's own ceilings. Printed:
every run, then medians over ``--rounds`` rounds, and reconciler / each DBOS run per
backend.
``--smoke``: a few operations, one round; it installs nothing, so DBOS runs only when a
full run made its virtualenv before (else it is skipped, saying so), and PostgreSQL is
skipped when its binaries are missing.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
for _path in (str(ROOT / "service"), str(ROOT)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import sqlalchemy as sa  # noqa: E402
from bench import stages  # noqa: E402
from bench import throughput as tp  # noqa: E402
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

DBOS_VERSION = "3.4.0"
DBOS_PACKAGES = (
    f"dbos=={DBOS_VERSION}",
    "starlette",
    "uvicorn[standard]",
    "httpx",
    "aiosqlite",  # the application database's async driver on SQLite
    "sniffio",  # without it httpcore looks for it on disk at every pooled request
)
PIP_QUIET = ("--disable-pip-version-check",)
API_TOKEN = "bench-dbos-token"
OURS, DBOS = "reconciler", "dbos"
DEFAULTS = "defaults"  # DBOS's own polling: its queue every second
STATS_SETTINGS = "-c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.max=5000"


# --- the peer's virtualenv ----------------------------------------------------------------


def dbos_python(timeout: float, build: bool = True) -> tuple[str | None, str]:
    """The DBOS virtualenv's Python, made (or completed) on first use: (path or None, why).

    ``build=False`` only takes one made earlier: a smoke run installs nothing."""
    cache = Path(os.environ.get("RECONCILER_BENCH_CACHE", Path.home() / ".cache/reconciler-bench"))
    venv = cache / f"dbos-{DBOS_VERSION}"
    python = venv / "bin" / "python"
    ready = venv / ".complete"  # the packages it was made with
    wanted = " ".join(DBOS_PACKAGES) + "\n"
    if ready.exists() and ready.read_text("utf-8") == wanted:
        return str(python), ""
    if not build:
        return None, f"no DBOS virtualenv at {venv} yet (a full run makes it)"
    try:
        if not python.exists():
            venv.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
        done = subprocess.run(
            [str(python), "-m", "pip", "install", "-q", *PIP_QUIET, *DBOS_PACKAGES],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"could not make {venv}: {exc}"
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        said = lines[-1] if lines else ""
        return None, f"pip could not install {' '.join(DBOS_PACKAGES)}: {said}"
    ready.write_text(wanted, "utf-8")
    return str(python), ""


# --- the PostgreSQL cluster and what it counts ---------------------------------------------


class Cluster:
    """The bench's own PostgreSQL 15, with pg_stat_statements."""

    def __init__(self) -> None:
        from bench.soak_infra import ThrowawayPostgres

        self.server = ThrowawayPostgres()
        self.admin = self.server.start(STATS_SETTINGS)
        self.engine = sa.create_engine(
            self.admin, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool
        )
        with self.engine.connect() as conn:
            conn.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        pid_file = self.server.data / "postmaster.pid"
        self.postmaster = int(pid_file.read_text().split()[0])

    def stop(self) -> None:
        self.engine.dispose()
        self.server.stop()

    def database(self) -> str:
        from bench.soak_infra import create_database

        return create_database(self.admin)

    def drop(self, url: str) -> None:
        from bench.soak_infra import drop_database

        drop_database(self.admin, url)

    def cpu(self) -> float:
        """CPU seconds of the whole server: the postmaster, its live children and the
        children it reaped (backends whose connection closed)."""
        ticks = os.sysconf("SC_CLK_TCK")
        total = 0.0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            pid, ppid = int(stat.parent.name), int(fields[1])
            if pid == self.postmaster:
                total += sum(int(f) for f in fields[11:15]) / ticks  # with reaped children
            elif ppid == self.postmaster:
                total += (int(fields[11]) + int(fields[12])) / ticks
        return total

    def counters(self, name: str) -> tuple[int, int]:
        """(commits, statements) of database ``name`` so far."""
        with self.engine.connect() as conn:
            commits = conn.execute(
                sa.text("SELECT xact_commit FROM pg_stat_database WHERE datname = :n"), {"n": name}
            ).scalar_one()
            calls = conn.execute(
                sa.text(
                    "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements s "
                    "JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = :n"
                ),
                {"n": name},
            ).scalar_one()
        return int(commits), int(calls)

    def top(self, name: str, limit: int) -> list[tuple[int, str]]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT calls, query FROM pg_stat_statements s JOIN pg_database d "
                    "ON d.oid = s.dbid WHERE d.datname = :n ORDER BY calls DESC LIMIT :k"
                ),
                {"n": name, "k": limit},
            ).all()
        return [(int(calls), " ".join(str(query).split())) for calls, query in rows]

    def reset(self) -> None:
        with self.engine.connect() as conn:
            conn.exec_driver_sql("SELECT pg_stat_statements_reset()")


@dataclass
class ServerMeter:
    """The server's CPU, commits and statements over one run (``throughput.Meter``)."""

    cluster: Cluster
    name: str = ""
    cpu: float = 0.0
    commits: int = 0
    statements: int = 0
    top: list[tuple[int, str]] = field(default_factory=list)
    _start: tuple[float, int, int] = (0.0, 0, 0)

    def begin(self, db_url: str) -> None:
        self.name = str(sa.make_url(db_url).database)
        self.cluster.reset()
        time.sleep(1.1)  # the setup's last counters flushed (a backend flushes each second)
        self._start = (self.cluster.cpu(), *self.cluster.counters(self.name))

    def finished(self) -> None:
        self.cpu = self.cluster.cpu() - self._start[0]

    def after_stop(self) -> None:
        time.sleep(0.5)  # the closed backends' last counters reach the view
        commits, statements = self.cluster.counters(self.name)
        self.commits = commits - self._start[1]
        self.statements = statements - self._start[2]
        self.top = self.cluster.top(self.name, 40)


# --- runs ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Result:
    system: str
    backend: str
    operations: int
    seconds: float
    cpu_ms: float
    server_ms: float | None = None
    commits: float | None = None
    statements: float | None = None
    missing: int = 0
    waits: stages.Waits | None = None
    busy: Busy | None = None

    @property
    def rate(self) -> float:
        return self.operations / self.seconds if self.seconds > 0 else float("nan")


def _from_meter(meter: ServerMeter | None, n: int) -> dict[str, float | None]:
    if meter is None:
        return {}
    return {
        "server_ms": meter.cpu * 1000 / n,
        "commits": meter.commits / n,
        "statements": meter.statements / n,
    }


def run_ours(
    backend: str, args: argparse.Namespace, cluster: Cluster | None, work: Path
) -> tuple[Result, ServerMeter | None]:
    dbs = tp.Databases(postgres=False)
    dbs.admin = cluster.admin if cluster is not None else None
    meter = ServerMeter(cluster) if cluster is not None and backend == "postgresql" else None
    spy = args.py_spy / f"{OURS}-{backend}-{time.time_ns()}.txt" if args.py_spy else None
    run = tp.run_ours(tp.Tree(OURS, ROOT), backend, args, dbs, work, spy, meter)
    n = max(1, run.operations)
    result = Result(
        OURS,
        backend,
        run.operations,
        run.seconds,
        run.cpu_ms or 0.0,
        missing=run.failed,
        waits=run.waits,
        busy=run.busy,
        **_from_meter(meter, n),  # type: ignore[arg-type]
    )
    return result, meter


def dbos_finished(db_url: str) -> int:
    """Operation workflows DBOS has recorded a success for."""
    engine = sa.create_engine(db_url, poolclass=sa.pool.NullPool)
    table = "workflow_status" if db_url.startswith("sqlite") else "dbos.workflow_status"
    try:
        with engine.connect() as conn:
            return int(
                conn.execute(
                    sa.text(
                        f"SELECT count(*) FROM {table} WHERE status = 'SUCCESS' AND name LIKE :n"
                    ),
                    {"n": "%operation"},
                ).scalar_one()
            )
    finally:
        engine.dispose()


def _whsec() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


def dbos_label(poll: str) -> str:
    """The name of a DBOS run by its polling: ``dbos@0.2s``, ``dbos@defaults``."""
    return f"{DBOS}@{poll}s" if poll != DEFAULTS else f"{DBOS}@{DEFAULTS}"


def run_dbos(
    backend: str,
    args: argparse.Namespace,
    cluster: Cluster | None,
    work: Path,
    python: str,
    poll: str,
) -> tuple[Result, ServerMeter | None]:
    with contextlib.ExitStack() as stack:
        if backend == "postgresql":
            assert cluster is not None
            db_url = cluster.database()
            stack.callback(cluster.drop, db_url)
            # DBOS takes a plain postgresql:// URL (its own driver is psycopg 3); the
            # application's table is in the same database.
            system_db = db_url.replace("postgresql+psycopg://", "postgresql://")
            app_db = db_url
        else:
            db_url = system_db = f"sqlite:///{work / 'dbos.sqlite'}"
            app_db = f"sqlite+aiosqlite:///{work / 'app.sqlite'}"
        port = free_port()
        provider, provider_url = tp.start_provider(work, port, args.provider_server)
        stack.callback(stop, provider)
        pool = tp.provider_limits(work, provider_url).max_connections or args.concurrency
        secret = _whsec()
        rcv, _ = stack.enter_context(tp.receiver(work, secret, args.receiver_server))
        cmd = ["bench/peer_dbos_app.py", "--port", str(port), "--database", system_db]
        cmd += ["--app-database", app_db]
        cmd += ["--provider", provider_url, "--pool", str(pool), "--poll", poll]
        env = {
            "SIM_TOKEN": tp.SIM_TOKEN,
            "SIM_WEBHOOK_SECRET": tp.webhook_secret(),
            "CALLBACK_SECRET": secret,
            "API_TOKEN": API_TOKEN,
            "PYTHONPATH": "",
        }
        app = tp.spawn(cmd, work / "dbos.log", env, python)
        stack.callback(stop, app)
        url = f"http://127.0.0.1:{port}"
        wait_ready(f"{url}/healthz", timeout=120)
        meter = ServerMeter(cluster) if cluster is not None and backend == "postgresql" else None
        label = dbos_label(poll)
        spy = args.py_spy / f"{label}-{backend}-{time.time_ns()}.txt" if args.py_spy else None
        with sampled(app.pid, spy, tp.SPY_OPTIONS):
            if meter is not None:
                meter.begin(db_url)
            cpu0 = cpu_seconds(app.pid)
            busy = BusyMeter(app.pid)
            started = time.time()
            timings: list[tuple[str, float, float, int]] = []
            answers = asyncio.run(tp.submit(url, API_TOKEN, args, f"{rcv}/cb", timings))
            created = sum(n for code, n in answers.items() if 200 <= code < 300)
            if created < args.operations:
                print(f"    submissions to {label} answered {dict(answers)}")
            stats = tp.await_callbacks(rcv, created, timeout=max(300, created))
            deadline = time.monotonic() + 60
            while dbos_finished(db_url) < created and time.monotonic() < deadline:
                time.sleep(0.05)
            cpu = cpu_seconds(app.pid) - cpu0
            busied = busy.stop()
            seen = tp.peer_waits(timings, rcv, provider_url)
            if meter is not None:
                meter.finished()
        stop(app)
        if meter is not None:
            meter.after_stop()
    if stats["rejected"]:
        print(f"    the receiver refused {stats['rejected']} deliveries of {label}")
    arrived = int(stats["distinct"])
    n = max(1, arrived)
    last = stats["last_at"] or time.time()
    result = Result(
        label,
        backend,
        arrived,
        last - started,
        cpu * 1000 / n,
        missing=args.operations - arrived,
        waits=seen,
        busy=busied,
        **_from_meter(meter, n),  # type: ignore[arg-type]
    )
    return result, meter


# --- report -------------------------------------------------------------------------------


def describe(r: Result) -> str:
    core = f" ({1000 / r.cpu_ms:.0f} ops/s a core)" if r.cpu_ms > 0 else ""
    parts = [f"{r.system:<14} {r.backend:<10} {r.rate:7.1f} ops/s  CPU {r.cpu_ms:5.1f} ms/op{core}"]
    if r.server_ms is not None:
        parts.append(
            f"server {r.server_ms:5.1f} ms/op  commits {r.commits:5.1f}/op  "
            f"statements {r.statements:5.1f}/op"
        )
    parts.append(f"({r.operations} in {r.seconds:.2f} s; load {os.getloadavg()[0]:.1f})")
    if r.missing:
        parts.append(f"MISSING {r.missing}")
    if r.waits is not None:
        parts.append(f"\n      {r.waits.describe()}")
    if r.busy is not None:
        parts.append(f"\n      {r.busy.describe()}")
    return "  ".join(parts)


def _med(values: list[float | None]) -> float:
    found = [v for v in values if v is not None]
    return statistics.median(found) if found else float("nan")


def _systems(results: list[Result]) -> list[str]:
    """reconciler first, then each DBOS run by its polling, in the order first run."""
    names = [OURS] if any(r.system == OURS for r in results) else []
    return names + list(dict.fromkeys(r.system for r in results if r.system != OURS))


def summary(results: list[Result], ceilings: list[tp.Run]) -> None:
    print("medians over rounds:")
    print(
        "  system         backend      ops/s  service CPU ms/op  server CPU ms/op  "
        "commits/op  statements/op"
    )
    medians: dict[tuple[str, str], float] = {}
    for backend in sorted({r.backend for r in results}, key=lambda b: b != "sqlite"):
        for system in _systems(results):
            mine = [r for r in results if (r.system, r.backend) == (system, backend)]
            if not mine:
                continue
            rate = medians[(system, backend)] = _med([r.rate for r in mine])
            cpu, server = _med([r.cpu_ms for r in mine]), _med([r.server_ms for r in mine])
            commits, statements = (
                _med([r.commits for r in mine]),
                _med([r.statements for r in mine]),
            )
            print(
                f"  {system:<14} {backend:<10} {rate:7.1f}  {cpu:17.1f}  {server:16.1f}"
                f"  {commits:10.1f}  {statements:13.1f}  ({1000 / cpu:4.0f} ops/s a core)"
            )
    print_waits(results)
    for system, backend in sorted(medians):
        if system != OURS and (OURS, backend) in medians:
            ratio = medians[(OURS, backend)] / medians[(system, backend)]
            print(f"  {backend}: reconciler / {system} {ratio:5.2f} (ops/s)")
    for kind, unit in ((tp.BARE, "ops/s"), (tp.PROVIDER, "ops/s"), (tp.RECEIVER, "callbacks/s")):
        rates = [c.rate for c in ceilings if c.label == kind]
        if rates:
            print(f"  ceiling: {kind:<9} {_med(list(rates)):7.1f} {unit}")


def print_waits(results: list[Result]) -> None:
    """Medians of what the agent and the provider waited (``bench/stages.py``)."""
    print(
        "  system         backend    POST p50/p99 ms  create->callback p50/p90 s  "
        "agent 503s  webhook deliveries refused (all rounds)"
    )
    for backend in sorted({r.backend for r in results}, key=lambda b: b != "sqlite"):
        for system in _systems(results):
            seen = [r.waits for r in results if (r.system, r.backend) == (system, backend)]
            found = [w for w in seen if w is not None]
            if not found:
                continue
            refused: dict[str, int] = {}
            for w in found:
                for code, n in w.webhooks_refused.items():
                    refused[code] = refused.get(code, 0) + n
            said = ", ".join(f"{n} x {code}" for code, n in sorted(refused.items())) or "none"
            print(
                f"  {system:<14} {backend:<10} "
                f"{_med([w.post_p50 * 1000 for w in found]):6.0f}/"
                f"{_med([w.post_p99 * 1000 for w in found]):<6.0f}    "
                f"{_med([w.callback_p50 for w in found]):10.2f}/"
                f"{_med([w.callback_p90 for w in found]):<6.2f}          "
                f"{sum(w.agent_refused for w in found):6d}  {said}"
            )


def print_top(meters: dict[str, ServerMeter], n: int, limit: int) -> None:
    for label, meter in meters.items():
        print(f"  {label}: most frequent statements, calls per operation (last round)")
        for calls, query in meter.top[:limit]:
            print(f"    {calls / max(1, n):6.2f}  {query[:150]}")


@dataclass
class Rounds:
    """Every run of the bench, round after round, the order rotating between rounds so
    that the load of a shared machine falls on each system alike."""

    args: argparse.Namespace
    backends: list[str]
    cluster: Cluster | None
    python: str | None  # the DBOS virtualenv's (None: DBOS skipped)
    results: list[Result] = field(default_factory=list)
    ceilings: list[tp.Run] = field(default_factory=list)
    meters: dict[str, ServerMeter] = field(default_factory=dict)

    def run(self, number: int) -> None:
        # A smoke run's few operations say nothing of the peers' ceilings: the bare client only.
        peers = [tp.BARE] if self.args.smoke else [tp.BARE, tp.PROVIDER, tp.RECEIVER]
        order: list[tuple[str, str]] = [(kind, "-") for kind in peers]
        for backend in self.backends:
            for system in self.args.systems:
                if system == OURS:
                    order.append((OURS, backend))
                elif system == DBOS and self.python:
                    order += [(f"{DBOS}:{poll}", backend) for poll in self.args.dbos_polls]
        shift = number % len(order)
        for kind, backend in order[shift:] + order[:shift]:
            with _work(self.args.keep) as work:
                if kind != OURS and not kind.startswith(DBOS):
                    ceiling = tp.run_bare("none", self.args, work, kind)
                    self.ceilings.append(ceiling)
                    print(f"  round {number + 1}  {tp.describe(ceiling, None)}")
                    continue
                if kind == OURS:
                    result, meter = run_ours(backend, self.args, self.cluster, work)
                else:
                    assert self.python is not None
                    poll = kind.partition(":")[2]
                    result, meter = run_dbos(
                        backend, self.args, self.cluster, work, self.python, poll
                    )
                self.results.append(result)
                if meter is not None:
                    self.meters[f"{result.system} {backend}"] = meter
                print(f"  round {number + 1}  {describe(result)}")


def _stop_on_signals() -> None:
    """SIGTERM, and SIGINT in a shell's background job (which ignores it), end the run
    through its ``finally`` blocks: the processes it started stopped, the cluster too."""

    def leave(signum: int, _: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, leave)
    signal.signal(signal.SIGINT, leave)


def main() -> int:
    _stop_on_signals()
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--operations", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--duration", type=float, default=0.2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument(
        "--dbos-polls",
        type=lambda text: [s.strip() for s in text.split(",") if s.strip()],
        default=["0.2", DEFAULTS],
        help="DBOS runs, one per queue polling interval in seconds ('defaults': DBOS's own)",
    )
    parser.add_argument(
        "--systems",
        type=lambda text: [s for s in text.split(",") if s],
        default=[OURS, DBOS],
        help="which to run (reconciler,dbos)",
    )
    parser.add_argument("--statements", type=int, default=0, help="print the N most frequent")
    parser.add_argument("--py-spy", type=Path, default=None, help="sample each service into DIR")
    parser.add_argument("--stages", action="store_true", help=tp.STAGES_HELP)
    parser.add_argument("--keep", action="store_true", help="keep each run's files")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    # What bench/throughput.py's pieces read.
    parser.set_defaults(
        provider_server="protocol",
        receiver_server="protocol",
        ceiling_clients=1,
        ceiling_client="raw",
    )
    args = parser.parse_args()
    smoke(args, operations=10, concurrency=5, duration=0.05, rounds=1)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if args.py_spy is not None:
        args.py_spy.mkdir(parents=True, exist_ok=True)
    python, why = dbos_python(timeout=900, build=not args.smoke)
    if python is None:
        if not args.smoke:
            print(f"DBOS unavailable: {why}")
            return 1
        print(f"DBOS skipped: {why}")
    cluster = None
    if "postgresql" in backends:
        try:
            cluster = Cluster()
        except RuntimeError as exc:
            if not args.smoke:
                raise
            print(f"PostgreSQL skipped: {exc}")
            backends.remove("postgresql")
    print(
        f"{args.operations} operations, {args.concurrency} at a time, jobs of {args.duration:g} s; "
        f"DBOS {DBOS_VERSION} (its queue polled: {', '.join(args.dbos_polls)}); "
        f"{os.cpu_count()} CPUs, load average "
        f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )
    rounds = Rounds(args, backends, cluster, python)
    try:
        for number in range(args.rounds):
            rounds.run(number)
    finally:
        if cluster is not None:
            cluster.stop()
    summary(rounds.results, rounds.ceilings)
    if args.statements:
        print_top(rounds.meters, args.operations, args.statements)
    return 0


@contextlib.contextmanager
def _work(keep: bool) -> Iterator[Path]:
    work = Path(tempfile.mkdtemp(prefix="bench-peer-"))
    try:
        yield work
    finally:
        if keep:
            print(f"    kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
