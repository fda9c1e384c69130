"""Completed operations per second with one replica and with two, on one PostgreSQL.

    python bench/replicas.py [--operations 500] [--rounds 2] [--postgres-url URL] [--smoke]

The topology of tests/integration/test_two_replicas.py: ``reconciler serve``
processes on one PostgreSQL, the simulated provider (in this process, its status
answers slowed by 50 ms), a round-robin webhook forwarder in front of the replicas,
the ``tests.support.hooks:record`` hook and a callback receiver. Each run gets a
fresh database; N operations (short jobs; webhooks normal, duplicated or lost) are
submitted as fast as the API takes them, alternating between the replicas, and
the run ends when every operation is in an end state with its completion handler
closed. Completed operations per second = N / (last completion - first submit).
Prints every run, the median per replica count and the ratio two/one.

Without ``--postgres-url`` a throw-away cluster is started (initdb + pg_ctl, as the
``postgres`` user when run as root, like deploy/local-replicas.sh) and removed after.
With it, the URL must allow CREATE DATABASE: each run clones a migrated template.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Run as a script, bench/ comes first on sys.path; its modules are imported as bench.*:
# leave only the repository's roots.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path[:0] = [str(ROOT), str(ROOT / "service")]

from bench.support import SMOKE_HELP, free_port, smoke  # noqa: E402
from tests.integration import test_two_replicas as topology  # noqa: E402
from tests.support import hooks  # noqa: E402
from tests.support.databases import PostgresFactory  # noqa: E402

from reconciler.storage.database import Database  # noqa: E402

FALLBACK_PGBIN = Path("/usr/lib/postgresql/15/bin")
COMPLETION_TIMEOUT = 600.0


# --- a throw-away PostgreSQL ---------------------------------------------------------


def _pgbin() -> Path:
    found = shutil.which("initdb")
    return Path(found).resolve().parent if found else FALLBACK_PGBIN


def _run_pg(cwd: Path, *args: str | Path, check: bool = True) -> None:
    """Run a PostgreSQL tool (bounded); as the postgres user when we are root, which
    PostgreSQL refuses to run as."""
    command = [str(a) for a in args]
    if os.geteuid() == 0:
        command = ["runuser", "-u", "postgres", "--", *command]
    subprocess.run(command, cwd=cwd, check=check, capture_output=True, timeout=120)


@dataclass(frozen=True)
class Postgres:
    url: str  # an admin URL (CREATE DATABASE allowed)
    data: Path | None = None  # the cluster's directory, when this script started it

    def cpu_seconds(self) -> float | None:
        """CPU time of the cluster so far: the postmaster, its reaped and its live children."""
        if self.data is None:
            return None
        try:
            postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
            own = _stat(postmaster)
        except (OSError, ValueError, IndexError):
            return None
        tick = os.sysconf("SC_CLK_TCK")
        total = sum(int(own[i]) for i in (11, 12, 13, 14)) / tick
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError, IndexError, ValueError):
                    fields = _stat(int(entry.name))
                    if int(fields[1]) == postmaster:
                        total += (int(fields[11]) + int(fields[12])) / tick
        return total


def _stat(pid: int) -> list[str]:
    """/proc/PID/stat after the command name: state, ppid, ... (utime is index 11)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


@contextlib.contextmanager
def throwaway_postgres() -> Iterator[Postgres]:
    """initdb + pg_ctl on 127.0.0.1 with a random password."""
    pgbin = _pgbin()
    root = Path(tempfile.mkdtemp(prefix="bench-replicas-pg."))
    data = root / "data"
    password = secrets.token_hex(16)
    pwfile = root / "pwfile"
    pwfile.write_text(password + "\n")
    pwfile.chmod(0o600)
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
        shutil.chown(pwfile, "postgres")
    port = free_port()
    try:
        _run_pg(root, pgbin / "initdb", "-D", data, "-U", "bench", f"--pwfile={pwfile}",
                "--auth-local=trust", "--auth-host=scram-sha-256", "--no-sync")  # fmt: skip
        pwfile.unlink()
        options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off"
        _run_pg(root, pgbin / "pg_ctl", "-D", data, "-l", root / "server.log", "-w", "-t", "60",
                "-o", options, "start")  # fmt: skip
        try:
            yield Postgres(f"postgresql+psycopg://bench:{password}@127.0.0.1:{port}/postgres", data)
        finally:
            _run_pg(root, pgbin / "pg_ctl", "-D", data, "-m", "fast", "-w", "stop", check=False)
    finally:
        shutil.rmtree(root, ignore_errors=True)


# --- one run ---------------------------------------------------------------------------


