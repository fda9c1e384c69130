"""A statement's round trip on a writer thread, and on the event loop, beside the loop's work.

The service writes on threads of its own (``storage/writer.py``) and serves HTTP and
runs its steps on the event loop: one interpreter lock for all of them. A writer thread
that gets PostgreSQL's answer while the loop runs Python waits for the lock, until the
loop blocks in its poll or the interpreter's switch interval (5 ms) forces a handoff.
At the PostgreSQL ceiling of ``bench/peer_dbos.py`` the loop is busy about a third of
the time and each writer statement takes about 0.9 ms of wall time for 0.2 ms of the
server's: this bench measures how much of that is the lock, and what the other design
(psycopg's ``AsyncConnection`` on the loop itself, where the answer is one more event of
the poll the loop waits in) would give instead.

Each run lasts ``--seconds``, with ``--connections`` connections sending ``SELECT 1``
one after another (the statement costs the server next to nothing: what is left is the
round trip and its handoffs):

* ``threads``: a sync connection on a thread of its own each, as the writers are;
* ``loop``: an ``AsyncConnection`` each, a task on the loop.

Each is run alone and beside the loop's work: every ``--period-ms`` the loop runs
``--chunk-ms`` of pure Python (a loop turn's callbacks), a duty cycle of chunk/period
(default 0.35, the service's main thread at the ceiling). The work's own lag (how late
each chunk starts) is printed too: a design that starved it would only have moved the
wait. The floor is ``threads`` alone, a bare client; ratios are against the same mode
alone and between the two modes under load.

    python bench/write_path.py [--seconds 3] [--connections 2] [--rounds 3] [--smoke]

PostgreSQL is ``RECONCILER_TEST_POSTGRES_URL`` when set, else a throwaway server.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import threading
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path[:0] = [
    str(Path(__file__).resolve().parents[1]),
    str(Path(__file__).resolve().parents[1] / "service"),
]

import psycopg  # noqa: E402
import uvloop  # noqa: E402
from bench.support import SMOKE_HELP, percentile, smoke  # noqa: E402
from bench.throughput import Databases  # noqa: E402

STATEMENT = "SELECT 1"


@dataclass
class Result:
    mode: str
    loaded: bool
    round_trips: int
    seconds: float
    cpu: float  # process CPU seconds over the run
    lag_ms_p50: float | None  # how late the loop's work started, when there was some
    lag_ms_p99: float | None
    chunks: int
    connections: int

    @property
    def per_second(self) -> float:
        return self.round_trips / self.seconds

    @property
    def micros(self) -> float:
        """Wall time of one round trip on one connection."""
        return self.seconds * 1e6 / max(1, self.round_trips) * self.connections

    def line(self) -> str:
        load = "beside the loop's work" if self.loaded else "alone"
        lag = (
            f"  work lag p50/p99 {self.lag_ms_p50:.2f}/{self.lag_ms_p99:.2f} ms, "
            f"{self.chunks} chunks"
            if self.lag_ms_p50 is not None and self.lag_ms_p99 is not None
            else ""
        )
        return (
            f"  {self.mode:<8} {load:<24} {self.per_second:9.0f} round trips/s  "
            f"{self.micros:7.0f} us each  CPU {self.cpu * 1e6 / max(1, self.round_trips):5.0f} "
            f"us/round trip{lag}"
        )


def spin(seconds: float) -> None:
    """Pure Python for ``seconds``: it holds the interpreter lock as the loop's callbacks do."""
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1


async def loop_work(stop: asyncio.Event, chunk: float, period: float, lags: list[float]) -> None:
    """``chunk`` seconds of Python every ``period`` seconds, on the loop, until ``stop``."""
    due = time.perf_counter()
    while not stop.is_set():
        lags.append(max(0.0, time.perf_counter() - due))
        spin(chunk)
        due += period
        await asyncio.sleep(max(0.0, due - time.perf_counter()))


