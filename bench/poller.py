"""Fallback poller costs: tick cost against operations in flight, RSS, and status reads per
completed operation against a naive fixed-interval poller.

    python bench/poller.py [--sizes 10000,100000] [--due N] [--rounds 7]
        [--rss-seconds 20] [--postgres URL] [--jobs 1000] [--seed 7] [--only ticks|rss|reads]
        [--smoke]

(a) Tick cost. A migrated database (SQLite WAL; PostgreSQL with ``--postgres ADMIN_URL``,
in throw-away databases) is filled with N operations in ``observing`` with valid rows and
history heads (bulk INSERTs of the rows ``Journal.insert`` writes; the migrated indexes
are in place while inserting), of which ``--due`` are due now and the rest due in 1-2 h.
``--due`` defaults to what one tick claims of one provider (``scheduler.provider_concurrency``,
16): a tick claims at most that many, so a larger due set is not one tick's work.
Figures per size, from ``--rounds`` rounds that alternate between the sizes:

* claim step: ``leases.claim_records`` (batch_size 100) in one write transaction plus
  ``leases.release`` of what it claimed in another: the database part of a tick
  (``--claim-repeats`` samples per round); also the same with nothing due (idle claim);
* full tick: ``Worker.tick()`` of the real worker (``Background`` with the scheduler off,
  a ``ManualClock``) until every claimed operation finished its step (reload, budget
  charge, one status read, decision written, lease released), against a provider that
  answers ``running`` instantly in process (``httpx.MockTransport`` through
  ``Runtime.build(transport=...)``). Between rounds the same due operations are made due
  again (untimed).

Printed: median [min-max] per size, and the ratio largest/smallest of the medians and of
the minimums (the least disturbed samples on a shared machine). Target: <= 1.5.

RSS. The service (``reconciler.server.serve``, what ``reconciler serve`` runs) in a
subprocess against the empty, the 10 k and the 100 k database, with the due operations due
now and a stub provider (uvicorn subprocess) that answers ``running`` at once; after
``--rss-seconds`` of ticking (1 s ticks, /metrics scraped every 5 s) VmRSS and VmHWM of the
service process are read from /proc. Target: < 300 MB with 100 k in flight.

(b) Status reads per completed operation. A discrete-event simulation on a virtual clock
(no sleeping) drives the real decision core (``core.next_read.first_poll_at``,
``core.poll.before_request``, ``decide``) with the default policy (base 5 s, max 120 s, jitter
floor 0.5, deadline 2400 s; budget 1000 so no run is cut) over ``--jobs`` jobs with
durations log-uniform 10 s-10 min (seeded), with webhooks arriving (a hint at the job's
end brings the next read forward to that moment) and with webhooks lost (fallback poller
only); the naive baseline reads every 2 s (``bench/naive.py``). Target: with webhooks
lost, at least 5x fewer status reads than the naive poller.

(c) Webhook trust regimes. The same 1000 durations as a Poisson stream of arrivals
(``--arrival-gap`` s apart on average) sharing one provider's webhook health
(``bench/trust_sim.py``: the real decision and trust cores, the keeper's grace and
restore modelled as the service runs them; trust_after 20, distrust at the first miss,
trusted_max_delay 10 x max_delay, grace 30 s, provider concurrency 16). Three regimes,
each with trust adaptive, trust off and the naive 2-second poller: (a) every webhook
delivered, (b) every webhook lost, (c) an outage: webhooks of jobs ending in
[``--outage-from``, ``--outage-until``) s are lost. Targets: (a) <= 1.3 status reads per
completed operation; (b) no more reads than trust off; (c) the outage detected at the
first miss, every job that ended during the outage confirmed within
trusted_max_delay_seconds of its end, and no result_timed_out.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# Run as a script, bench/ comes first on sys.path; its modules are imported as bench.*:
# leave only the repository's roots.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
for _path in (str(ROOT / "service"), str(ROOT)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import httpx  # noqa: E402
from bench.naive import (  # noqa: E402
    log_uniform_durations,
    naive_detection_delay,
    naive_reads,
    summary,
)
from bench.support import SMOKE_HELP, free_port, smoke, stop, wait_ready  # noqa: E402
from tests.support import loopback  # noqa: E402

from reconciler.config import SchedulerSettings  # noqa: E402
from reconciler.core import next_read as schedule  # noqa: E402
from reconciler.core import poll as decisions  # noqa: E402
from reconciler.core import poll_values as values  # noqa: E402
from reconciler.core.backoff import BackoffPolicy  # noqa: E402
from reconciler.core.clock import ManualClock  # noqa: E402
from reconciler.core.vocabulary import RemoteCategory  # noqa: E402

SIM_ENV = {"SIM_TOKEN": "bench-token"}
MB = 1024 * 1024
# The default polling schedule (docs/design.md#next-read) with a budget that never cuts a run.
REALISTIC = {
    "base_delay_seconds": 5.0,
    "max_delay_seconds": 120.0,
    "jitter_floor": 0.5,
    "deadline_seconds": 2400.0,
    "max_status_requests": 1000,
    "max_transport_failures": 3,
}


def _environ() -> dict[str, str]:
    from tests.support.stack import WEBHOOK_SECRET

    return {**SIM_ENV, "SIM_WEBHOOK_SECRETS": WEBHOOK_SECRET}


# --- processes -----------------------------------------------------------------------------


def spawn(
    args: Sequence[str], log: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """A Python subprocess in the repository root, its output in ``log`` (a pipe could fill)."""
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, *args],
            cwd=ROOT,
            env={**os.environ, **(env or {})},
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def memory(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of ``pid`` in MB."""
    values: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            values[name] = int(rest.split()[0]) * 1024 / MB
    return values["VmRSS"], values["VmHWM"]


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time ``pid`` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def serve_stub(port: int) -> None:
    """A provider whose status endpoint answers ``running`` for any job, at once."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    async def status(request: Request) -> Response:
        return JSONResponse(running_body(request.path_params["job_id"]))

    async def health(request: Request) -> Response:
        return Response(status_code=204)

    app = Starlette(
        routes=[Route("/v1/jobs/{job_id}", status), Route("/healthz", health)],
    )
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def running_body(job_id: str) -> dict[str, Any]:
    return {"job_id": job_id, "state": "running", "progress": {"completed": 1, "total": 100}}


def service_settings(db_url: str, provider_url: str, work: Path, port: int = 8080) -> Any:
    """The service's settings: the sim's provider file pointed at ``provider_url``."""
    from tests.support.stack import sim_provider_table

    from reconciler.config import ServerSettings, Settings

    empty = work / "no-provider-files"
    empty.mkdir(parents=True, exist_ok=True)
    return Settings(
        database_url=db_url,
        providers_dir=str(empty),
        providers={"sim": sim_provider_table(provider_url, polling=dict(REALISTIC))},
        server=ServerSettings(port=port),
        log_level="WARNING",
    )


def serve_service(db_url: str, port: int, provider_url: str, work: Path) -> None:
    from reconciler.app import serve

    serve(service_settings(db_url, provider_url, work, port))


# --- (a) seeding ---------------------------------------------------------------------------


def _rows(index: int, now: datetime, due: bool, rng: random.Random) -> tuple[dict[str, Any], ...]:
    """One operation in ``observing`` and its first history entry, as Journal.insert makes them."""
    from reconciler.core import ids
    from reconciler.core.canonical import request_fingerprint
    from reconciler.core.chain import entry_hash
    from reconciler.storage.tables import OPS

    op_id = ids.operation_id(now)
    request = {"bench": index}
    entry = {
        "operation_id": op_id,
        "seq": 1,
        "at": now,
        "kind": "transition",
        "actor": "bench",
        "from_state": None,
        "to_state": "observing",
        "cause": "bench_seed",
        "delay_source": None,
        "detail": None,
    }
    digest = entry_hash(entry, "", None)
    later = timedelta(seconds=rng.uniform(3600.0, 7200.0))
    op: dict[str, Any] = {c.name: None for c in OPS.c}
    op.update(
        id=op_id,
        provider="sim",
        caller="bench",
        request_fingerprint=request_fingerprint("sim", request),
        idempotency_token=ids.idempotency_token(),
        trace_id=ids.trace_id(),
        state="observing",
        remote_job_id=f"job_{index:07d}",
        remote_state="running",
        created_at=now,
        updated_at=now,
        accepted_at=now,
        create_deadline_at=now + timedelta(seconds=60),
        deadline_at=now + timedelta(days=2),
        create_attempts=1,
        max_status_requests=1_000_000,
        status_requests_used=0,
        max_transport_failures=3,
        transport_failures_used=0,
        rate_limited_count=0,
        poll_attempt=0,
        next_poll_at=now - timedelta(seconds=1) if due else now + later,
        delay_source="local_backoff",
        result_attempts=0,
        completion_round=0,
        completion_pending=False,
        escalation_open=False,
        create_lookups=0,
        step_failures=0,
        version=1,
        history_seq=1,
        history_head=digest,
    )
    return op, {**entry, "prev_hash": "", "hash": digest}


def seed(db_url: str, total: int, due: int, now: datetime, seed_value: int = 7) -> list[str]:
    """Migrate ``db_url`` and insert ``total`` observed operations; returns the due ones' ids."""
    import sqlalchemy as sa

    from reconciler.storage import migrate
    from reconciler.storage.database import Database
    from reconciler.storage.tables import HISTORY, OPS

    rng = random.Random(seed_value)
    due_at = set(rng.sample(range(total), min(due, total)))
    db = Database(db_url)
    due_ids: list[str] = []
    try:
        migrate.upgrade(db)
        chunk = 5000
        for start in range(0, total, chunk):
            ops, history = [], []
            for index in range(start, min(total, start + chunk)):
                op, entry = _rows(index, now, index in due_at, rng)
                ops.append(op)
                history.append(entry)
                if index in due_at:
                    due_ids.append(op["id"])
            with db.write() as conn:
                conn.execute(sa.insert(OPS), ops)
                conn.execute(sa.insert(HISTORY), history)
        if not db.sqlite:
            with db.engine.connect() as conn:
                conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("ANALYZE")
    finally:
        db.dispose()
    return due_ids


