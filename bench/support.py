"""Shared pieces of the benchmarks: free ports, readiness waits, wrk runs, percentiles."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from tests.support import loopback

ROOT = Path(__file__).resolve().parents[1]
# Every bench takes ``--smoke`` (tests/integration/test_bench_smoke.py runs each so): a run
# of a few seconds that only proves the bench still works.
SMOKE_HELP = (
    "a run of a few seconds that proves the bench still works: tiny sizes, figures printed "
    "but no target judged (the exit status says only whether the run itself went wrong)"
)


def smoke(args: Any, **small: Any) -> None:
    """With ``--smoke``, set ``small`` over the parsed arguments."""
    if args.smoke:
        for name, value in small.items():
            setattr(args, name, value)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def wait_ready(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if loopback.get(url, timeout=1.0).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{url} did not become ready within {timeout} s")


def start(args: Sequence[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


@contextmanager
def reconciler_serving(
    config: Path, port: int, env: dict[str, str], log: Path
) -> Iterator[tuple[str, str, subprocess.Popen[bytes]]]:
    """``reconciler serve --config CONFIG`` (its schema upgraded first, an agent token made,
    its output in ``log``) until the block ends; yields (its URL, the token, the process)."""
    argv = [sys.executable, "-m", "reconciler"]
    for args in (["db", "upgrade"], ["tokens", "create", "--name", "bench", "--scope", "agent"]):
        made = subprocess.run(
            [*argv, *args, "--config", str(config)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )
    token = made.stdout.strip()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*argv, "serve", "--config", str(config)], cwd=ROOT, env=env, stdout=out, stderr=out
        )
    try:
        wait_ready(f"http://127.0.0.1:{port}/readyz", timeout=120)
        yield f"http://127.0.0.1:{port}", token, proc
    finally:
        stop(proc)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop a process a bench started, by its PID: SIGTERM, then SIGKILL after 10 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@contextmanager
def sampled(pid: int, out: Path | None, options: Sequence[str]) -> Iterator[None]:
    """py-spy samples of ``pid`` while the block runs (raw collapsed stacks in ``out``)."""
    if out is None:
        yield
        return
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    proc = subprocess.Popen(
        [spy, "record", "--pid", str(pid), "--output", str(out), *options],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.5)  # attached before the first request
        yield
    finally:
        proc.send_signal(signal.SIGINT)  # py-spy writes its samples out on SIGINT
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@dataclass(frozen=True)
class Busy:
    """How many cores a process, its main thread (the event loop of an asyncio server) and
    the whole machine kept busy over one window; and how long the process's threads were
    ready to run but waited for a core (thread-seconds a second: a process busy 0.75 whose
    threads also waited 0.75 was held back by the machine's cores, not by its own work)."""

    process: float
    main_thread: float
    machine: float
    waiting: float | None = None  # None: the kernel keeps no scheduler statistics

    def describe(self) -> str:
        waited = ""
        if self.waiting is not None:
            waited = f", its threads waiting for a core {self.waiting:.2f}"
        return (
            f"busy: process {self.process:.2f} core (main thread {self.main_thread:.2f})"
            f"{waited}, machine {self.machine:.2f} of {os.cpu_count()}"
        )


def cpu_ticks(stat: str) -> int:
    """utime + stime, in clock ticks, of the process or thread whose /proc stat file this is."""
    fields = Path(stat).read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def run_delay(task: Path) -> float | None:
    """Seconds the thread whose /proc directory this is spent ready to run but waiting for
    a core (``schedstat``'s second field); None without scheduler statistics."""
    try:
        return int((task / "schedstat").read_text().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def _process_run_delay(pid: int) -> float | None:
    """``run_delay`` summed over the process's threads now (None without statistics)."""
    try:
        delays = [run_delay(task) for task in Path(f"/proc/{pid}/task").iterdir()]
    except OSError:
        return None
    known = [d for d in delays if d is not None]
    return sum(known) if known else None


def _machine_ticks() -> tuple[int, int]:
    """All CPUs' ticks so far, and the idle ones among them (idle + iowait)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(values), values[3] + values[4]


class BusyMeter:
    """``Busy`` from the moment it is made to ``stop()``, read from /proc (Linux only).

    What a ratio of CPU per operation cannot say: whether the process ran out of cores
    (its threads share one interpreter) or the machine did (everything on it shares the
    same cores), or neither and the run waited on something else."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._start = self._read()

    def _read(self) -> tuple[float, int, int, tuple[int, int], float | None]:
        return (
            time.monotonic(),
            cpu_ticks(f"/proc/{self.pid}/stat"),
            cpu_ticks(f"/proc/{self.pid}/task/{self.pid}/stat"),
            _machine_ticks(),
            _process_run_delay(self.pid),
        )

    def stop(self) -> Busy | None:
        try:
            end = self._read()
        except (OSError, ValueError, IndexError):
            return None  # the process is gone, or no /proc
        wall = end[0] - self._start[0]
        tick = os.sysconf("SC_CLK_TCK")
        total = end[3][0] - self._start[3][0]
        idle = end[3][1] - self._start[3][1]
        if wall <= 0 or total <= 0:
            return None
        cpus = os.cpu_count() or 1
        waited = None
        if end[4] is not None and self._start[4] is not None:
            waited = max(0.0, end[4] - self._start[4]) / wall
        return Busy(
            process=(end[1] - self._start[1]) / tick / wall,
            main_thread=(end[2] - self._start[2]) / tick / wall,
            machine=cpus * (total - idle) / total,
            waiting=waited,
        )


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


@dataclass(frozen=True)
class WrkResult:
    requests_per_second: float
    p50_ms: float
    p99_ms: float
    requests: int
    non_2xx: int
    errors: int
    answers: str = ""


_UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0}


def _ms(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s)", text.strip())
    if match is None:
        raise ValueError(f"cannot read wrk latency {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2)]


def have_wrk() -> bool:
    return shutil.which("wrk") is not None


def run_wrk(
    url: str, script: Path, *, seconds: int, connections: int, threads: int = 1
) -> WrkResult:
    out = subprocess.run(
        [
            "wrk",
            f"-t{threads}",
            f"-c{connections}",
            f"-d{seconds}s",
            "--latency",
            "-s",
            str(script),
            url,
        ],
        capture_output=True,
        text=True,
        timeout=seconds + 60,
        check=True,
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    p50 = _ms(re.search(r"(?m)^\s+50%\s+(\S+)", out).group(1))  # type: ignore[union-attr]
    p99 = _ms(re.search(r"(?m)^\s+99%\s+(\S+)", out).group(1))  # type: ignore[union-attr]
    total = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    err_count = sum(int(g) for g in errors.groups()) if errors else 0
    answers = re.search(r"answers .*", out)
    return WrkResult(
        rps,
        p50,
        p99,
        total,
        int(non2xx.group(1)) if non2xx else 0,
        err_count,
        answers.group(0) if answers else "",
    )


@contextmanager
def fresh_database(backend: str, work: Path, admin: str | None, name: str) -> Iterator[str]:
    """A migrated throw-away database: a SQLite file ``name`` in ``work``, or on PostgreSQL
    (``backend`` "postgresql", ``admin`` its URL) a clone of a migrated template, dropped
    afterwards."""
    from reconciler.storage import migrate
    from reconciler.storage.database import Database

    factory = None
    if backend == "postgresql":
        from tests.support.databases import PostgresFactory

        assert admin is not None
        factory = PostgresFactory(admin)
        url = factory.clone()
    else:
        url = f"sqlite:///{work / name}"
    try:
        db = Database(url)
        migrate.upgrade(db)
        db.dispose()
        yield url
    finally:
        if factory is not None:
            factory.close()
