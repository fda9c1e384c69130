"""A real Ray head (``ray start --head --block``) on loopback, for the ``ray_jobs`` tests.

The head runs in its own session and process group with a temporary directory of
its own, every port Ray lets us choose picked free (two more through the
environment: the autoscaler's and the dashboard's metrics servers), one CPU and a
small object store. With the cluster switch off Ray keeps 127.0.0.1 as the node
address instead of replacing it with the machine's, and every server it starts
(GCS, raylet, the dashboard with the Jobs API, the agents, the metrics servers)
binds loopback only.

Stopping it stops the tree by PID (see ``proctree``): Ray's workers leave the
process group, so signalling the group would leave them running.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.support import loopback
from tests.support.proctree import stop_tree
from tests.support.servers import HOST, unused_port

# 10-20 s on an idle machine; 50 s was seen with the load average at six times the cores.
START_TIMEOUT_SECONDS = 150.0
# Ray refuses an object store under 75 MiB; the tests move no objects.
OBJECT_STORE_BYTES = 80 * 1024 * 1024
# A head that exits during startup is started again; one more try needs this much time.
START_ATTEMPTS = 3
MIN_ATTEMPT_SECONDS = 40.0


class RayUnavailable(RuntimeError):
    """Ray is not installed in this environment."""


class RayStartFailed(RuntimeError):
    """Ray is installed but its head did not come up; the message says why."""


@dataclass(frozen=True)
class RayHead:
    url: str  # the dashboard: Ray's Jobs REST API is served under /api/jobs/
    agent_url: str  # the head node's job agent
    pid: int
    temp_dir: Path
    log: Path

    def jobs(self) -> list[dict[str, object]]:
        """Every job the head knows (``GET /api/jobs/``)."""
        response = loopback.get(f"{self.url}/api/jobs/", timeout=10)
        response.raise_for_status()
        jobs: list[dict[str, object]] = response.json()
        return jobs

    def job(self, submission_id: str) -> httpx.Response:
        return loopback.get(f"{self.url}/api/jobs/{submission_id}", timeout=10)


def ray_executable() -> Path:
    """The ``ray`` command of the interpreter running the tests."""
    if importlib.util.find_spec("ray") is None:
        raise RayUnavailable('ray is not installed (pip install -e ".[test,ray]")')
    beside = Path(sys.executable).parent / "ray"
    found = beside if beside.exists() else shutil.which("ray")
    if found is None:
        raise RayUnavailable("the ray package is importable but its `ray` command is missing")
    return Path(found)


def choose_ports() -> dict[str, int]:
    """A free port for every port ``ray start`` lets us choose, by flag."""
    return {
        "--port": unused_port(),
        "--dashboard-port": unused_port(),
        "--object-manager-port": unused_port(),
        "--node-manager-port": unused_port(),
        "--ray-client-server-port": unused_port(),
        "--dashboard-agent-listen-port": unused_port(),
        "--dashboard-agent-grpc-port": unused_port(),
        "--runtime-env-agent-port": unused_port(),
        "--metrics-export-port": unused_port(),
    }


def head_command(ray: Path, temp_dir: Path, ports: dict[str, int]) -> list[str]:
    return [
        str(ray),
        "start",
        "--head",
        "--block",
        f"--node-ip-address={HOST}",
        f"--dashboard-host={HOST}",
        "--include-dashboard=true",
        "--num-cpus=1",
        "--num-gpus=0",
        f"--object-store-memory={OBJECT_STORE_BYTES}",
        "--disable-usage-stats",
        "--include-log-monitor=false",
        f"--temp-dir={temp_dir}",
        # Workers bind ports the kernel picks, instead of Ray's fixed 10002-19999.
        "--min-worker-port=0",
        "--max-worker-port=0",
        "--log-style=record",
        "--log-color=false",
        *(f"{flag}={port}" for flag, port in ports.items()),
    ]


def head_env(ray: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RECONCILER_", "RAY_"))}
    env.update(
        # Off, Ray keeps 127.0.0.1 as the node address (on, it swaps in the machine's).
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
        RAY_USAGE_STATS_ENABLED="0",
        # SIGTERM stops the head at once instead of first draining the node for Serve.
        RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0",
        AUTOSCALER_METRIC_PORT=str(unused_port()),
        DASHBOARD_METRIC_PORT=str(unused_port()),
        # A job's entrypoint `python ...` runs this interpreter (CI has no bare `python`).
        PATH=f"{ray.parent}{os.pathsep}{env.get('PATH', '')}",
        PYTHONUNBUFFERED="1",
    )
    return env


def answers(url: str) -> bool:
    try:
        loopback.get(url, timeout=2)
    except httpx.TransportError:
        return False
    return True


def wait_ready(
    proc: subprocess.Popen[bytes], url: str, agent_url: str, log: Path, timeout: float
) -> None:
    """Until the Jobs API answers 200 and the head node's job agent answers at all
    (bounded); raises RayStartFailed with the log's tail.

    The dashboard answers before the agent is up, and a job submitted then waits ten
    seconds for an agent and fails with 500 "No available agent to submit job".
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RayStartFailed(f"ray start exited with {proc.returncode}: {tail(log)}")
        try:
            jobs_api = loopback.get(f"{url}/api/jobs/", timeout=2).status_code == 200
        except httpx.TransportError:
            jobs_api = False
        if jobs_api and answers(agent_url):
            return
        time.sleep(0.2)
    raise RayStartFailed(f"the Ray Jobs API was not ready within {timeout:.0f} s: {tail(log)}")