def make_due(db: Any, op_ids: Sequence[str], when: datetime, *, fresh: bool = False) -> None:
    """Make ``op_ids`` due at ``when``; ``fresh`` also restarts their backoff at attempt 0."""
    import sqlalchemy as sa

    from reconciler.storage.tables import OPS

    values: dict[str, Any] = {"next_poll_at": when}
    if fresh:
        values["poll_attempt"] = 0
    with db.write() as conn:
        conn.execute(sa.update(OPS).where(OPS.c.id.in_(list(op_ids))).values(**values))


# --- (a) measuring -------------------------------------------------------------------------


def time_claim(db: Any, owner: str, now: datetime, limit: int) -> tuple[float, int]:
    """One claim transaction plus one release transaction; (seconds, rows claimed)."""
    from reconciler.storage import leases

    started = time.perf_counter()
    with db.write() as conn:
        claims = leases.claim_records(conn, owner, now, 30.0, limit)
    with db.write() as conn:
        leases.release(conn, [op.id for op, _ in claims], owner)
    return time.perf_counter() - started, len(claims)


class InstantProvider:
    """The status endpoint in process: every job is ``running``; counts the reads."""

    def __init__(self) -> None:
        self.reads = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.reads += 1
        job_id = request.url.path.rsplit("/", 1)[-1]
        return httpx.Response(200, json=running_body(job_id))


