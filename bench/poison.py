"""Poison operations beside healthy ones: what they cost the service and the healthy work.

    python bench/poison.py [--poison raise] [--poisoned 12] [--healthy 80] [--window 30]
                           [--postgres] [--service-path DIR]

A real service process (``python -m reconciler serve``, SQLite by default; ``--postgres``
uses ``RECONCILER_TEST_POSTGRES_URL``) against the poison provider on loopback
(``tests/support/poison_provider.py``), in three runs, each on a fresh database:

1. ``poison``: ``--poisoned`` poison operations alone for ``--window`` seconds: the
   service's CPU (cores, from /proc), its log lines and tracebacks, and the attempts each
   poison operation made (status requests the provider counted), against an idle
   service over the same window;
2. ``baseline``: ``--healthy`` healthy operations started at a steady rate: p50 and p99
   of create -> end state (the operation's own timestamps);
3. ``loaded``: the same healthy load with the poison operations started first.

Prints the healthy p99 ratio loaded / baseline (target <= 1.2) and the poison CPU
(target < 0.1 core). ``--service-path`` runs the service from another source tree (the
``service`` directory of an older commit) to measure the code before a change.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

sys.path[:0] = [
    str(Path(__file__).resolve().parents[1]),
    str(Path(__file__).resolve().parents[1] / "service"),
]

import httpx  # noqa: E402
import sqlalchemy as sa  # noqa: E402
from bench.support import ROOT, free_port, percentile, reconciler_serving  # noqa: E402
from tests.support.poison_provider import (  # noqa: E402
    PoisonProvider,
    write_service_config,
)
from tests.support.servers import serve_asgi  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User and system CPU of ``pid`` so far (its threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


@dataclass
class Service:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path
    token: str

    def lines(self) -> tuple[int, int]:
        text = self.log.read_text("utf-8", errors="replace")
        return text.count("\n"), text.count("Traceback")


@contextmanager
def service(work: Path, provider_url: str, db_url: str, source: Path | None) -> Iterator[Service]:
    port = free_port()
    config = write_service_config(work / "reconciler.toml", db_url, provider_url, port)
    path = [str(source)] if source is not None else []
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECONCILER_")}
    env["PYTHONPATH"] = os.pathsep.join([*path, str(ROOT), str(ROOT / "service")])
    log = work / "service.log"
    with reconciler_serving(config, port, env, log) as (url, token, proc):
        yield Service(proc, url, log, token)


@contextmanager
def database(work: Path, postgres: bool) -> Iterator[str]:
    """A SQLite file in ``work``, or a PostgreSQL database of its own, dropped afterwards."""
    if not postgres:
        yield f"sqlite:///{work / 'reconciler.db'}"
        return
    admin_url = os.environ["RECONCILER_TEST_POSTGRES_URL"]
    name = f"poison_bench_{os.getpid()}_{work.name.replace('-', '_')}"
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    try:
        yield sa.make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def start(client: httpx.Client, svc: Service, request: dict[str, object]) -> str:
    response = client.post(
        f"{svc.url}/v1/operations",
        json={"provider": "poison", "request": request},
        headers={"Authorization": f"Bearer {svc.token}"},
    )
    response.raise_for_status()
    op_id: str = response.json()["id"]
    return op_id


def view(client: httpx.Client, svc: Service, op_id: str) -> dict[str, object]:
    response = client.get(
        f"{svc.url}/v1/operations/{op_id}", headers={"Authorization": f"Bearer {svc.token}"}
    )
    response.raise_for_status()
    found: dict[str, object] = response.json()
    return found


@dataclass
class Run:
    latencies: list[float]
    cpu_cores: float
    log_lines: int
    tracebacks: int
    attempts: list[int]
    states: dict[str, int]


def run(args: argparse.Namespace, *, healthy: int, poisoned: int, window: float) -> Run:
    work = Path(tempfile.mkdtemp(prefix="poison-"))
    provider = PoisonProvider()
    with database(work, args.postgres) as db_url, serve_asgi(provider.app) as provider_url:
        provider.base_url = provider_url
        with (
            service(work, provider_url, db_url, args.service_path) as svc,
            httpx.Client(timeout=30) as client,
        ):
            lines_before, _ = svc.lines()
            cpu_before, wall_before = cpu_seconds(svc.proc.pid), time.monotonic()
            poison_ids = [start(client, svc, {"poison": args.poison}) for _ in range(poisoned)]
            healthy_ids: list[str] = []

            def load() -> None:
                with httpx.Client(timeout=30) as own:
                    for _ in range(healthy):
                        healthy_ids.append(start(own, svc, {"duration": 0.5}))
                        time.sleep(1.0 / args.rate)

            loader = threading.Thread(target=load)
            loader.start()
            loader.join()
            deadline = time.monotonic() + max(window, 120.0)
            while time.monotonic() < deadline:
                if all(view(client, svc, i)["done"] for i in healthy_ids):
                    break
                time.sleep(0.5)
            left = window - (time.monotonic() - wall_before)
            if left > 0:
                time.sleep(left)
            cpu = cpu_seconds(svc.proc.pid) - cpu_before
            wall = time.monotonic() - wall_before
            lines_after, tracebacks = svc.lines()
            latencies = []
            for op_id in healthy_ids:
                op = view(client, svc, op_id)
                if op["done_at"]:
                    done = datetime.fromisoformat(str(op["done_at"]))
                    latencies.append(
                        (done - datetime.fromisoformat(str(op["created_at"]))).total_seconds()
                    )
            states: dict[str, int] = {}
            attempts = []
            for op_id in poison_ids:
                op = view(client, svc, op_id)
                key = str(op["state"])
                escalation = op.get("escalation")
                if isinstance(escalation, dict):
                    key += f"/{escalation['reason']}"
                states[key] = states.get(key, 0) + 1
                job = op.get("remote_job_id")
                attempts.append(provider.of_job(str(job)) if job else 0)
    if os.environ.get("POISON_BENCH_KEEP"):
        print(f"kept {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return Run(latencies, cpu / wall, lines_after - lines_before, tracebacks, attempts, states)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--poison", default="raise")
    parser.add_argument("--poisoned", type=int, default=12)
    parser.add_argument("--healthy", type=int, default=80)
    parser.add_argument("--rate", type=float, default=8.0, help="healthy starts a second")
    parser.add_argument("--window", type=float, default=30.0)
    parser.add_argument("--postgres", action="store_true")
    parser.add_argument("--service-path", type=Path, default=None)
    parser.add_argument("--poison-only", action="store_true", help="skip the healthy runs")
    parser.add_argument(
        "--smoke", action="store_true", help="a few operations for a few seconds: proves it runs"
    )
    args = parser.parse_args()
    if args.smoke:
        args.poisoned, args.window, args.poison_only = 2, 2.0, True

    idle = run(args, healthy=0, poisoned=0, window=args.window)
    poison = run(args, healthy=0, poisoned=args.poisoned, window=args.window)
    if args.poison_only:
        print(f"poison {args.poison!r} x{args.poisoned}, window {args.window:.0f} s")
        print(
            f"  {poison.cpu_cores - idle.cpu_cores:+.3f} cores over idle, {poison.log_lines} log "
            f"lines, {poison.tracebacks} tracebacks, provider requests per op "
            f"{min(poison.attempts, default=0)}-{max(poison.attempts, default=0)}, "
            f"ended {poison.states}"
        )
        return
    base = run(args, healthy=args.healthy, poisoned=0, window=0)
    loaded = run(args, healthy=args.healthy, poisoned=args.poisoned, window=0)

    print(f"poison {args.poison!r} x{args.poisoned}, window {args.window:.0f} s")
    print(f"  idle service:    {idle.cpu_cores:.3f} cores, {idle.log_lines} log lines")
    print(
        f"  poison alone:    {poison.cpu_cores:.3f} cores "
        f"({poison.cpu_cores - idle.cpu_cores:+.3f} over idle), {poison.log_lines} log lines, "
        f"{poison.tracebacks} tracebacks"
    )
    print(
        f"  provider requests per poison op: "
        f"min {min(poison.attempts, default=0)} max {max(poison.attempts, default=0)}; "
        f"ended {poison.states}"
    )
    for name, r in (("baseline", base), ("loaded", loaded)):
        print(
            f"  healthy {name:8s}: {len(r.latencies)}/{args.healthy} done, "
            f"p50 {percentile(r.latencies, 50):.3f} s, p99 {percentile(r.latencies, 99):.3f} s"
        )
    ratio = percentile(loaded.latencies, 99) / percentile(base.latencies, 99)
    print(f"  healthy p99 ratio loaded/baseline: {ratio:.2f} (target <= 1.2)")
    print(f"  poison CPU: {poison.cpu_cores - idle.cpu_cores:.3f} cores (target < 0.1)")


if __name__ == "__main__":
    main()