def on_threads(
    conns: list[psycopg.Connection[Any]], stop: threading.Event, counts: list[int]
) -> list[threading.Thread]:
    def run(index: int) -> None:
        conn = conns[index]
        while not stop.is_set():
            conn.execute(STATEMENT).fetchall()
            counts[index] += 1

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(conns))]
    for thread in threads:
        thread.start()
    return threads


async def on_loop(
    conn: psycopg.AsyncConnection[Any], index: int, stop: asyncio.Event, counts: list[int]
) -> None:
    while not stop.is_set():
        await (await conn.execute(STATEMENT)).fetchall()
        counts[index] += 1


async def measure(mode: str, conninfo: str, args: argparse.Namespace, loaded: bool) -> Result:
    n = args.connections
    counts = [0] * n
    lags: list[float] = []
    stop = asyncio.Event()
    thread_stop = threading.Event()
    # Connected before the clock starts: the run times round trips only.
    sync = [
        psycopg.connect(conninfo, autocommit=True) for _ in range(n if mode == "threads" else 0)
    ]
    aio = [
        await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
        for _ in range(n if mode == "loop" else 0)
    ]
    cpu0, t0 = time.process_time(), time.perf_counter()
    threads = on_threads(sync, thread_stop, counts)
    jobs: list[Awaitable[None]] = [on_loop(conn, i, stop, counts) for i, conn in enumerate(aio)]
    if loaded:
        chunk, period = args.chunk_ms / 1000, args.period_ms / 1000
        jobs.append(loop_work(stop, chunk, period, lags))
    tasks = [asyncio.ensure_future(job) for job in jobs]
    await asyncio.sleep(args.seconds)
    stop.set()
    thread_stop.set()
    counted = sum(counts)
    seconds = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    await asyncio.gather(*tasks)
    for thread in threads:
        thread.join(timeout=5)
    for conn in sync:
        conn.close()
    for aconn in aio:
        await aconn.close()
    ms = [lag * 1000 for lag in lags]
    return Result(
        mode,
        loaded,
        counted,
        seconds,
        cpu,
        percentile(ms, 50) if ms else None,
        percentile(ms, 99) if ms else None,
        len(ms),
        n,
    )


async def run(conninfo: str, args: argparse.Namespace) -> None:
    """Every mode alone and beside the work, round after round (the machine's speed drifts:
    rounds interleave the four), then the medians' ratios."""
    results: dict[tuple[str, bool], list[Result]] = {}
    for number in range(1, args.rounds + 1):
        print(f"round {number}")
        for loaded in (False, True):
            for mode in ("threads", "loop"):
                result = await measure(mode, conninfo, args, loaded)
                results.setdefault((mode, loaded), []).append(result)
                print(result.line(), flush=True)

    def micros(mode: str, loaded: bool) -> float:
        return statistics.median(r.micros for r in results[(mode, loaded)])

    threads, loop = micros("threads", True), micros("loop", True)
    print(
        f"medians over {args.rounds} rounds, us a round trip: "
        f"threads {micros('threads', False):.0f} alone, {threads:.0f} beside the work; "
        f"loop {micros('loop', False):.0f} alone, {loop:.0f} beside the work"
    )
    print(
        f"  ratio loop/threads, round trips/s beside the work: {threads / loop:.2f} "
        f"(alone: {micros('threads', False) / micros('loop', False):.2f}; floor: threads alone)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--connections", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--chunk-ms", type=float, default=0.7)
    parser.add_argument("--period-ms", type=float, default=2.0)
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args(argv)
    smoke(args, seconds=0.2, rounds=1)
    with Databases(postgres=True) as dbs:
        assert dbs.admin is not None
        conninfo = dbs.admin.replace("postgresql+psycopg://", "postgresql://", 1)
        print(
            f"SELECT 1 on {args.connections} connections, {args.seconds:g} s a run; the loop's "
            f"work: {args.chunk_ms:g} ms of Python every {args.period_ms:g} ms "
            f"(duty {args.chunk_ms / args.period_ms:.2f}); {os.cpu_count()} CPUs"
        )
        uvloop.run(run(conninfo, args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