@dataclass
class TickRig:
    """A worker over one database, driven by hand (scheduler off, manual clock)."""

    runtime: Any
    background: Any
    clock: ManualClock
    provider: InstantProvider
    due_ids: list[str]

    @classmethod
    def build(cls, db_url: str, due_ids: list[str], start: datetime, work: Path) -> TickRig:
        from reconciler.engine.background import Background
        from reconciler.runtime import Runtime

        clock = ManualClock(start)
        provider = InstantProvider()
        runtime = Runtime.build(
            service_settings(db_url, "http://provider.invalid", work),
            clock=clock,
            rng=random.Random(7),
            environ=_environ(),
            transport=httpx.MockTransport(provider),
        )
        runtime.notifier.bind(asyncio.get_running_loop())
        return cls(runtime, Background(runtime, run_scheduler=False), clock, provider, due_ids)

    @property
    def claim_cap(self) -> int:
        """The most one tick claims of the one provider (its share of calls in flight)."""
        cap: int = self.runtime.settings.scheduler.provider_concurrency
        return cap

    async def tick(self) -> tuple[float, float, int]:
        """Make the due set due, then time one tick until its steps finished.

        Returns (wall seconds, CPU seconds of this process, operations claimed); the
        provider answers in process, so the CPU is the tick's own.
        """
        self.clock.advance(1.0)
        await self.runtime.db.run(make_due, self.runtime.db, self.due_ids, self.clock.now())
        worker = self.background.worker
        started, cpu = time.perf_counter(), time.process_time()
        claimed = await worker.tick()
        deadline = started + 120.0
        while worker.in_flight and time.perf_counter() < deadline:
            await asyncio.sleep(0.0005)
        return time.perf_counter() - started, time.process_time() - cpu, claimed

    async def close(self) -> None:
        await self.background.stop()
        await self.runtime.close()


@dataclass
class BenchDb:
    """One benchmark database: where it is and which operations are due."""

    label: str
    size: int
    url: str
    due_ids: list[str]


