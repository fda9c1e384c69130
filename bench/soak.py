"""Chaos soak: the service as real processes, a faulty provider, agents, and SIGKILLs.

    python bench/soak.py [--operations 300] [--kills 3] [--seed S] [--rate 10]
        [--replicas 1] [--postgres [--postgres-url URL] | --database-url URL]
        [--max-active 150] [--time-limit SECONDS] [--lease-seconds 8] [--keep] [--smoke]

Runs ``reconciler serve`` (one or more replicas on one database: SQLite by default,
PostgreSQL with ``--postgres``: a throw-away cluster, or a new database on
``--postgres-url``), the simulated provider in a process of its own
(``bench/soak_sim.py``) with random faults on every endpoint (dropped and delayed
answers, 5xx, 429 with Retry-After, 404 before visibility) and random webhook behaviour
(lost, duplicated, delayed, out of order, early lies) spread over the replicas, an agent
load (scenarios, repeated idempotency keys, cancels), a callback receiver that sometimes
fails or hangs, and a completion hook that logs every run. It SIGKILLs replicas at random
moments and restarts them on the same database. Every choice comes from one seed: the
replay command is printed.

At the end it prints the invariants, each a count that must be zero (``soak_checks``
says what each one counts), and the figures: operations per second, status requests per
operation, the lag from the provider's end to the service's. Exit status 0 only when
every count is zero; a failed run keeps its work directory (logs, the witnesses' JSON,
the database or the throw-away cluster's data directory) for a post-mortem.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# Run as a script, bench/ comes first on sys.path; its modules are imported as bench.*:
# leave only the repository's roots.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
for _path in (str(ROOT), str(ROOT / "service")):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import sqlalchemy as sa  # noqa: E402
from bench import soak_checks as checks  # noqa: E402
from bench.soak_infra import (  # noqa: E402
    Delivery,
    Fleet,
    Receiver,
    ServiceSettings,
    SimProcess,
    ThrowawayPostgres,
    audit_verify,
    create_database,
    drop_database,
    make_fleet,
    make_token,
    upgrade,
)
from bench.soak_load import Agent, OpRecord, plan_operations  # noqa: E402
from bench.support import SMOKE_HELP, smoke  # noqa: E402
from tests.support import hooks  # noqa: E402
from tests.support.servers import serve_asgi, unused_port  # noqa: E402

from reconciler.storage.database import Database  # noqa: E402
from reconciler.storage.tables import OPS  # noqa: E402

END = sorted(checks.END)
AGENT_RETRY_SECONDS = 120.0


@dataclass(frozen=True)
class SoakConfig:
    operations: int = 300
    kills: int = 3
    seed: int | None = None
    replicas: int = 1
    rate: float = 10.0
    max_active: int = 150
    database_url: str | None = None  # used as it is (migrated on start)
    postgres: bool = False
    postgres_url: str | None = None  # an admin URL: the soak makes its own database there
    settle_seconds: float = 180.0
    time_limit: float | None = None  # seconds of submissions at most; the rest is skipped
    keep: bool = False
    workdir: Path | None = None
    quiet: bool = False
    service: ServiceSettings = field(default_factory=ServiceSettings)


@dataclass
class KillRecord:
    number: int
    at: float  # seconds since the load started
    submitted: int
    victims: list[tuple[int, int]]  # (replica, pid)
    windows: Counter[str]
    restart_seconds: float = 0.0


@dataclass
class SoakResult:
    seed: int
    replay: str
    backend: str
    invariants: list[checks.Invariant]
    figures: checks.Figures
    kills: list[KillRecord]
    deadline_overshoot: float
    agent_retries: int
    agent_gave_up: int
    planned: int = 0
    truncated: bool = False
    report: str = ""
    trust_verdicts: Mapping[str, int] = field(default_factory=dict)
    trust_withdrawn: int = 0

    @property
    def ok(self) -> bool:
        return all(inv.count == 0 for inv in self.invariants)


def replay_command(cfg: SoakConfig, seed: int) -> str:
    parts = [
        "python bench/soak.py",
        f"--seed {seed}",
        f"--operations {cfg.operations}",
        f"--kills {cfg.kills}",
        f"--replicas {cfg.replicas}",
        f"--rate {cfg.rate:g}",
        f"--max-active {cfg.max_active}",
    ]
    if cfg.service.lease_seconds != ServiceSettings.lease_seconds:
        parts.append(f"--lease-seconds {cfg.service.lease_seconds:g}")
    if cfg.postgres or cfg.postgres_url or (cfg.database_url or "").startswith("postgresql"):
        parts.append("--postgres")
    return " ".join(parts)


# --- watching the database -----------------------------------------------------------------


def _active(db: Database) -> int:
    """Operations still working: not in an end state (escalated counts as settled), or an
    end state whose completion has not finished."""
    with db.read() as conn:
        return int(
            conn.execute(
                sa.select(sa.func.count()).where(
                    sa.or_(
                        sa.and_(OPS.c.state.not_in(END), OPS.c.state != "escalated"),
                        OPS.c.completion_pending.is_(True),
                    )
                )
            ).scalar_one()
        )


def _windows(db: Database, pid: int) -> Counter[str]:
    """Where the work stood when a replica died: a create sent without its job id yet, a
    job id saved before its first read, a cancel or a completion in flight, and more."""
    found: Counter[str] = Counter()
    now = time.time()
    with db.read() as conn:
        rows = conn.execute(
            sa.select(
                OPS.c.state,
                OPS.c.create_attempts,
                OPS.c.status_requests_used,
                OPS.c.completion_pending,
                OPS.c.lease_owner,
                OPS.c.lease_expires_at,
            ).where(sa.or_(OPS.c.state.not_in(END), OPS.c.completion_pending.is_(True)))
        )
        for r in rows:
            if (
                r.lease_owner
                and f":{pid}:" in r.lease_owner
                and r.lease_expires_at.timestamp() > now
            ):
                found["stale leases"] += 1
            if r.completion_pending:
                found["completion pending"] += 1
            elif r.state == "create_unknown" or (r.state == "create_pending" and r.create_attempts):
                found["create sent, job id unknown"] += 1
            elif r.state in ("accepted", "observing") and r.status_requests_used == 0:
                found["job id saved, no poll yet"] += 1
            elif r.state in ("cancel_requested", "cancelling"):
                found["cancel in flight"] += 1
            elif r.state == "result_collecting":
                found["collecting the result"] += 1
            else:
                found[r.state] += 1
        running = conn.execute(
            sa.text("SELECT count(*) FROM completion_steps WHERE status = 'running'")
        )
        found["steps running"] = int(running.scalar_one())
    return +found


# --- the run --------------------------------------------------------------------------------


class Driver:
    def __init__(
        self, cfg: SoakConfig, seed: int, fleet: Fleet, db: Database, agent: Agent
    ) -> None:
        self.cfg = cfg
        self.rng = random.Random(seed)
        self.fleet = fleet
        self.db = db
        self.agent = agent
        self.plans = plan_operations(random.Random(self.rng.random()), cfg.operations, str(seed))
        self.kill_rng = random.Random(self.rng.random())
        self.submitted = 0
        self.active = 0
        self.kills: list[KillRecord] = []
        self.started = time.time()
        self.truncated = False  # the time limit stopped the submissions early

    def log(self, text: str) -> None:
        if not self.cfg.quiet:
            print(f"[{time.time() - self.started:7.1f}s] {text}", flush=True)

    def kill_points(self) -> list[int]:
        n = self.cfg.operations
        if self.cfg.kills <= 0:
            return []
        low, high = max(1, n // 20), max(2, n - n // 20)
        return sorted(self.kill_rng.randint(low, high) for _ in range(self.cfg.kills))

    async def _monitor(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                self.active = await asyncio.to_thread(_active, self.db)
            except Exception as exc:  # a busy database: keep the last figure
                self.log(f"monitor: {type(exc).__name__}")
            await asyncio.sleep(0.5)

    async def _submit_all(self) -> list[OpRecord]:
        tasks = []
        t0 = time.monotonic()
        last_log = 0.0
        limit = self.cfg.time_limit
        for i, plan in enumerate(self.plans):
            due = t0 + i / self.cfg.rate
            while time.monotonic() < due or self.active >= self.cfg.max_active:
                await asyncio.sleep(min(0.05, max(0.001, due - time.monotonic())))
            if limit is not None and time.monotonic() - t0 > limit:
                self.log(f"time limit: stopping after {self.submitted} submissions")
                self.truncated = True
                break
            tasks.append(asyncio.create_task(self.agent.run(plan)))
            self.submitted = i + 1
            self.active += 1
            if time.monotonic() - last_log > 5:
                last_log = time.monotonic()
                self.log(f"submitted {self.submitted}/{len(self.plans)}, active {self.active}")
        return list(await asyncio.gather(*tasks))

    async def _kill_one(self, number: int, point: int) -> None:
        while self.submitted < point:
            await asyncio.sleep(0.02)
        await asyncio.sleep(self.kill_rng.uniform(0.0, 1.0))
        replicas = self.fleet.replicas
        if len(replicas) > 1 and self.kill_rng.random() < 0.2:
            victims = list(replicas)
        else:
            victims = [self.kill_rng.choice(replicas)]
        restart_delay = self.kill_rng.uniform(0.2, 1.5)
        record = KillRecord(
            number,
            time.time() - self.started,
            self.submitted,
            [(r.index, r.pid or 0) for r in victims],
            Counter(),
        )
        for replica in victims:
            self.fleet.mark_down(replica.index)
            replica.kill()
        for _, pid in record.victims:
            record.windows += await asyncio.to_thread(_windows, self.db, pid)
        began = time.monotonic()
        await asyncio.sleep(restart_delay)
        for replica in victims:
            replica.start()
        for replica in victims:
            await asyncio.to_thread(replica.wait_ready)
            self.fleet.mark_up(replica.index)
        record.restart_seconds = time.monotonic() - began
        self.kills.append(record)
        self.log(f"kill #{number}: {describe_kill(record)}")

    async def _killer(self) -> None:
        for number, point in enumerate(self.kill_points(), start=1):
            await self._kill_one(number, point)

    async def run(self) -> list[OpRecord]:
        stop = asyncio.Event()
        monitor = asyncio.create_task(self._monitor(stop))
        killer = asyncio.create_task(self._killer())
        try:
            records = await self._submit_all()
            if self.truncated:
                killer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await killer
                await asyncio.to_thread(self.fleet.ensure_up)
            else:
                await killer
        finally:
            stop.set()
            await monitor
            killer.cancel()
            await self.agent.aclose()
        return records


def describe_kill(k: KillRecord) -> str:
    who = ", ".join(f"replica {i} (pid {pid})" for i, pid in k.victims)
    windows = ", ".join(f"{name} {n}" for name, n in sorted(k.windows.items())) or "idle"
    return (
        f"at {k.at:.1f} s after {k.submitted} submissions, SIGKILL {who}; in flight: {windows}; "
        f"back in {k.restart_seconds:.1f} s"
    )


def settle(db: Database, sim: SimProcess, timeout: float, log: Driver) -> None:
    deadline = time.monotonic() + timeout
    active = _active(db)
    while active and time.monotonic() < deadline:
        time.sleep(1.0)
        active = _active(db)
        log.log(f"settling: {active} operations still working")
    end = time.monotonic() + 15
    while sim.get("stats")["deliveries"]["pending"] and time.monotonic() < end:
        time.sleep(0.5)


def _database(cfg: SoakConfig, work: Path, stack: ExitStack, failed: list[bool]) -> tuple[str, str]:
    if cfg.database_url:
        backend = "postgresql" if cfg.database_url.startswith("postgresql") else "sqlite"
        return cfg.database_url, backend
    if cfg.postgres or cfg.postgres_url:
        admin = cfg.postgres_url
        if admin is None:
            cluster = ThrowawayPostgres()
            stack.callback(lambda: cluster.stop(keep=cfg.keep or any(failed)))
            admin = cluster.start()
        url = create_database(admin)
        stack.callback(lambda: None if cfg.keep or any(failed) else drop_database(admin, url))
        return url, "postgresql"
    return f"sqlite:///{work / 'soak.db'}", "sqlite"


@dataclass
class Witnesses:
    """What the provider, the receiver and the hooks saw, read after the run."""

    jobs: list[dict[str, Any]]
    stats: dict[str, Any]
    deliveries: dict[str, Any]
    callbacks: list[Delivery]

    def dump(self, directory: Path) -> None:
        for name, value in (
            ("sim_jobs", self.jobs),
            ("sim_stats", self.stats),
            ("sim_deliveries", self.deliveries),
            ("callbacks", [asdict(d) for d in self.callbacks]),
        ):
            (directory / f"{name}.json").write_text(json.dumps(value), "utf-8")


def run(cfg: SoakConfig) -> SoakResult:
    seed = cfg.seed if cfg.seed is not None else random.SystemRandom().randrange(1, 2**31)
    rng = random.Random(seed)
    work = cfg.workdir or Path(tempfile.mkdtemp(prefix="soak-"))
    work.mkdir(parents=True, exist_ok=True)
    hook_log = work / "hooks.log"
    settings = replace(cfg.service, hooks=(hooks.RECORD,))
    with ExitStack() as stack:
        failed: list[bool] = []  # set once the verdict is known: keep a failed run's cluster
        db_url, backend = _database(cfg, work, stack, failed)
        ports = [unused_port() for _ in range(cfg.replicas)]
        sim = SimProcess(
            unused_port(),
            rng.randrange(2**31),
            [f"http://127.0.0.1:{port}" for port in ports],
            work / "sim.log",
        )
        stack.callback(sim.stop)
        sim.start()
        receiver = Receiver(random.Random(rng.random()))
        with ExitStack() as servers:
            receiver_url = servers.enter_context(serve_asgi(receiver.app, lifespan="off"))
            fleet = make_fleet(
                work, db_url, sim.url, ports, settings, {hooks.LOG_ENV: str(hook_log)}
            )
            first = fleet.replicas[0]
            upgrade(first.config, first.env)
            token = make_token(first.config, first.env, "soak-agent", "agent")
            servers.callback(fleet.stop_all)
            fleet.start_all()
            db = Database(db_url)
            servers.callback(db.dispose)
            pick = random.Random(rng.random())
            agent = Agent(
                lambda: fleet.pick(pick), token, receiver_url, retry_for=AGENT_RETRY_SECONDS
            )
            driver = Driver(cfg, seed, fleet, db, agent)
            driver.log(f"seed {seed}; {backend}; {cfg.replicas} replica(s); work dir {work}")
            records = asyncio.run(driver.run())
            driver.log("load done; waiting for every operation to settle")
            settle(db, sim, cfg.settle_seconds, driver)
        # The replicas have stopped: what the database and the witnesses hold is final.
        seen = Witnesses(
            sim.get("jobs")["jobs"], sim.get("stats"), sim.get("deliveries"), receiver.snapshot()
        )
        sim.stop()
        code, output = audit_verify(first.config, first.env)
        snapshot = checks.read_db(db_url)
        result = evaluate(cfg, seed, backend, snapshot, seen, hook_log, records, driver)
        result.invariants.append(checks.audit_failures(code, output))
        result.report = render(result)
        failed.append(not result.ok)
        if not result.ok or cfg.keep:
            seen.dump(work)
    if result.ok and not cfg.keep and cfg.workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    elif not cfg.quiet:
        print(f"logs, witnesses and database kept in {work}; database {db_url}")
    return result


def evaluate(
    cfg: SoakConfig,
    seed: int,
    backend: str,
    db: checks.DbSnapshot,
    seen: Witnesses,
    hook_log: Path,
    records: Sequence[OpRecord],
    driver: Driver,
) -> SoakResult:
    sim = checks.read_sim(seen.jobs, seen.stats, seen.deliveries)
    runs = hooks.read_runs(hook_log)
    deliveries = seen.callbacks
    steps = checks.step_checks(db, runs, deliveries)
    tol = checks.Tolerances()
    late, worst = checks.past_deadline(db, sim, tol)
    invariants = [
        checks.jobs_per_key(db, sim),
        checks.steps_run_twice(steps, runs),
        checks.unfinished(db),
        checks.webhooks_lost(db, sim),
        late,
        checks.over_budget(db, sim),
        checks.before_retry_after(sim, tol),
        checks.lost_jobs(db, sim),
        checks.completion_unfinished(db, steps),
        checks.contradicts_provider(db, sim),
        checks.agent_answers(records),
    ]
    figures = checks.figures(db, sim, steps, deliveries, driver.started)
    return SoakResult(
        seed,
        replay_command(cfg, seed),
        backend,
        invariants,
        figures,
        driver.kills,
        worst,
        driver.agent.retries,
        checks.agent_gave_up(records),
        planned=cfg.operations,
        truncated=driver.truncated,
        trust_verdicts=db.verdicts,
        trust_withdrawn=db.trust_withdrawn,
    )


def render(r: SoakResult) -> str:
    f = r.figures
    lines = [
        f"soak: seed {r.seed}, {f.operations} operations"
        + (f" (of {r.planned} planned: the time limit stopped submissions)" if r.truncated else "")
        + f", {len(r.kills)} kills, {r.backend}",
        f"replay: {r.replay}",
        "kills:",
        *(f"  #{k.number} {describe_kill(k)}" for k in r.kills),
        "invariants (each count must be 0):",
    ]
    for inv in r.invariants:
        lines.append(f"  {inv.count:5d}  {inv.name}")
        lines += [f"         - {b}" for b in inv.breaches[:5]]
    lines += [
        "what is counted:",
        *(f"  {inv.name}: {inv.what}." for inv in r.invariants),
        "figures:",
        f"  operations: {f.operations} in {f.seconds:.1f} s = {f.ops_per_second:.2f} per second "
        "(first submission to last end state)",
        f"  status requests: {f.status_requests} = {f.status_per_op:.2f} per operation",
        "  lag from the provider's terminal state to the service's end state: "
        + checks.lag_line(f.lags),
        f"  latest status request after a deadline: {r.deadline_overshoot:+.2f} s "
        "(negative: all before)",
        "  end states: " + ", ".join(f"{k} {v}" for k, v in sorted(f.states.items())),
        "  escalations by reason: "
        + (", ".join(f"{k} {v}" for k, v in sorted(f.escalation_reasons.items())) or "none"),
        f"  completion steps re-run after a kill interrupted them: {f.reruns_after_interruption}",
        "  webhook trust verdicts: "
        + (", ".join(f"{k} {v}" for k, v in sorted(r.trust_verdicts.items())) or "none")
        + f"; stretched waits brought back on distrust: {r.trust_withdrawn}",
        f"  webhook delivery attempts: {f.webhook_attempts}; callback deliveries: "
        f"{f.callback_deliveries}; agent retries through outages: {r.agent_retries} "
        f"({r.agent_gave_up} requests gave up after {AGENT_RETRY_SECONDS:g} s)",
        "  provider answers: "
        + "; ".join(
            f"{ep} " + ", ".join(f"{s} {n}" for s, n in sorted(c.items()))
            for ep, c in sorted(f.requests.items())
        ),
        f"RESULT: {'OK' if r.ok else 'FAILED'} ({sum(i.count for i in r.invariants)} breaches)",
    ]
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python bench/soak.py", description=__doc__.split("\n")[0])
    p.add_argument("--operations", type=int, default=300)
    p.add_argument("--kills", type=int, default=3)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--rate", type=float, default=10.0, help="submissions per second at most")
    p.add_argument("--max-active", type=int, default=150, help="operations in flight at most")
    p.add_argument("--postgres", action="store_true", help="PostgreSQL (throw-away cluster)")
    p.add_argument("--postgres-url", default=None, help="admin URL of an existing PostgreSQL")
    p.add_argument("--database-url", default=None, help="use this database as it is")
    p.add_argument("--settle-seconds", type=float, default=180.0)
    p.add_argument(
        "--time-limit",
        type=float,
        default=None,
        help="stop submitting after this many seconds and check what was submitted",
    )
    p.add_argument("--lease-seconds", type=float, default=ServiceSettings.lease_seconds)
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--smoke", action="store_true", help=SMOKE_HELP + "; its invariants are checked")
    return p


def _stop_on_term(signum: int, frame: object) -> None:
    # Unwind normally so the replicas, the provider and a throw-away cluster are stopped.
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _stop_on_term)
    args = _parser().parse_args(argv)
    smoke(args, operations=6, kills=1, rate=50.0, lease_seconds=2.0, seed=args.seed or 7)
    cfg = SoakConfig(
        operations=args.operations,
        kills=args.kills,
        seed=args.seed,
        replicas=args.replicas,
        rate=args.rate,
        max_active=args.max_active,
        database_url=args.database_url,
        postgres=args.postgres,
        postgres_url=args.postgres_url,
        settle_seconds=args.settle_seconds,
        time_limit=args.time_limit,
        keep=args.keep,
        quiet=args.quiet,
        service=ServiceSettings(lease_seconds=args.lease_seconds),
    )
    if cfg.replicas > 1 and not (cfg.postgres or cfg.postgres_url or cfg.database_url):
        print("several replicas need PostgreSQL (--postgres)", file=sys.stderr)
        return 2
    result = run(cfg)
    print(result.report)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