def tail(log: Path, lines: int = 5) -> str:
    try:
        text = log.read_text("utf-8", errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return " | ".join(text[-lines:]) or "(empty log)"


@contextmanager
def ray_head(timeout: float = START_TIMEOUT_SECONDS) -> Iterator[RayHead]:
    """Start a Ray head, yield it once its Jobs API answers, stop its whole tree.

    Ray waits a fixed 30 s for its raylet to register with the GCS and then exits
    with "The current node timed out during startup"; on a machine loaded several
    times over that happens now and then, so a head that exits is started again (with
    fresh ports and directory) while the deadline lasts, at most ``START_ATTEMPTS``
    times. A head that is still starting at the deadline is not retried.
    """
    ray = ray_executable()
    deadline = time.monotonic() + timeout
    for attempt in range(1, START_ATTEMPTS + 1):
        with started_head(ray) as (proc, head):
            try:
                wait_ready(proc, head.url, head.agent_url, head.log, deadline - time.monotonic())
            except RayStartFailed:
                still_starting = proc.poll() is None
                last = attempt == START_ATTEMPTS
                if still_starting or last or deadline - time.monotonic() < MIN_ATTEMPT_SECONDS:
                    raise
                continue
            yield head
            return


@contextmanager
def started_head(ray: Path) -> Iterator[tuple[subprocess.Popen[bytes], RayHead]]:
    """One ``ray start --head`` in its own session; its tree is stopped on exit."""
    # Ray's socket paths live under the temp dir and must stay short (AF_UNIX: 107 bytes).
    temp_dir = Path(tempfile.mkdtemp(prefix="rayh-", dir="/tmp"))
    log = temp_dir / "head.log"
    ports = choose_ports()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            head_command(ray, temp_dir, ports),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=head_env(ray),
            start_new_session=True,
        )
    head = RayHead(
        url=f"http://{HOST}:{ports['--dashboard-port']}",
        agent_url=f"http://{HOST}:{ports['--dashboard-agent-listen-port']}/",
        pid=proc.pid,
        temp_dir=temp_dir,
        log=log,
    )
    try:
        yield proc, head
    finally:
        stop_tree(proc.pid, marker=str(temp_dir), grace_seconds=15.0)
        proc.wait(timeout=5)
        shutil.rmtree(temp_dir, ignore_errors=True)