@contextmanager
def databases(
    backend: str, sizes: Sequence[int], due: int, now: datetime, work: Path, admin: str | None
) -> Iterator[tuple[list[BenchDb], str]]:
    """Seeded databases per size, and an empty migrated one (the RSS baseline)."""
    factory = None
    if backend == "postgresql":
        from tests.support.databases import PostgresFactory

        assert admin is not None
        factory = PostgresFactory(admin)
    try:
        from reconciler.storage import migrate
        from reconciler.storage.database import Database

        made = []
        empty = factory.clone() if factory else f"sqlite:///{work / 'empty.db'}"
        handle = Database(empty)
        migrate.upgrade(handle)
        handle.dispose()
        for size in sizes:
            url = factory.clone() if factory else f"sqlite:///{work / f'{size}.db'}"
            started = time.perf_counter()
            ids = seed(url, size, due, now)
            took = time.perf_counter() - started
            print(f"  seeded {size:>7} operations on {backend} in {took:.1f} s")
            made.append(BenchDb(f"{size // 1000} k" if size >= 1000 else str(size), size, url, ids))
        yield made, empty
    finally:
        if factory is not None:
            factory.close()


def median_ms(values: Sequence[float]) -> str:
    return f"{statistics.median(values) * 1000:8.2f} ms"


def spread_ms(values: Sequence[float]) -> str:
    return f"[{min(values) * 1000:.2f}-{max(values) * 1000:.2f}]"


async def measure_ticks(
    dbs: Sequence[BenchDb], seeded_at: datetime, rounds: int, claim_repeats: int, work: Path
) -> None:
    from reconciler.storage.database import Database

    # The rig's clock starts now and re-dues the due set a second later each tick; the
    # claims look 10 minutes ahead (all of the due set, none of the rest, which is due
    # an hour or more after seeding) and, for an idle claim, before anything was due.
    now = datetime.now(UTC)
    busy_at, idle_at = now + timedelta(minutes=10), seeded_at - timedelta(minutes=5)
    claim: dict[int, list[float]] = {d.size: [] for d in dbs}
    idle: dict[int, list[float]] = {d.size: [] for d in dbs}
    ticks: dict[int, list[float]] = {d.size: [] for d in dbs}
    cpu: dict[int, list[float]] = {d.size: [] for d in dbs}
    handles = {d.size: Database(d.url) for d in dbs}
    rigs = {d.size: TickRig.build(d.url, d.due_ids, now, work) for d in dbs}
    try:
        for d in dbs:  # warm caches and pools once, untimed
            time_claim(handles[d.size], "bench", busy_at, 100)
            await rigs[d.size].tick()
        for _ in range(rounds):
            for d in dbs:
                db = handles[d.size]
                for _ in range(claim_repeats):
                    seconds, got = time_claim(db, "bench", busy_at, 100)
                    assert got == min(100, len(d.due_ids)), got
                    claim[d.size].append(seconds)
                    seconds, got = time_claim(db, "bench", idle_at, 100)
                    assert got == 0
                    idle[d.size].append(seconds)
                seconds, used, got = await rigs[d.size].tick()
                assert got == min(len(d.due_ids), rigs[d.size].claim_cap), got
                ticks[d.size].append(seconds)
                cpu[d.size].append(used)
    finally:
        for rig in rigs.values():
            await rig.close()
        for handle in handles.values():
            handle.dispose()
    reads = {d.size: rigs[d.size].provider.reads for d in dbs}
    _print_ticks(dbs, claim, idle, ticks, reads)
    for d in dbs:
        per_op = statistics.median(cpu[d.size]) * 1000 / max(1, len(d.due_ids))
        print(
            f"  full tick at {d.label}: CPU {statistics.median(cpu[d.size]) * 1000:.0f} ms "
            f"(median), {per_op:.1f} ms per due operation"
        )


def _print_ticks(
    dbs: Sequence[BenchDb],
    claim: dict[int, list[float]],
    idle: dict[int, list[float]],
    ticks: dict[int, list[float]],
    reads: dict[int, int],
) -> None:
    due = len(dbs[0].due_ids)
    print(
        f"  {'in flight':>10} {'due':>5}  {'claim+release (median [min-max])':<36} "
        f"{'idle claim':<12} {'full tick':<28} status reads"
    )
    for d in dbs:
        print(
            f"  {d.size:>10} {due:>5}  {median_ms(claim[d.size])} {spread_ms(claim[d.size]):<24} "
            f"{median_ms(idle[d.size])} {median_ms(ticks[d.size])} "
            f"{spread_ms(ticks[d.size]):<16} {reads[d.size]}"
        )
    small, large = dbs[0].size, dbs[-1].size
    for name, series in (("claim step", claim), ("idle claim", idle), ("full tick", ticks)):
        ratio = statistics.median(series[large]) / statistics.median(series[small])
        floor = min(series[large]) / min(series[small])
        print(
            f"  ratio {dbs[-1].label}/{dbs[0].label} {name:<11} median {ratio:5.2f}, "
            f"best {floor:5.2f}; target <= 1.5"
        )


