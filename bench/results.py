"""A huge JSON Lines result, collected by a real service: its memory and its /healthz meanwhile.

    python bench/results.py [--mib 200] [--baseline REV] [--baseline-mib 16]

A fake provider (its own process, uvicorn on 127.0.0.1) makes one job whose result is a
file of ``--mib`` MiB of tiny JSON lines (``{}``, the last 100 failed): 70 M lines at
200 MiB. A real service (``reconciler serve`` in its own process, SQLite) collects it
while this script asks ``/healthz`` every 25 ms and samples the resident memory of the
service and of the processes it starts (the result scan). Printed per run: the file, the
time from submission to the end state, the service's idle RSS and its largest growth,
the largest child RSS, /healthz p50, p99 and max, and whether the line counts the
service recorded are exact.

``--baseline REV`` runs the same collection first on the service as it was at git
revision ``REV`` (extracted with ``git archive``; or a checkout's directory), with a
file of ``--baseline-mib`` MiB (the old service read a result whole in its event loop:
200 MiB would take it tens of gigabytes), and the current service on that file too, so
the ratios compare like with like. Everything runs on 127.0.0.1 and stops by itself (by PID).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

sys.path[:0] = [
    str(Path(__file__).resolve().parents[1]),
    str(Path(__file__).resolve().parents[1] / "service"),
]

import httpx  # noqa: E402
from bench.support import free_port, percentile, stop, wait_ready  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MIB = 1_048_576
LINE = b"{}\n"
FAILED_LINE = b'{"error":{"code":"x"}}\n'
FAILED = 100
PROBE_EVERY = 0.025
SAMPLE_EVERY = 0.05


def write_result(path: Path, mib: float) -> tuple[int, int]:
    """A JSONL file of about ``mib`` MiB: (lines, bytes)."""
    tail = FAILED_LINE * FAILED
    lines = max(0, int(mib * MIB - len(tail)) // len(LINE))
    block = LINE * 1_000_000
    with path.open("wb") as out:
        left = lines
        while left:
            take = min(left, 1_000_000)
            out.write(block if take == 1_000_000 else LINE * take)
            left -= take
        out.write(tail)
    return lines + FAILED, path.stat().st_size


# --- the fake provider (run as: results.py provider PORT FILE) ----------------------------


def serve_provider(port: int, result: Path) -> None:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import FileResponse, JSONResponse, Response
    from starlette.routing import Route

    async def create(request: Request) -> Response:
        return JSONResponse({"job_id": "job-1", "state": "succeeded"}, status_code=202)

    async def status(request: Request) -> Response:
        return JSONResponse({"job_id": request.path_params["job"], "state": "succeeded"})

    async def fetch(request: Request) -> Response:
        return FileResponse(result, media_type="application/jsonl")

    app = Starlette(
        routes=[
            Route("/v1/jobs", create, methods=["POST"]),
            Route("/v1/jobs/{job}", status),
            Route("/v1/jobs/{job}/result", fetch),
        ]
    )
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


PROVIDER = """\
[providers.bench]
base_url = "http://127.0.0.1:{port}"

[providers.bench.create]
path = "/v1/jobs"
idempotency_header = "Idempotency-Key"
job_id = "/job_id"

[providers.bench.status]
path = "/v1/jobs/{{job_id}}"
state = "/state"

[providers.bench.states]
pending = ["running"]
success = ["succeeded"]
failure = ["failed"]

[providers.bench.result]
path = "/v1/jobs/{{job_id}}/result"
content_type = "application/jsonl"
failed_lines = [{{ pointer = "/error", present = true }}]
max_bytes = {max_bytes}
timeout_seconds = 900

