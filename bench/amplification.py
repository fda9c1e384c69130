"""Disk written per status read, the WAL under a flood of 1 MB requests, lookups with the
provider down.

    python bench/amplification.py [--operations 20] [--seconds 20] [--dir /tmp] [--smoke]

Three runs of the whole system in this process (the simulated provider and the
service on loopback, SQLite in ``--dir``, which must be a real disk: tmpfs does
not count ``write_bytes``):

1. ``--operations`` never-finishing jobs with a 1 KB request, then the same with
   a ~1 MB request (the body limit); for each, bytes this process wrote
   (``/proc/self/io`` ``write_bytes``) per status read, and the largest WAL seen.
   The ratio 1 MB / 1 KB says whether a status read's cost depends on the
   request (it should be about 1).
2. The provider unreachable: creates and lookups per operation, against the
   number of create backoff steps that fit in the window (it should be at most 1).

Prints figures and ratios; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    _ROOT = Path(__file__).resolve().parents[1]
    sys.path[:0] = [str(_ROOT), str(_ROOT / "service")]

from bench.support import SMOKE_HELP, smoke
from tests.support.stack import running_stack

from reconciler.core.backoff import BackoffPolicy
from reconciler.storage import migrate
from reconciler.storage.database import Database

MEGABYTE_REQUEST = 1_000_000  # inside the 1 MiB body limit with the envelope
SMALL_REQUEST = 1_000


def write_bytes() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("write_bytes:"):
            return int(line.split()[1])
    raise RuntimeError("/proc/self/io has no write_bytes")


def _status_reads(runtime: Any) -> float:
    total = 0.0
    for metric in runtime.metrics.status_requests.collect():
        total += sum(s.value for s in metric.samples if s.name.endswith("_total"))
    return total


def _calls(runtime: Any, call: str) -> float:
    total = 0.0
    for metric in runtime.metrics.provider_calls.collect():
        total += sum(
            s.value
            for s in metric.samples
            if s.name.endswith("_total") and s.labels["call"] == call
        )
    return total


@dataclass
class Flood:
    request_bytes: int
    status_reads: float
    written: int
    wal_max: int

    @property
    def per_read(self) -> float:
        return self.written / max(1.0, self.status_reads)


def _migrated(directory: Path) -> str:
    url = f"sqlite:///{directory / 'reconciler.db'}"
    db = Database(url)
    try:
        migrate.upgrade(db)
    finally:
        db.dispose()
    return url


def flood(directory: Path, operations: int, request_bytes: int, seconds: float) -> Flood:
    url = _migrated(directory)
    padding = "x" * max(0, request_bytes - 100)
    with running_stack(directory, url, tick_seconds=0.2) as stack:
        for i in range(operations):
            body = {"scenario": "never_finishes", "webhooks": "never", "pad": padding, "i": i}
            answer = stack.create(body)
            assert answer.status_code == 202, answer.text
        # Let every create settle, then measure only the steady state of status reads.
        time.sleep(3.0)
        wal_max = 0
        stop = threading.Event()

        def watch() -> None:
            nonlocal wal_max
            while not stop.wait(0.1):
                wal_max = max(wal_max, stack.runtime.db.wal_bytes())

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        reads0, bytes0 = _status_reads(stack.runtime), write_bytes()
        time.sleep(seconds)
        reads, written = _status_reads(stack.runtime) - reads0, write_bytes() - bytes0
        stop.set()
        watcher.join()
    return Flood(request_bytes, reads, written, wal_max)


def provider_down(directory: Path, operations: int, seconds: float) -> tuple[float, float, float]:
    """(creates + lookups per operation, backoff steps in the window, lookups per op)."""
    url = _migrated(directory)
    closed = "http://127.0.0.1:9"  # discard port: nothing listens, connections are refused
    with running_stack(directory, url, tick_seconds=0.2) as stack:
        spec = stack.runtime.providers["sim"]
        stack.runtime.providers["sim"] = spec.model_copy(update={"base_url": closed})
        stack.runtime.adapters.clear()
        started = time.monotonic()
        for i in range(operations):
            assert stack.create({"i": i}).status_code == 202
        time.sleep(max(0.0, seconds - (time.monotonic() - started)))
        creates, lookups = _calls(stack.runtime, "create"), _calls(stack.runtime, "lookup")
        backoff: BackoffPolicy = spec.polling.backoff()
    # Steps that fit in the window if every wait were the shortest the jitter allows.
    steps, spent = 0, 0.0
    while spent < seconds:
        steps += 1
        spent += backoff.jitter_floor * backoff.raw(steps)
    return (creates + lookups) / operations, float(steps), lookups / operations


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--operations", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--dir", default="/tmp", help="a directory on a real disk")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args(argv)
    smoke(args, operations=2, seconds=1.0)
    results = []
    for size in (SMALL_REQUEST, MEGABYTE_REQUEST):
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            results.append(flood(Path(tmp), args.operations, size, args.seconds))
    for r in results:
        print(
            f"request {r.request_bytes:>9,} B: {r.status_reads:>5.0f} status reads, "
            f"{r.written / 1e6:8.2f} MB written, {r.per_read / 1024:6.1f} KiB per read, "
            f"WAL at most {r.wal_max / 1e6:6.2f} MB"
        )
    small, big = results
    # A smoke run's window may see no read at all on a busy machine: no ratio then.
    ratio = f"{big.per_read / small.per_read:.2f}" if small.per_read else "n/a (no reads)"
    print(f"ratio bytes per read, 1 MB request / 1 KB request: {ratio}")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        calls, steps, lookups = provider_down(Path(tmp), args.operations, args.seconds)
    print(
        f"provider down {args.seconds:g} s: {calls:.1f} creates+lookups per operation "
        f"({lookups:.1f} lookups), {steps:.0f} backoff steps fit; "
        f"ratio calls per step: {calls / steps:.2f}"
    )
    return 0 if math.isfinite(big.per_read) else 1


if __name__ == "__main__":
    sys.exit(main())