def measure_rss(dbs: Sequence[BenchDb], empty_url: str, seconds: float, work: Path) -> None:
    targets: list[tuple[str, str, list[str]]] = [("0", empty_url, [])]
    targets += [(str(d.size), d.url, d.due_ids) for d in dbs]
    print(f"  {'in flight':>10}  {'VmRSS':>9}  {'VmHWM':>9}  status reads in {seconds:g} s")
    for label, url, due_ids in targets:
        rss, hwm, reads = rss_run(url, due_ids, seconds, work)
        print(f"  {label:>10}  {rss:7.1f} MB  {hwm:7.1f} MB  {reads}")


def rss_run(
    db_url: str, due_ids: list[str], seconds: float, work: Path
) -> tuple[float, float, int]:
    from reconciler.storage.database import Database

    handle = Database(db_url)
    make_due(handle, due_ids, datetime.now(UTC), fresh=True)
    handle.dispose()
    stub_port, port = free_port(), free_port()
    log = work / "rss.log"
    stub = spawn(["bench/poller.py", "stub", "--port", str(stub_port)], log)
    service = spawn(
        [
            "bench/poller.py",
            "serve",
            "--db",
            db_url,
            "--port",
            str(port),
            "--provider-url",
            f"http://127.0.0.1:{stub_port}",
            "--work",
            str(work),
        ],
        log,
        env=_environ(),
    )
    try:
        wait_ready(f"http://127.0.0.1:{stub_port}/healthz")
        wait_ready(f"http://127.0.0.1:{port}/healthz", timeout=120)
        end = time.monotonic() + seconds
        text = ""
        while time.monotonic() < end:
            time.sleep(min(5.0, max(0.0, end - time.monotonic())))
            text = loopback.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
        rss, hwm = memory(service.pid)
    finally:
        stop(service)
        stop(stub)
    return rss, hwm, status_reads(text)


def status_reads(metrics_text: str) -> int:
    total = 0.0
    for line in metrics_text.splitlines():
        if line.startswith("reconciler_status_requests_total{"):
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


# --- (b) status reads per completed operation -------------------------------------------


class Mode(StrEnum):
    WEBHOOKS = "webhooks arriving"
    LOST = "webhooks lost"


@dataclass(frozen=True)
class Limits:
    deadline_seconds: float = 2400.0
    max_status_requests: int = 1000
    max_transport_failures: int = 3


@dataclass(frozen=True)
class JobRun:
    reads: int
    completed: bool
    seen_after: float  # seconds from the job's end to the read that confirmed it
    outcome: str  # "collect" or the escalation reason


EPOCH = datetime(2025, 4, 18, 10, 20, tzinfo=UTC)
MAX_EVENTS = 100_000