[providers.bench.polling]
base_delay_seconds = 0.2
max_delay_seconds = 1
deadline_seconds = 7200
max_status_requests = 100
"""


# --- measuring ----------------------------------------------------------------------------


def rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (the result scan), from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


@dataclass
class Run:
    label: str
    file_mib: float
    lines: int
    seconds: float
    idle_mib: float
    growth_mib: float
    child_mib: float
    healthz_ms: list[float]
    exact: bool
    state: str

    def row(self) -> str:
        probes = self.healthz_ms
        p50, p99 = percentile(probes, 50), percentile(probes, 99)
        return (
            f"{self.label:<10} {self.file_mib:>8.1f} {self.lines:>11,} {self.seconds:>8.1f} "
            f"{self.idle_mib:>8.1f} {self.growth_mib:>9.1f} {self.child_mib:>9.1f} "
            f"{p50:>7.1f} {p99:>8.1f} {max(probes, default=0):>8.1f} {len(probes):>7} "
            f"{'yes' if self.exact else 'NO':>6} {self.state}"
        )


HEADER = (
    f"{'service':<10} {'file MiB':>8} {'lines':>11} {'seconds':>8} {'idle MiB':>8} "
    f"{'RSS +MiB':>9} {'child MiB':>9} {'hz p50':>7} {'hz p99 ms':>8} {'hz max':>8} "
    f"{'probes':>7} {'exact':>6} state"
)


def _cli(python_path: Path, args: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "reconciler", *args],
        cwd=python_path,
        env={**env, "PYTHONPATH": str(python_path)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"reconciler {args[0]} failed: {done.stderr.strip()[-500:]}")
    return done.stdout


def collect(label: str, service_root: Path, result: Path, lines: int, work: Path) -> Run:
    """One collection of ``result`` by the service under ``service_root`` (its ``service``)."""
    work.mkdir(parents=True)
    provider_port, port = free_port(), free_port()
    providers = work / "providers"
    providers.mkdir()
    max_bytes = max(result.stat().st_size + MIB, 16 * MIB)
    (providers / "bench.toml").write_text(
        PROVIDER.format(port=provider_port, max_bytes=max_bytes), "utf-8"
    )
    config = work / "reconciler.toml"
    config.write_text(
        f'database_url = "sqlite:///{work / "bench.db"}"\n'
        f'providers_dir = "{providers}"\n'
        f'[server]\nhost = "127.0.0.1"\nport = {port}\n'
        "[scheduler]\ntick_seconds = 0.2\n",
        "utf-8",
    )
    python_path = service_root / "service"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECONCILER_")}
    _cli(python_path, ["db", "upgrade", "--config", str(config)], env)
    token = _cli(
        python_path,
        ["tokens", "create", "--name", "bench", "--scope", "agent", "--config", str(config)],
        env,
    ).split()[0]
    fake = subprocess.Popen(
        [sys.executable, __file__, "provider", str(provider_port), str(result)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    log = (work / "service.log").open("wb")
    service = subprocess.Popen(
        [sys.executable, "-m", "reconciler", "serve", "--config", str(config)],
        cwd=python_path,
        env={**env, "PYTHONPATH": str(python_path)},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(f"http://127.0.0.1:{provider_port}/v1/jobs/x", 60)
        wait_ready(f"{url}/readyz", 120)
        return _measure(label, url, token, service.pid, result, lines)
    finally:
        stop(service)
        stop(fake)
        log.close()


def _measure(label: str, url: str, token: str, pid: int, result: Path, lines: int) -> Run:
    time.sleep(1.0)  # settled after start-up
    idle = rss_kib(pid)
    peaks = {"service": idle, "child": 0}
    probes: list[float] = []
    moments: list[float] = []
    scanning: list[float] = []
    finished = threading.Event()
    start = time.monotonic()

    def probe() -> None:
        with httpx.Client(timeout=120) as client:
            while not finished.is_set():
                started = time.perf_counter()
                client.get(f"{url}/healthz")
                probes.append((time.perf_counter() - started) * 1000)
                moments.append(time.monotonic() - start)
                time.sleep(PROBE_EVERY)

    def sample() -> None:  # a thread of its own: a stalled service must not stop the samples
        while not finished.is_set():
            peaks["service"] = max(peaks["service"], rss_kib(pid))
            scans = [rss_kib(c) for c in children(pid)]
            if scans and not scanning:
                scanning.append(time.monotonic() - start)
            peaks["child"] = max([peaks["child"], *scans])
            time.sleep(SAMPLE_EVERY)

    auth = {"Authorization": f"Bearer {token}"}
    with httpx.Client(timeout=120, headers=auth) as client:
        answer = client.post(f"{url}/v1/operations", json={"provider": "bench", "request": {}})
        answer.raise_for_status()
        op_id = answer.json()["id"]
        started = time.monotonic()
        threads = [threading.Thread(target=t, daemon=True) for t in (probe, sample)]
        for thread in threads:
            thread.start()
        op: dict[str, object] = {}
        while time.monotonic() - started < 3600:
            op = client.get(f"{url}/v1/operations/{op_id}").json()
            if op.get("done"):
                break
            time.sleep(0.5)
        seconds = time.monotonic() - started
        finished.set()
        for thread in threads:
            thread.join(timeout=120)
    summary = (op.get("result") or {}).get("summary") or {}  # type: ignore[union-attr]
    exact = summary == {"total_lines": lines, "failed_lines": FAILED}
    slowest = sorted(zip(probes, moments, strict=True), reverse=True)[:5]
    print(
        f"{label}: the scan started at {scanning[0] if scanning else float('nan'):.1f} s; "
        "slowest /healthz: " + ", ".join(f"{ms:.0f} ms at {at:.1f} s" for ms, at in slowest),
        flush=True,
    )
    return Run(
        label,
        result.stat().st_size / MIB,
        lines,
        seconds,
        idle / 1024,
        (peaks["service"] - idle) / 1024,
        peaks["child"] / 1024,
        probes,
        exact,
        str(op.get("state")),
    )


def extract(revision: str, into: Path) -> Path:
    """The repository's ``service`` tree at ``revision`` (under ``into``), or the checkout
    ``revision`` names when it is a directory holding one, as throughput.py takes it."""
    if (Path(revision) / "service" / "reconciler").is_dir():
        return Path(revision).resolve()
    archive = into / "baseline.tar"
    subprocess.run(
        ["git", "archive", "--output", str(archive), revision, "service"],
        cwd=ROOT,
        check=True,
    )
    with tarfile.open(archive) as tar:
        tar.extractall(into / "baseline", filter="data")
    return into / "baseline"


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "provider":
        serve_provider(int(sys.argv[2]), Path(sys.argv[3]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=float, default=200.0)
    parser.add_argument(
        "--baseline", help="a git revision (e.g. ccade1c) or a checkout to compare with"
    )
    parser.add_argument("--baseline-mib", type=float, default=16.0)
    parser.add_argument(
        "--smoke", action="store_true", help="a 1 MiB file, no baseline: proves the bench runs"
    )
    args = parser.parse_args()
    if args.smoke:
        args.mib, args.baseline = 1.0, None
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="bench-results-") as tmp:
        work = Path(tmp)
        if args.baseline:
            small = work / "small.jsonl"
            small_lines, _ = write_result(small, args.baseline_mib)
            old = extract(args.baseline, work)
            name = Path(args.baseline).name[:10] or "baseline"
            runs.append(collect(name, old, small, small_lines, work / "old"))
            print(HEADER, "\n" + runs[-1].row(), flush=True)
            runs.append(collect("current", ROOT, small, small_lines, work / "new-small"))
            print(runs[-1].row(), flush=True)
            small.unlink()
        big = work / "big.jsonl"
        big_lines, _ = write_result(big, args.mib)
        runs.append(collect("current", ROOT, big, big_lines, work / "new-big"))
    print(f"\n{HEADER}")
    for run in runs:
        print(run.row())
    if args.baseline:
        old_run, new_run = runs[0], runs[1]
        ratio_rss = old_run.growth_mib / max(new_run.growth_mib, 0.1)
        old_p99 = percentile(old_run.healthz_ms, 99)
        ratio_hz = old_p99 / max(percentile(new_run.healthz_ms, 99), 0.1)
        print(
            f"\nsame {old_run.file_mib:.0f} MiB file: RSS growth {ratio_rss:.1f}x smaller, "
            f"/healthz p99 {ratio_hz:.1f}x lower than {args.baseline}"
        )
    # The last 100 lines are failed: every run ends completed_with_errors, counted exactly.
    ok = all(r.exact and r.state == "completed_with_errors" for r in runs)
    print(json.dumps({"ok": ok}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