def _cpu_seconds(pid: int) -> float:
    fields = _stat(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Run:
    replicas: int
    operations: int
    seconds: float  # first submit to last completion
    submit_seconds: float
    replica_cpu: float  # CPU seconds of the service processes during the run
    bench_cpu: float  # this process: sim, forwarder, receiver, submitters
    postgres_cpu: float | None  # when this script started the cluster
    split: list[int]  # status reads per replica
    hook_runs_once: bool

    @property
    def per_second(self) -> float:
        return self.operations / self.seconds

    @property
    def cpu_ms_per_op(self) -> float:
        total = self.replica_cpu + self.bench_cpu + (self.postgres_cpu or 0.0)
        return 1000 * total / self.operations


def _status_reads_per_worker(db: Database, ids: list[str]) -> list[int]:
    entries = topology.histories(db)
    counts: dict[str, int] = {}
    for op_id in ids:
        for entry in entries[op_id]:
            if entry["cause"] == "status_read":
                counts[entry["actor"]] = counts.get(entry["actor"], 0) + 1
    return sorted(counts.values(), reverse=True)


def one_run(pg: Postgres, factory: PostgresFactory, replicas: int, operations: int) -> Run:
    url = factory.clone()
    tmp = Path(tempfile.mkdtemp(prefix="bench-replicas."))
    db = Database(url)
    try:
        with topology.replica_pair(tmp, url, replicas=replicas) as top:
            cpu0 = sum(_cpu_seconds(pid) for pid in top.pids)
            own0 = time.process_time()
            pg0 = pg.cpu_seconds()
            start = time.monotonic()
            ids = topology.submit(top, operations)
            submitted = time.monotonic()
            end = topology.wait_completed(db, ids, timeout=COMPLETION_TIMEOUT)
            replica_cpu = sum(_cpu_seconds(pid) for pid in top.pids) - cpu0
            bench_cpu = time.process_time() - own0
            pg1 = pg.cpu_seconds()
            pg_cpu = pg1 - pg0 if pg0 is not None and pg1 is not None else None
            runs = hooks.finished_by_key(top.hook_log)
            once = len(runs) == operations and set(runs.values()) == {1}
            split = _status_reads_per_worker(db, ids)
        return Run(replicas, operations, end - start, submitted - start, replica_cpu, bench_cpu,
                   pg_cpu, split, once)  # fmt: skip
    finally:
        db.dispose()
        factory.drop(url)
        shutil.rmtree(tmp, ignore_errors=True)


# --- report ----------------------------------------------------------------------------


def _ms(seconds: float | None, operations: int) -> str:
    return "n/a" if seconds is None else f"{1000 * seconds / operations:.0f} ms"


def _line(run: Run) -> str:
    n = run.operations
    return (
        f"  {run.replicas} replica(s): {run.per_second:5.1f} completed ops/s "
        f"({n} in {run.seconds:5.1f} s; all submitted after {run.submit_seconds:4.1f} s)\n"
        f"      CPU per operation: service {_ms(run.replica_cpu, n)}, "
        f"PostgreSQL {_ms(run.postgres_cpu, n)}, bench process {_ms(run.bench_cpu, n)}; "
        f"status reads per worker {run.split}; every hook ran once: {run.hook_runs_once}"
    )


EXPLANATION = """\
What limits the figure here: this machine has {cores} CPU cores, and everything shares
them: PostgreSQL, every replica, and this process (the simulated provider, the webhook
forwarder, the callback receiver, the submitting threads). Each operation costs about
{cpu} of CPU in all (create, status reads, webhooks, result collection, hook, callback
and a few dozen short transactions; split above), so the machine cannot complete more
than about {cores} cores / {cpu} = {ceiling} operations per second, however many replicas
run. A second replica adds no cores here, only a second process sharing the same ones,
so a ratio near 1 is expected; what the two-replica runs show is that two replicas on
one database work correctly side by side and split the work (status reads per worker,
every hook once). With replicas on their own cores or machines the ceiling moves with
them, until PostgreSQL becomes the limit. Jobs last 0.4-2.6 s and wait on webhooks or
polls, which adds latency per operation but does not bound the rate. Load average
(1, 5, 15 min) at start: {load_start}; at the end: {load_end}{busy}."""


def _explain(runs: list[Run], load_start: str) -> str:
    cores = os.cpu_count() or 1
    measured = [r for r in runs if r.postgres_cpu is not None]
    per_op = statistics.median(r.cpu_ms_per_op for r in measured or runs)
    cpu = f"{per_op:.0f} ms" + ("" if measured else " (without PostgreSQL, not measured)")
    busy = (
        " (the machine was busy with other work as well: the figures are below the ceiling)"
        if os.getloadavg()[1] > cores
        else ""
    )
    return EXPLANATION.format(
        cores=cores,
        cpu=cpu,
        ceiling=f"{1000 * cores / per_op:.0f}",
        load_start=load_start,
        load_end=_load(),
        busy=busy,
    )


def _load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--operations", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--postgres-url", help="an admin URL (CREATE DATABASE allowed)")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args()
    smoke(args, operations=10, rounds=1)
    load_start = _load()
    runs: dict[int, list[Run]] = {1: [], 2: []}
    with contextlib.ExitStack() as stack:
        pg = Postgres(args.postgres_url) if args.postgres_url else None
        pg = pg or stack.enter_context(throwaway_postgres())
        factory = PostgresFactory(pg.url)
        stack.callback(factory.close)
        print(f"{args.operations} operations per run, {args.rounds} round(s), fresh database each")
        for round_no in range(1, args.rounds + 1):
            print(f"round {round_no}:", flush=True)
            for replicas in (1, 2):
                run = one_run(pg, factory, replicas, args.operations)
                runs[replicas].append(run)
                print(_line(run), flush=True)
    one = statistics.median(r.per_second for r in runs[1])
    two = statistics.median(r.per_second for r in runs[2])
    print(f"median completed operations/s: one replica {one:.1f}, two replicas {two:.1f}; "
          f"ratio two/one {two / one:.2f}")  # fmt: skip
    print(_explain([*runs[1], *runs[2]], load_start))
    ok = all(r.hook_runs_once for rs in runs.values() for r in rs)
    ok = ok and all(len(r.split) == 2 and min(r.split) > 0 for r in runs[2])
    if not ok:
        print("CHECK FAILED: a hook ran other than once, or a replica did no status reads")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