def simulate_job(
    duration: float,
    mode: Mode,
    policy: values.PollPolicy,
    limits: Limits,
    rng: random.Random,
    webhook_delay: float = 0.0,
) -> JobRun:
    """One job on a virtual clock, every poll decided by the real decision core.

    The job is accepted at the epoch and finished from ``duration`` on. With webhooks
    arriving, the provider's final event reaches the service ``webhook_delay`` after the
    end and, as the webhook intake does, marks the operation hinted and makes its next
    read due at once. Jobs do not interact (no shared rate limits), so each one runs on
    its own clock.
    """
    clock = ManualClock(EPOCH)
    end = EPOCH + timedelta(seconds=duration)
    record = values.PollRecord(
        deadline_at=EPOCH + timedelta(seconds=limits.deadline_seconds),
        accepted_at=EPOCH,
        max_status_requests=limits.max_status_requests,
        status_requests_used=0,
        max_transport_failures=limits.max_transport_failures,
    )
    next_read = schedule.first_poll_at(EPOCH, record.deadline_at, rng, policy)
    hint_at = end + timedelta(seconds=webhook_delay) if mode is Mode.WEBHOOKS else None
    for _ in range(MAX_EVENTS):
        if hint_at is not None and hint_at <= next_read:
            next_read, hint_at = hint_at, None
            record = replace(record, hinted=True)
            continue
        clock.set(next_read)
        now = clock.now()
        stop = decisions.before_request(record, now)
        if stop is not None:
            return JobRun(record.status_requests_used, False, 0.0, stop.reason.value)
        record = replace(record, status_requests_used=record.status_requests_used + 1)
        done = now >= end
        observation = values.Observation(
            at=now,
            http_status=200,
            category=RemoteCategory.SUCCESS if done else RemoteCategory.PENDING,
            remote_state="succeeded" if done else "running",
            required_fields_ok=done,
        )
        decision = decisions.decide(record, observation, now, rng, policy)
        seen_after = (now - end).total_seconds()
        if isinstance(decision, values.Collect):
            return JobRun(record.status_requests_used, True, seen_after, "collect")
        if not isinstance(decision, values.Wait):
            reason = getattr(decision, "reason", type(decision).__name__)
            return JobRun(record.status_requests_used, False, seen_after, str(reason))
        counters = decision.counters
        record = replace(
            record,
            poll_attempt=counters.poll_attempt,
            transport_failures_used=counters.transport_failures_used,
            rate_limited_count=counters.rate_limited_count,
            hinted=record.hinted and not counters.hint_consumed,
        )
        next_read = decision.at
    raise RuntimeError("the simulation did not end; the decision core keeps waiting")


def poll_policy(base: float, cap: float, jitter_floor: float) -> values.PollPolicy:
    return values.PollPolicy(backoff=BackoffPolicy(base, cap, jitter_floor))


@dataclass(frozen=True)
class ModeResult:
    name: str
    reads: list[int]
    delays: list[float]
    completed: int
    stopped: dict[str, int]

    @property
    def mean_reads(self) -> float:
        return statistics.fmean(self.reads) if self.reads else float("nan")


def run_mode(
    durations: Sequence[float],
    mode: Mode,
    policy: values.PollPolicy,
    limits: Limits,
    seed_value: int,
    webhook_delay: float = 0.0,
) -> ModeResult:
    rng = random.Random(seed_value)
    reads: list[int] = []
    delays: list[float] = []
    stopped: dict[str, int] = {}
    for duration in durations:
        run = simulate_job(duration, mode, policy, limits, rng, webhook_delay)
        if run.completed:
            reads.append(run.reads)
            delays.append(run.seen_after)
        else:
            stopped[run.outcome] = stopped.get(run.outcome, 0) + 1
    return ModeResult(mode.value, reads, delays, len(reads), stopped)


def naive_mode(durations: Sequence[float], interval: float) -> ModeResult:
    reads = [naive_reads(d, interval) for d in durations]
    delays = [naive_detection_delay(d, interval) for d in durations]
    return ModeResult(f"naive every {interval:g} s", reads, delays, len(reads), {})


def report_reads(args: argparse.Namespace) -> None:
    durations = log_uniform_durations(args.jobs, args.low, args.high, random.Random(args.seed))
    policy = poll_policy(args.base, args.cap, args.jitter_floor)
    limits = Limits(args.deadline, args.budget)
    ours = {
        mode: run_mode(durations, mode, policy, limits, args.seed + 1, args.webhook_delay)
        for mode in Mode
    }
    naive = naive_mode(durations, args.interval)
    print(
        f"  {args.jobs} jobs, durations log-uniform {args.low:g}-{args.high:g} s "
        f"(seed {args.seed}, mean {statistics.fmean(durations):.0f} s); policy base "
        f"{args.base:g} s, max {args.cap:g} s, jitter floor {args.jitter_floor:g}, deadline "
        f"{args.deadline:g} s, budget {args.budget}; webhook delay {args.webhook_delay:g} s"
    )
    print(
        f"  {'mode':<22} {'completed':>9} {'reads/op mean':>14} {'p50':>5} {'p99':>5} "
        f"{'max':>5}   {'end -> confirmed mean / p99 / max':<34}"
    )
    for result in (*ours.values(), naive):
        r, s = summary(result.reads), summary(result.delays)
        stopped = f"  stopped: {result.stopped}" if result.stopped else ""
        print(
            f"  {result.name:<22} {result.completed:>9} {r['mean']:>14.2f} {r['p50']:>5.0f} "
            f"{r['p99']:>5.0f} {r['max']:>5.0f}   {s['mean']:7.1f} s / {s['p99']:6.1f} s / "
            f"{s['max']:6.1f} s{stopped}"
        )
    for mode, result in ours.items():
        print(
            f"  ratio naive/ours ({mode.value}): {naive.mean_reads / result.mean_reads:.1f}x"
            + ("; target >= 5x" if mode is Mode.LOST else "")
        )
    over = sum(1 for n in ours[Mode.LOST].reads if n > 12)
    print(f"  runs needing more than 12 reads (the default budget), webhooks lost: {over}")


