"""Each isolation fault, measured: does one bad party stall the rest?

    python bench/faults.py [--only NAME[,NAME]] [--hold 20] [--postgres] [--smoke]

Faults: ``slow_provider`` (status reads hang 60 s), ``hanging_receiver`` (400
callbacks to two receiver hosts that never answer; the figure is when the healthy
operations' callbacks *arrive* at their own receiver), ``db_lock`` (another connection holds
``BEGIN EXCLUSIVE`` for ``--hold`` s, write bound 5 s), ``disk_full`` (a small
tmpfs filled up; needs root), ``oversized_headers`` (100 connections sending 20 MB
headers), ``slow_clients`` (3,000 connections dripping a byte every 0.5 s),
``restart`` (300 operations overdue after a restart), ``pg_outage`` (PostgreSQL
cut through a proxy for longer than the create and cancel windows; ``--postgres``
and ``RECONCILER_TEST_POSTGRES_URL``), ``waits`` (2,000 concurrent /wait).

Prints one row per fault: the healthy side's figure (latency ratio loaded ÷
unloaded, /healthz p99, peak ÷ steady provider rate, RSS growth, lateness) and
the lost / duplicate / stuck counts, which must all be zero. Everything runs on
127.0.0.1 and stops by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path[:0] = [
    str(Path(__file__).resolve().parents[1]),
    str(Path(__file__).resolve().parents[1] / "service"),
]

import httpx  # noqa: E402
from bench.support import SMOKE_HELP, smoke  # noqa: E402
from tests.support import loopback  # noqa: E402
from tests.support.databases import sqlite_url  # noqa: E402
from tests.support.faults import hanging_server, p99, rss_kib, two_providers  # noqa: E402
from tests.support.hooks import serve_receiver  # noqa: E402

from reconciler.demo.sim import FaultRates  # noqa: E402


@dataclass
class Row:
    fault: str
    figure: str
    value: float
    target: str
    ok: bool
    lost: int = 0
    duplicate: int = 0
    stuck: int = 0
    note: str = ""


QUICK = {"scenario": "success", "duration": 0.3}


def _slow_provider(tmp: Path) -> Row:
    def run(loaded: bool) -> tuple[list[float], int, int]:
        work = Path(tempfile.mkdtemp(dir=tmp))
        slow = {"status": FaultRates(delay=1.0, delay_seconds=60)}
        with (
            sqlite_url(work) as db,
            two_providers(
                work,
                db,
                slow=slow,
                slow_provider={"status": {"timeout_seconds": 60}},
                scheduler={"provider_concurrency": 16},
            ) as stack,
        ):
            if loaded:
                for _ in range(300):
                    stack.create("slow", {"scenario": "never_finishes"})
                time.sleep(2.0)
            healthy = [stack.create("good", QUICK) for _ in range(50)]
            stack.wait_done(healthy, timeout=120)
            done = [op for op in stack.rows(healthy) if op.done_at is not None]
            stuck = len(healthy) - len(done)
            with stack.runtime.db.read() as conn:
                ops = conn.exec_driver_sql("SELECT count(*) FROM operations").scalar_one()
            expected = 50 + (300 if loaded else 0)
            dup = sum(len(s.keys.get(k, [])) > 1 for s in stack.sims.values() for k in s.keys)
            return stack.latencies([op.id for op in done]), stuck, dup + (expected - ops)

    base, _, _ = run(False)
    loaded, stuck, bad = run(True)
    ratio = p99(loaded) / p99(base)
    note = f"p99 unloaded {p99(base):.2f} s, loaded {p99(loaded):.2f} s"
    return Row("slow_provider", "healthy p99 ratio", ratio, "<= 2", ratio <= 2, bad, 0, stuck, note)


HANGING_OPERATIONS = 400
HANGING_HOSTS = ("127.0.0.2", "127.0.0.3")
HEALTHY_OPERATIONS = 100
CALLBACK_WAIT = 300.0  # before isolation the healthy callbacks queue behind N / 32 x 10 s


def _hanging_receiver(tmp: Path) -> Row:
    """The healthy operations' callback *arrival* at their own receiver (create -> request
    received), beside 400 operations whose receivers (two hosts) never answer."""

    def run(loaded: bool) -> tuple[list[float], int, int]:
        work = Path(tempfile.mkdtemp(dir=tmp))
        with ExitStack() as stack:
            hangs = [stack.enter_context(hanging_server(host)) for host in HANGING_HOSTS]
            receiver, base = stack.enter_context(serve_receiver())
            db = stack.enter_context(sqlite_url(work))
            rig = stack.enter_context(
                two_providers(
                    work,
                    db,
                    scheduler={"provider_concurrency": 16},
                    callbacks={"concurrency": 32, "timeout_seconds": 10},
                )
            )
            if loaded:
                for i in range(HANGING_OPERATIONS):
                    hang = hangs[i % len(hangs)]
                    rig.create("good", QUICK, callback_url=f"{hang}/hook/{i}")
                time.sleep(2.0)
            started: dict[str, float] = {}
            for i in range(HEALTHY_OPERATIONS):
                started[f"h{i}"] = time.monotonic()
                rig.create("good", QUICK, callback_url=f"{base}/cb/h{i}")
            deadline = time.monotonic() + CALLBACK_WAIT
            while time.monotonic() < deadline:
                if len({d.path for d in receiver.deliveries()}) >= HEALTHY_OPERATIONS:
                    break
                time.sleep(0.1)
            first: dict[str, float] = {}
            for d in receiver.deliveries():
                first.setdefault(d.path.removeprefix("/cb/"), d.at)
            arrivals = [first[name] - at for name, at in started.items() if name in first]
            stuck = HEALTHY_OPERATIONS - len(arrivals)
            dup = sum(n > 1 for n in receiver.by_webhook_id().values())
            return arrivals, stuck, dup

    base, _, _ = run(False)
    loaded, stuck, dup = run(True)
    ratio = p99(loaded) / p99(base)
    note = (
        f"callback arrival p50/p99 unloaded {statistics.median(base):.2f}/{p99(base):.2f} s, "
        f"loaded {statistics.median(loaded or [0.0]):.2f}/{p99(loaded):.2f} s"
    )
    return Row(
        "hanging_receiver", "callback p99 ratio", ratio, "<= 2", ratio <= 2, 0, dup, stuck, note
    )


def _probe(url: str, path: str, out: list[tuple[float, int | None]], stop: threading.Event) -> None:
    with httpx.Client(timeout=10) as client:
        while not stop.is_set():
            started = time.monotonic()
            try:
                status: int | None = client.get(f"{url}{path}").status_code
            except httpx.HTTPError:
                status = None
            out.append((time.monotonic() - started, status))
            stop.wait(0.05)


def _db_lock(tmp: Path, hold: float) -> Row:
    import sqlite3

    from tests.faults import test_database_locks as locks

    locks.BOUND = 5.0
    db_path = tmp / "lock.db"
    with (
        locks.service(tmp, db_path) as (url, writes),
        locks.probing(url, locks._kinds(writes)) as probes,
    ):
        time.sleep(1.0)
        outside = sqlite3.connect(db_path, isolation_level=None, timeout=10)
        outside.execute("BEGIN EXCLUSIVE")
        time.sleep(hold)
        outside.execute("ROLLBACK")
        outside.close()
        locks._wait_ready(url)
        time.sleep(1.0)
    health = [took for _, took, s in probes["healthz"].results if s == 200]
    failed = sum(1 for _, _, s in probes["healthz"].results if s != 200)
    waited = max(took for name in ("create", "webhook") for _, took, _ in probes[name].results)
    with sqlite3.connect(db_path) as conn:
        ops = {r[0] for r in conn.execute("SELECT id FROM operations")}
        events = {r[0] for r in conn.execute("SELECT event_id FROM webhook_events")}
    lost = len(set(writes.created) - ops) + len(set(writes.events) - events)
    value = p99(health) * 1000
    note = f"longest write wait {waited:.2f} s (bound 5 s), {failed} /healthz failures"
    ok = value < 100 and failed == 0 and waited < 5 + 2
    return Row("db_lock", "/healthz p99 ms", value, "< 100", ok, lost, 0, 0, note)


def _disk_full(tmp: Path) -> Row:
    import pytest
    from tests.faults import test_database_locks as locks

    locks.BOUND = 1.0
    try:
        (tmp / "disk").mkdir()
        locks.test_a_full_disk_turns_readyz_and_nothing_acknowledged_is_lost(tmp / "disk")
    except pytest.skip.Exception as exc:
        return Row("disk_full", "readyz 503 then 200", 0, "flips", True, note=f"skipped: {exc}")
    except AssertionError as exc:
        return Row("disk_full", "readyz 503 then 200", 0, "flips", False, note=str(exc)[:80])
    return Row("disk_full", "readyz 503 then 200", 1, "flips", True, note="acknowledged all kept")


def _oversized(tmp: Path) -> Row:
    from tests.faults import test_front_door as door

    with door.served(tmp) as svc:
        port = int(svc.url.rsplit(":", 1)[1])
        for _ in range(5):
            loopback.get(f"{svc.url}/healthz", timeout=5)
        idle = rss_kib(svc.pid)

        async def attack() -> list[bytes]:
            size = 20 * 1024 * 1024
            return await asyncio.gather(*(door.oversized(port, size) for _ in range(100)))

        with door.sampling_rss(svc.pid) as samples:
            asyncio.run(attack())
        growth = (max(samples) - idle) / 1024
        refused = door.refusals(svc.url).get("headers_too_large", 0)
    note = f"idle {idle // 1024} MiB; {refused:.0f} of 100 refused with 431"
    return Row("oversized_headers", "RSS growth MiB", growth, "< 50", growth < 50, note=note)


def _slow_clients(tmp: Path) -> Row:
    from tests.faults import test_front_door as door

    deadline = 2.0
    with door.served(tmp, header_timeout_seconds=deadline) as svc:
        port = int(svc.url.rsplit(":", 1)[1])
        probes: list[tuple[float, int | None]] = []
        stop = threading.Event()
        prober = threading.Thread(target=_probe, args=(svc.url, "/healthz", probes, stop))
        prober.start()
        lasted: list[float | None] = []

        async def crowd() -> None:
            await asyncio.gather(*(door._slow_client(port, 0.5, lasted) for _ in range(3000)))

        asyncio.run(crowd())
        stop.set()
        prober.join()
    value = p99([t for t, s in probes if s == 200]) * 1000
    failed = sum(1 for _, s in probes if s != 200)
    cut = max(t for t in lasted if t is not None)
    note = f"slowest cut after {cut:.2f} s (deadline {deadline} s), {failed} /healthz failures"
    ok = value < 100 and failed == 0 and cut < deadline + 2
    stuck = sum(1 for t in lasted if t is None)
    return Row("slow_clients", "/healthz p99 ms", value, "< 100", ok, stuck=stuck, note=note)


def _restart(tmp: Path) -> Row:
    import pytest
    from tests.faults import test_catch_up as catch_up

    captured: dict[str, Any] = {}
    original = catch_up._per_second

    def per_second(times: list[float], start: float, end: float) -> list[int]:
        counts = original(times, start, end)
        captured.setdefault("steady" if "steady" not in captured else "after", counts)
        return counts

    catch_up._per_second = per_second  # type: ignore[assignment]
    try:
        catch_up.test_overdue_reads_are_spread_after_a_restart(tmp / "restart")
        ok, note = True, ""
    except AssertionError as exc:
        ok, note = False, str(exc).splitlines()[0][:80]
    except pytest.skip.Exception as exc:
        return Row("restart", "peak / steady", 0, "<= 2", True, note=f"skipped: {exc}")
    finally:
        catch_up._per_second = original  # type: ignore[assignment]
    steady = statistics.mean(captured["steady"])
    peak = max(captured["after"])
    missing = max(0, catch_up.OPERATIONS - sum(captured["after"]))
    note = note or f"steady {steady:.1f}/s, peak {peak}/s after restart"
    return Row("restart", "peak / steady", peak / steady, "<= 2", ok, stuck=missing, note=note)


def _pg_outage(tmp: Path) -> Row:
    from tests.faults import test_own_outage as outage
    from tests.support.databases import PostgresFactory, postgres_admin_url
    from tests.support.faults import TcpProxy

    admin = postgres_admin_url()
    if admin is None:
        return Row("pg_outage", "settled", 0, "2 of 2", True, note="skipped: no PostgreSQL")
    import sqlalchemy as sa

    factory = PostgresFactory(admin)
    settled = 0
    notes = []
    try:
        for case in (
            outage.test_a_create_window_lost_to_our_outage_is_settled_by_a_lookup,
            outage.test_a_cancel_window_lost_to_our_outage_is_settled_by_a_status_read,
        ):
            url = factory.clone()
            parsed = sa.make_url(url)
            proxy = TcpProxy((parsed.host or "127.0.0.1", parsed.port or 5432))
            proxy.start()
            proxied = parsed.set(port=proxy.port).render_as_string(hide_password=False)
            work = Path(tempfile.mkdtemp(dir=tmp))
            try:
                case(work, url, (proxied, proxy))
                settled += 1
            except AssertionError as exc:
                notes.append(str(exc).splitlines()[0][:60])
            finally:
                proxy.stop()
                factory.drop(url)
    finally:
        factory.close()
    note = "; ".join(notes) or f"outage {outage.OUTAGE:.0f} s > window {outage.WINDOW:.0f} s"
    return Row(
        "pg_outage", "settled", settled, "2 of 2", settled == 2, stuck=2 - settled, note=note
    )


def _waits(tmp: Path) -> Row:
    from tests.faults import test_wait_and_stop as waits
    from tests.support.stack import SIM_TOKEN, WEBHOOK_SECRET

    from reconciler.demo.sim import SimConfig, SimState

    sim = SimState(SimConfig(token=SIM_TOKEN, webhook_secret=WEBHOOK_SECRET))
    timeout = 15.0
    with waits.served(tmp, sim) as (svc, agent):
        ops = waits._create(svc.url, agent, 100)
        port = int(svc.url.rsplit(":", 1)[1])

        async def crowd() -> list[tuple[float, bytes]]:
            return await asyncio.gather(
                *(waits._wait(port, agent, ops[i % len(ops)], timeout) for i in range(2000))
            )

        answers = asyncio.run(crowd())
    late = max(took for took, _ in answers) - timeout
    bad = sum(1 for _, head in answers if not head.startswith(b"HTTP/1.1 200"))
    note = f"2,000 waits of {timeout:.0f} s; latest answer {late:+.2f} s after the timeout"
    return Row(
        "waits", "latest - timeout s", late, "< 1", late < 1 and bad == 0, stuck=bad, note=note
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="")
    parser.add_argument("--hold", type=float, default=20.0)
    parser.add_argument("--postgres", action="store_true")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP + "; db_lock only")
    args = parser.parse_args()
    smoke(args, only="db_lock", hold=1.0)
    faults: dict[str, Callable[[Path], Row]] = {
        "slow_provider": _slow_provider,
        "hanging_receiver": _hanging_receiver,
        "db_lock": lambda t: _db_lock(t, args.hold),
        "disk_full": _disk_full,
        "oversized_headers": _oversized,
        "slow_clients": _slow_clients,
        "restart": _restart,
        "waits": _waits,
    }
    if args.postgres:
        faults["pg_outage"] = _pg_outage
    chosen = [n for n in args.only.split(",") if n] or list(faults)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench-faults-") as tmp:
        for name in chosen:
            work = Path(tmp) / name
            work.mkdir()
            print(f"... {name}", file=sys.stderr, flush=True)
            rows.append(faults[name](work))
    print(
        f"{'fault':18} {'figure':20} {'value':>8} {'target':>7} {'lost':>5} {'dup':>4} "
        f"{'stuck':>5}  ok   note"
    )
    for r in rows:
        print(
            f"{r.fault:18} {r.figure:20} {r.value:8.2f} {r.target:>7} {r.lost:5d} "
            f"{r.duplicate:4d} {r.stuck:5d}  {'yes' if r.ok else 'NO ':3}  {r.note}"
        )
    # A smoke run's figures are not judged; what was lost, doubled or stuck still is.
    bad = [r for r in rows if (not r.ok and not args.smoke) or r.lost or r.duplicate or r.stuck]
    return 1 if bad else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    raise SystemExit(main())