# --- (c) webhook trust regimes --------------------------------------------------------------


def report_trust(args: argparse.Namespace) -> None:
    from bench.trust_sim import Fleet, FleetResult, Regime, arrivals

    from reconciler.core.trust import TrustMode, TrustPolicy

    durations = log_uniform_durations(args.jobs, args.low, args.high, random.Random(args.seed))
    starts = arrivals(args.jobs, args.arrival_gap, random.Random(args.seed + 2))
    trusted_max = 10.0 * args.cap
    lead = min(args.cap, max(args.base, 1.0))
    policy = replace(
        poll_policy(args.base, args.cap, args.jitter_floor),
        trusted_max_delay_seconds=trusted_max,
        final_look_seconds=lead,
    )
    trust = TrustPolicy(
        mode=TrustMode.ADAPTIVE,
        trusted_max_delay_seconds=trusted_max,
        webhook_grace_seconds=args.grace,
    )
    limits = (args.deadline, args.budget, 3)
    regimes = [
        Regime("(a) every webhook delivered"),
        Regime("(b) every webhook lost", 0.0, None),
        Regime("(c) outage", args.outage_from, args.outage_until),
    ]
    naive = naive_mode(durations, args.interval)
    print(
        f"  {args.jobs} jobs, durations log-uniform {args.low:g}-{args.high:g} s, arrivals "
        f"every {args.arrival_gap:g} s on average (last at {starts[-1]:.0f} s); trusted max "
        f"{trusted_max:g} s, grace {args.grace:g} s, final look {lead:g} s before the deadline"
    )
    print(
        f"  {'regime / mode':<44} {'done':>5} {'reads/op':>9} {'p99':>5} {'max':>5} "
        f"{'end->confirmed mean/p99/max (s)':>32} {'timed out':>9}"
    )
    for regime in regimes:
        runs: list[FleetResult] = []
        for adaptive in (True, False):
            fleet = Fleet(
                durations,
                starts,
                regime,
                adaptive=adaptive,
                policy=policy,
                trust=trust,
                limits=limits,
                concurrency=16,
                seed=args.seed + 1,
            )
            runs.append(fleet.run())
        for result in runs:
            delays = [(j.confirmed_at or 0) - j.end for j in result.completed]
            r, d = summary([j.reads for j in result.completed]), summary(delays)
            print(
                f"  {regime.name + ', ' + result.mode:<44} {len(result.completed):>5} "
                f"{r['mean']:>9.2f} {r['p99']:>5.0f} {r['max']:>5.0f} "
                f"{d['mean']:>11.1f} /{d['p99']:>7.1f} /{d['max']:>7.1f}   "
                f"{result.stopped().get('result_timed_out', 0):>9}"
            )
        print(
            f"  {regime.name + ', naive every 2 s':<44} {naive.completed:>5} "
            f"{naive.mean_reads:>9.2f}"
        )
        _trust_figures(regime, runs[0], runs[1], naive.mean_reads, trusted_max)


def _trust_figures(
    regime: Any, ours: Any, off: Any, naive_reads: float, trusted_max: float
) -> None:
    moves = ", ".join(
        f"{t.before}->{t.after} at {t.at:.0f} s ({t.verdict.replace('_', '-')}, job {t.job})"
        for t in ours.transitions
    )
    print(
        f"    trust transitions: {moves or 'none'}; stretched waits brought back: {ours.restored}"
    )
    print(
        f"    reads vs trust off: {ours.mean_reads / off.mean_reads:.2f}; "
        f"vs naive 2 s: {ours.mean_reads / naive_reads:.3f}"
    )
    if regime.lost_from is None:
        print(f"    target (a) <= 1.3 reads per completed operation: {ours.mean_reads:.2f}")
    elif regime.lost_until is None:
        print(
            f"    target (b) no more reads than trust off: {ours.mean_reads:.3f} vs "
            f"{off.mean_reads:.3f} per operation"
        )
    else:
        in_outage = [j for j in ours.completed if not regime.delivered(j.end)]
        worst = max(((j.confirmed_at or 0) - j.end for j in in_outage), default=0.0)
        off_worst = max(
            ((j.confirmed_at or 0) - j.end for j in off.completed if not regime.delivered(j.end)),
            default=0.0,
        )
        distrust = next((t for t in ours.transitions if t.after == "distrusted"), None)
        first = ours.first_miss_read
        detected = (
            f"distrusted at {distrust.at:.0f} s by the miss of job {distrust.job}, whose read "
            f"found it at {first:.0f} s (the first miss)"
            if distrust is not None and first is not None
            else "not detected"
        )
        timed_out = sum(
            1 for j in ours.jobs if j.outcome == "result_timed_out" and j.duration < 2400
        )
        print(f"    outage [{regime.lost_from:g}, {regime.lost_until:g}) s: {detected}")
        print(
            f"    {len(in_outage)} jobs ended during it: worst end->confirmed {worst:.0f} s "
            f"(target <= {trusted_max:g} s; trust off {off_worst:.0f} s); result_timed_out "
            f"for jobs that ended in time: {timed_out} (target 0)"
        )


# --- main --------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    stub = sub.add_parser("stub")
    stub.add_argument("--port", type=int, required=True)
    srv = sub.add_parser("serve")
    srv.add_argument("--db", required=True)
    srv.add_argument("--port", type=int, required=True)
    srv.add_argument("--provider-url", required=True)
    srv.add_argument("--work", type=Path, required=True)
    parser.add_argument("--only", choices=["ticks", "rss", "reads", "trust"], action="append")
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument(
        "--due",
        type=int,
        default=SchedulerSettings().provider_concurrency,
        help="operations due at each tick (default: what one tick claims of a provider)",
    )
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--claim-repeats", type=int, default=5)
    parser.add_argument("--rss-seconds", type=float, default=20.0)
    parser.add_argument("--postgres", metavar="ADMIN_URL", default=None)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--low", type=float, default=10.0)
    parser.add_argument("--high", type=float, default=600.0)
    parser.add_argument("--base", type=float, default=REALISTIC["base_delay_seconds"])
    parser.add_argument("--cap", type=float, default=REALISTIC["max_delay_seconds"])
    parser.add_argument("--jitter-floor", type=float, default=REALISTIC["jitter_floor"])
    parser.add_argument("--deadline", type=float, default=REALISTIC["deadline_seconds"])
    parser.add_argument("--budget", type=int, default=int(REALISTIC["max_status_requests"]))
    parser.add_argument("--interval", type=float, default=2.0)
    parser.add_argument("--webhook-delay", type=float, default=0.0)
    parser.add_argument("--arrival-gap", type=float, default=10.0)
    parser.add_argument("--grace", type=float, default=30.0)
    parser.add_argument("--outage-from", type=float, default=3000.0)
    parser.add_argument("--outage-until", type=float, default=5000.0)
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP + "; no RSS part")
    return parser


def run_backend(backend: str, parts: set[str], args: argparse.Namespace, work: Path) -> None:
    sizes = sorted(int(s) for s in args.sizes.split(","))
    print(f"(a) {backend}: {', '.join(map(str, sizes))} in flight, {args.due} due")
    seeded_at = datetime.now(UTC)
    with databases(backend, sizes, args.due, seeded_at, work, args.postgres) as (dbs, empty):
        if "ticks" in parts:
            print(
                f"  tick cost, {args.rounds} rounds (claim: {args.claim_repeats} samples per "
                "round); full tick against an in-process instant provider"
            )
            asyncio.run(measure_ticks(dbs, seeded_at, args.rounds, args.claim_repeats, work))
        if "rss" in parts:
            print("  service RSS (subprocess, stub provider over HTTP, 1 s ticks)")
            measure_rss(dbs, empty, args.rss_seconds, work)


def main() -> int:
    args = _parser().parse_args()
    if args.command == "stub":
        serve_stub(args.port)
        return 0
    if args.command == "serve":
        serve_service(args.db, args.port, args.provider_url, args.work)
        return 0
    smoke(
        args,
        only=["ticks", "reads", "trust"],
        sizes="200,1000",
        rounds=1,
        claim_repeats=1,
        jobs=100,
        postgres=None,
    )
    parts = set(args.only or ["ticks", "rss", "reads", "trust"])
    if "reads" in parts:
        print("(b) status reads per completed operation (virtual clock, real decision core)")
        report_reads(args)
    if "trust" in parts:
        print("(c) webhook trust regimes (virtual clock, real decision and trust cores)")
        report_trust(args)
    if parts & {"ticks", "rss"}:
        work = Path(tempfile.mkdtemp(prefix="bench-poller-"))
        try:
            for backend in ["sqlite"] + (["postgresql"] if args.postgres else []):
                run_backend(backend, parts, args, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
