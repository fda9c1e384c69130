"""``reconciler demo``: the whole system on loopback, with a mixed batch of operations.

Two simulated providers (``reconciler.demo.sim``, shipped in the package) run as
subprocesses: ``sim``, whose webhooks arrive, and ``sim-lossy``, which loses or lies
about them; each earns or loses its own webhook trust, and the
summary shows each on its own. The service runs in this process on a fresh
SQLite file in the demo directory, next to a callback receiver that verifies
and counts every delivery. The batch goes through the real agent API; the run
exits 0 only when every operation ended or escalated with a reason within the
time bound, each finished operation's callback arrived exactly once and
``audit verify`` passes. The summary is drawn by ``demo_report``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import dataclasses
import importlib.resources
import logging
import os
import random
import secrets
import shutil
import signal
import threading
import time
import tomllib
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from reconciler import logs
from reconciler.app import create_app
from reconciler.config import CallbackSettings, SchedulerSettings, ServerSettings, Settings
from reconciler.core.callback_secrets import agent_key, as_whsec
from reconciler.core.errors import DemoFailed
from reconciler.core.trust import TrustView
from reconciler.core.vocabulary import Scope
from reconciler.demo.mcp_walk import McpWalk, walk
from reconciler.demo.processes import (
    HOST,
    CallbackReceiver,
    bound_socket,
    run_sim,
    serve_in_thread,
    url_of,
)
from reconciler.demo.report import (
    OpOutcome,
    ProgressView,
    RunReport,
    Snapshot,
    TrustSummary,
    make_view,
    render_report,
    settled,
)
from reconciler.runtime import Runtime
from reconciler.storage import audit, migrate
from reconciler.storage.database import Database
from reconciler.storage.tokens import callback_salt, create_token

# Two simulated providers, each its own process and its own webhook trust: one announces
# its jobs' ends by webhook (it earns trust, and its jobs cost one read each), the other
# loses or lies about them (its misses distrust it, and its jobs are polled normally).
# On one provider, a lost webhook under trust is found only by the final look before
# the deadline (a minute late here), and every loss costs the healthy jobs their trust.
PROVIDER = "sim"
LOSSY_PROVIDER = "sim-lossy"
PROVIDERS = (PROVIDER, LOSSY_PROVIDER)
MARKER = ".reconciler-demo"
WATCH_INTERVAL = 0.5
# The demo's own polling values: short enough for a one-minute run, long enough that
# webhooks (not the fallback poller) bring most answers.
DEMO_POLLING = {
    "base_delay_seconds": 1.0,
    "max_delay_seconds": 10.0,
    "jitter_floor": 0.5,
    "deadline_seconds": 60,
    "max_status_requests": 30,
    "max_transport_failures": 5,
    "max_rate_limited": 4,
    "rate_limit_delay_seconds": 2.0,
    # Webhook trust, scaled to a one-minute run: trust is earned after 6 webhook-first
    # completions (the default 20 would take most of the batch) and a webhook may come up
    # to 3 s after a read found the end before it counts as a miss.
    "trust_after": 6,
    "webhook_grace_seconds": 3,
}
# The batch goes in two waves. The first is a warm-up: WARMUP_COUNT jobs whose provider
# announces their end by webhook (enough webhook-first completions to earn trust), plus
# the rate-limit storm, whose 429s must meet the normal schedule to escalate as
# rate_limited rather than run into its deadline. The second, everything else, is sent
# once the provider is trusted (or after TRUST_WAIT_SECONDS without): its healthy jobs
# then cost one confirmation read each, and its first lost webhook shows the outage
# response (distrust, stretched waits brought back) and the final look.
WARMUP_KINDS = ("webhooks_delivered", "webhooks_duplicated")
WARMUP_COUNT = 8
ALWAYS_FIRST = frozenset({"rate_limit_storm"})
TRUST_WAIT_SECONDS = 25.0
JUDGE_WAIT_SECONDS = float(DEMO_POLLING["webhook_grace_seconds"]) + 1.5
# --quick: one short operation per path the summary checks (a webhook that arrives, a
# lost one found by polling, an escalation, a cancel), a repeated key, the MCP job and
# the audit; no job runs longer than QUICK_SECONDS (a cancel ends its own).
QUICK_KINDS = ("webhooks_delivered", "webhooks_lost", "unknown_state", "cancelled")
QUICK_SECONDS = 3.0


@dataclass(frozen=True)
class DemoOptions:
    operations: int = 50
    seed: int = 7
    timeout: float = 120.0
    keep: bool = False
    quick: bool = False
    directory: Path = Path("demo-run")
    keep_serving: bool = False  # after the summary, serve the console until Ctrl-C


# --- the scenario mix (pure) ----------------------------------------------------------


def _secs(rng: random.Random, low: float, high: float) -> float:
    return round(rng.uniform(low, high), 1)


def _job(scenario: str, rng: random.Random, low: float, high: float, **knobs: Any) -> Any:
    # The demo's provider announces a job's end by webhook, not its start: a "running"
    # event would bring one more (pending) read forward per job, whatever the trust.
    return {
        "scenario": scenario,
        "duration": _secs(rng, low, high),
        "webhooks": "normal",
        "webhook_on_running": False,
        **knobs,
    }


# Each builds a create body for the simulated provider (see reconciler.demo.sim).
KINDS: dict[str, Callable[[random.Random], dict[str, Any]]] = {
    "webhooks_delivered": lambda r: _job("success", r, 1, 20),
    "webhooks_lost": lambda r: _job("success", r, 1, 20, webhooks="never"),
    "webhooks_duplicated": lambda r: _job("success", r, 1, 20, webhooks="duplicate"),
    "webhooks_lying": lambda r: _job("success", r, 4, 20, webhooks="early_lie"),
    "webhooks_out_of_order": lambda r: _job("success", r, 1, 15, webhooks="out_of_order"),
    # Late by less than the grace (3 s): a late webhook, not a miss.
    "webhooks_delayed": lambda r: _job("success", r, 1, 15, webhooks="delayed", webhook_delay=2),
    "slow_job": lambda r: _job("slow_success", r, 14, 20),
    "late_failure": lambda r: _job("late_failure", r, 5, 10),
    "partial_results": lambda r: _job("partial", r, 2, 8, failed_items=r.randint(1, 5)),
    "rate_limit_burst": lambda r: _job(
        "success", r, 3, 8, status_fault=429, status_fault_count=3, retry_after=1
    ),
    "rate_limit_storm": lambda r: _job(
        "success", r, 15, 20, webhooks="never", status_fault=429, retry_after=1
    ),
    "unknown_state": lambda r: _job("unknown_state", r, 2, 6),
    "cancelled": lambda r: _job("slow_success", r, 30, 30),
}
CANCEL_AFTER = {"cancelled": (2.0, 5.0)}
# The scenarios whose provider loses or lies about webhooks go to the lossy provider.
LOSSY_KINDS = frozenset({"webhooks_lost", "webhooks_lying"})
# How each scenario ends (the state, and the reason when it escalates); the report fails
# the run when an operation ends otherwise, so trust can never buy fewer reads with a
# different outcome.
EXPECTED_ENDS: dict[str, str] = {
    "webhooks_delivered": "succeeded",
    "webhooks_lost": "succeeded",
    "webhooks_duplicated": "succeeded",
    "webhooks_lying": "succeeded",
    "webhooks_out_of_order": "succeeded",
    "webhooks_delayed": "succeeded",
    "slow_job": "succeeded",
    "late_failure": "failed",
    "partial_results": "completed_with_errors",
    "rate_limit_burst": "succeeded",
    "rate_limit_storm": "escalated:rate_limited",
    "unknown_state": "escalated:unknown_state",
    "cancelled": "cancelled",
}
# Every scenario once (the cancellation twice) before the random fill; a small batch
# takes a prefix.
REQUIRED = (
    "webhooks_delivered",
    "webhooks_lost",
    "webhooks_duplicated",
    "webhooks_lying",
    "late_failure",
    "partial_results",
    "rate_limit_storm",
    "unknown_state",
    "cancelled",
    "rate_limit_burst",
    "slow_job",
    "webhooks_out_of_order",
    "webhooks_delayed",
    "cancelled",
)
FILL_WEIGHTS = {
    "webhooks_delivered": 4,
    "webhooks_lost": 3,
    "webhooks_duplicated": 2,
    "slow_job": 2,
    "webhooks_lying": 1,
    "webhooks_out_of_order": 1,
    "webhooks_delayed": 1,
    "partial_results": 1,
}


@dataclass(frozen=True)
class Planned:
    index: int
    kind: str
    request: dict[str, Any]
    key: str
    cancel_after: float | None = None

    @property
    def provider(self) -> str:
        return LOSSY_PROVIDER if self.kind in LOSSY_KINDS else PROVIDER


def plan_batch(
    count: int, rng: random.Random, seed: int, required: tuple[str, ...] = REQUIRED
) -> list[Planned]:
    """``count`` operations across the scenarios, in a seeded random order."""
    kinds = list(required[:count])
    names, weights = zip(*FILL_WEIGHTS.items(), strict=True)
    kinds += rng.choices(names, weights=weights, k=count - len(kinds))
    rng.shuffle(kinds)
    planned = []
    for index, kind in enumerate(kinds):
        request = {**KINDS[kind](rng), "item": f"demo-{index:03d}"}
        window = CANCEL_AFTER.get(kind)
        cancel_after = _secs(rng, *window) if window else None
        key = f"demo-{seed}-{index:03d}"
        planned.append(Planned(index, kind, request, key, cancel_after))
    return planned


def plan_quick(rng: random.Random, seed: int) -> list[Planned]:
    """The --quick batch: QUICK_KINDS once each, in a seeded order, each job short."""

    def shortened(p: Planned) -> Planned:
        if p.cancel_after is not None:
            return p
        request = {**p.request, "duration": min(p.request["duration"], QUICK_SECONDS)}
        return dataclasses.replace(p, request=request)

    return [shortened(p) for p in plan_batch(len(QUICK_KINDS), rng, seed, QUICK_KINDS)]


def first_wave(planned: list[Planned]) -> list[Planned]:
    """The warm-up wave (see WARMUP_KINDS): sent before the rest, in plan order."""
    warm = [p for p in planned if p.kind in WARMUP_KINDS][:WARMUP_COUNT]
    return [p for p in planned if p in warm or p.kind in ALWAYS_FIRST]


def pick_repeats(planned: list[Planned], rng: random.Random) -> list[Planned]:
    """A few submissions to send again, same key and request: each must get its operation."""
    candidates = [p for p in planned if p.cancel_after is None]
    return rng.sample(candidates, min(len(candidates), max(1, len(planned) // 16)))


# --- where things live -----------------------------------------------------------------


def prepare_directory(path: Path) -> Path:
    """A fresh demo directory; an existing one is wiped only if an earlier demo made it."""
    path = path.resolve()
    if path.exists():
        if not (path / MARKER).exists() and any(path.iterdir()):
            raise DemoFailed(f"{path} exists and was not made by the demo; refusing to wipe it")
        shutil.rmtree(path)
    path.mkdir(parents=True)
    (path / MARKER).write_text("made by reconciler demo; wiped at every run\n")
    (path / "providers").mkdir()
    return path


def _whsec() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode("ascii")


# --- the service -----------------------------------------------------------------------


def demo_settings(base: Settings, workdir: Path, sim_urls: dict[str, str]) -> Settings:
    """The service's settings: one provider table (the sim's) per simulated provider."""
    sim_toml = importlib.resources.files("reconciler.demo") / "sim" / "sim.toml"
    with sim_toml.open("rb") as fh:
        template = tomllib.load(fh)["providers"]["sim"]
    providers = {}
    for name, url in sim_urls.items():
        table = copy.deepcopy(template)
        table["base_url"] = url
        table["polling"] = {**table.get("polling", {}), **DEMO_POLLING}
        providers[name] = table
    return base.model_copy(
        update={
            "database_url": f"sqlite:///{workdir / 'reconciler.db'}",
            "providers_dir": str(workdir / "providers"),
            "providers": providers,
            "hooks": (),
            "server": ServerSettings(wait_max_seconds=30.0),
            "scheduler": SchedulerSettings(tick_seconds=0.5, lease_seconds=10.0),
            "callbacks": CallbackSettings(
                allow_hosts=(HOST,),
                max_attempts=5,
                timeout_seconds=5.0,
                base_delay_seconds=0.5,
                max_delay_seconds=5.0,
            ),
        }
    )


@contextmanager
def service_logs(path: Path, level: str) -> Iterator[None]:
    """The service's log lines go to a file in the demo directory, not the terminal."""
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logs.JsonFormatter())
    root = logging.getLogger()
    handlers_before, level_before = root.handlers[:], root.level
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("httpx", "apscheduler"):
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        yield
    finally:
        root.handlers[:] = handlers_before
        root.setLevel(level_before)
        handler.close()


def _make_tokens(runtime: Runtime) -> tuple[str, str, str]:
    """The agent's and the operator's tokens, and the agent's own callback secret."""
    now = runtime.clock.now()
    with runtime.db.write() as conn:
        agent = create_token(conn, "demo-agent", Scope.AGENT.value, now)
        operator = create_token(conn, "demo-operator", Scope.OPERATOR.value, now)
        salt = callback_salt(conn, "demo-agent")
    assert runtime.callback_key is not None and salt is not None
    return agent, operator, as_whsec(agent_key(runtime.callback_key, salt))


# --- driving the batch -----------------------------------------------------------------


@dataclass(frozen=True)
class Submitted:
    planned: Planned
    op_id: str
    at: float  # epoch seconds


def _epoch(value: Any) -> float | None:
    return datetime.fromisoformat(value).timestamp() if isinstance(value, str) else None


def _refusal(response: httpx.Response) -> str:
    try:
        error = response.json().get("error")
        message = error.get("message") if isinstance(error, dict) else error
    except (ValueError, AttributeError):
        message = None
    return f"HTTP {response.status_code}" + (f": {message}" if message else "")


class Driver:
    """Submits, cancels and watches the batch through the agent API."""

    def __init__(
        self,
        service: httpx.AsyncClient,
        sims: dict[str, httpx.AsyncClient],
        tokens: tuple[str, str],
        callback_url: str,
        receiver: CallbackReceiver,
        trust: Callable[[], dict[str, TrustView]] | None = None,
        started: float | None = None,
    ) -> None:
        self.service, self.sims = service, sims
        self.trust = trust
        self.started = time.monotonic() if started is None else started
        # Per provider: (seconds into the run, state) at each change.
        self.trust_seen: dict[str, list[tuple[float, str]]] = {}
        self.agent = {"Authorization": f"Bearer {tokens[0]}"}
        self.operator = {"Authorization": f"Bearer {tokens[1]}"}
        self.callback_url = callback_url
        self.receiver = receiver
        self.submitted: dict[int, Submitted] = {}
        self.repeats: list[tuple[str, str | None]] = []
        self.cancels: list[asyncio.Task[None]] = []

    async def post(self, planned: Planned) -> tuple[str, float, int]:
        body = {
            "provider": planned.provider,
            "request": planned.request,
            "idempotency_key": planned.key,
            "callback_url": self.callback_url,
            "metadata": {"demo_scenario": planned.kind},
        }
        at = time.time()
        response = await self.service.post("/v1/operations", json=body, headers=self.agent)
        if response.status_code not in (200, 202):
            raise DemoFailed(f"submitting {planned.kind} was refused: {_refusal(response)}")
        op_id: str = response.json()["id"]
        return op_id, at, response.status_code

    async def submit_all(self, planned: list[Planned], repeats: list[Planned]) -> None:
        """Submit the batch in its two waves (a few at a time), schedule its cancels, then
        send the repeats."""
        limit = asyncio.Semaphore(8)

        async def one(p: Planned) -> None:
            async with limit:
                op_id, at, _ = await self.post(p)
            sub = self.submitted[p.index] = Submitted(p, op_id, at)
            if p.cancel_after is not None:
                self.cancels.append(asyncio.create_task(self.cancel_later(sub, p.cancel_after)))

        first = first_wave(planned)
        await asyncio.gather(*(one(p) for p in first))
        await self.wait_for_trust(TRUST_WAIT_SECONDS, sum(p.kind in WARMUP_KINDS for p in first))
        await asyncio.gather(*(one(p) for p in planned if p not in first))
        for p in repeats:
            op_id, _, status = await self.post(p)
            self.repeats.append((self.submitted[p.index].op_id, op_id if status == 200 else None))

    async def trust_state(self, elapsed: float) -> str | None:
        """Each provider's trust state now, noted in its timeline when it changed; the
        healthy provider's is returned."""
        if self.trust is None:
            return None
        views = await asyncio.to_thread(self.trust)
        for name, view in views.items():
            text = view.state.value if view.state is not None else "off"
            seen = self.trust_seen.setdefault(name, [])
            if not seen or seen[-1][1] != text:
                seen.append((elapsed, text))
        return self.trust_seen[PROVIDER][-1][1]

    async def wait_for_trust(self, bound: float, warmups: int) -> None:
        """Wait (bounded) for the warm-up to earn trust; not at all when it cannot."""
        if self.trust is None:
            return
        if warmups < (await asyncio.to_thread(self.trust))[PROVIDER].trust_after:
            return
        started = time.monotonic()
        while time.monotonic() - started < bound:
            if await self.trust_state(time.monotonic() - self.started) in (None, "off", "trusted"):
                return
            await asyncio.sleep(WATCH_INTERVAL / 2)

    async def cancel_later(self, sub: Submitted, after: float) -> None:
        await asyncio.sleep(max(0.0, sub.at + after - time.time()))
        response = await self.service.post(
            f"/v1/operations/{sub.op_id}/cancel",
            json={"reason": "demo: the agent no longer needs this result"},
            headers=self.agent,
        )
        # 409: it ended first, which the summary shows as its end state.
        if response.status_code not in (202, 409):
            raise DemoFailed(f"cancelling {sub.op_id} was refused: {_refusal(response)}")

    async def operations(self) -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        params: dict[str, Any] = {"limit": 200}
        while True:
            response = await self.service.get(
                "/v1/operations", params=params, headers=self.operator
            )
            if response.status_code != 200:
                raise DemoFailed(f"listing operations failed: {_refusal(response)}")
            page = response.json()
            found.update((op["id"], op) for op in page["operations"])
            if not page.get("next_cursor"):
                return found
            params["cursor"] = page["next_cursor"]

    async def status_requests(self) -> int:
        total = 0
        for sim in self.sims.values():
            response = await sim.get("/_sim/stats")
            counts = response.json().get("requests", {}).get("status", {})
            total += int(sum(counts.values()))
        return total

    async def sim_jobs(self) -> dict[str, dict[str, Any]]:
        jobs: dict[str, dict[str, Any]] = {}
        for sim in self.sims.values():
            response = await sim.get("/_sim/jobs")
            jobs.update((job["job_id"], job) for job in response.json()["jobs"])
        return jobs

    def states(self, planned: list[Planned], ops: dict[str, dict[str, Any]]) -> list[str]:
        """Each planned operation's state now ("submitting" until it has an id)."""
        result = []
        for p in planned:
            sub = self.submitted.get(p.index)
            result.append(
                ops.get(sub.op_id, {}).get("state", "submitting") if sub else "submitting"
            )
        return result

    def answered(self, planned: list[Planned], ops: dict[str, dict[str, Any]]) -> bool:
        """Every operation settled, and every finished one's callback arrived."""
        cbs, _ = self.receiver.counts()
        for p in planned:
            sub = self.submitted.get(p.index)
            op = ops.get(sub.op_id) if sub else None
            if op is None or not settled(op["state"]) or (op["done"] and cbs[op["id"]] < 1):
                return False
        return True


def _snapshot(
    elapsed: float, planned: list[Planned], states: list[str], requests: int, cbs: int
) -> Snapshot:
    by_kind: dict[str, Counter[str]] = {}
    for p, state in zip(planned, states, strict=True):
        by_kind.setdefault(p.kind, Counter())[state] += 1
    return Snapshot(elapsed, len(planned), Counter(states), by_kind, requests, cbs)


async def drive(
    driver: Driver,
    plan: tuple[list[Planned], list[Planned]],
    view: ProgressView,
    started: float,
    deadline: float,
) -> dict[str, dict[str, Any]]:
    """Run the batch until everything is answered or the deadline; the last operations seen."""
    planned, repeats = plan
    submitting = asyncio.create_task(driver.submit_all(planned, repeats))
    try:
        while True:
            ops = await driver.operations()
            cbs, _ = driver.receiver.counts()
            requests = await driver.status_requests()
            elapsed = time.monotonic() - started
            await driver.trust_state(elapsed)
            states = driver.states(planned, ops)
            view.update(_snapshot(elapsed, planned, states, requests, sum(cbs.values())))
            if submitting.done():
                submitting.result()  # a refused submission ends the run here
                if driver.answered(planned, ops):
                    break
            if time.monotonic() >= deadline:
                break
            await asyncio.sleep(WATCH_INTERVAL)
    finally:
        for task in [submitting, *driver.cancels]:
            task.cancel()
        await asyncio.gather(submitting, *driver.cancels, return_exceptions=True)
    # A late duplicate callback would show up in this pause rather than go unseen.
    await asyncio.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
    return await driver.operations()


def _final_at(job: dict[str, Any] | None) -> float | None:
    if job is None:
        return None
    for step in job.get("timeline", []):
        if step["state"] not in ("queued", "running", "cancelling"):
            return float(step["at"])
    return None


def outcomes(
    subs: list[Submitted],
    ops: dict[str, dict[str, Any]],
    jobs: dict[str, dict[str, Any]],
    cbs: Counter[str],
) -> list[OpOutcome]:
    result = []
    for sub in subs:
        op = ops.get(sub.op_id, {})
        job = jobs.get(op.get("remote_job_id") or "")
        escalation = op.get("escalation") or {}
        result.append(
            OpOutcome(
                op_id=sub.op_id,
                kind=sub.planned.kind,
                provider=sub.planned.provider,
                state=op.get("state", "unknown"),
                submitted_at=sub.at,
                done_at=_epoch(op.get("done_at")),
                provider_final_at=_final_at(job),
                status_requests=job["counts"]["status"] if job else None,
                callbacks=cbs[sub.op_id],
                escalation_reason=escalation.get("reason"),
                escalation_message=escalation.get("message"),
            )
        )
    return result


# --- the whole run ---------------------------------------------------------------------


@dataclass(frozen=True)
class BatchResult:
    outcomes: list[OpOutcome]
    repeats: list[tuple[str, str | None]]
    rejected_callbacks: int
    problems: list[str]
    trust: tuple[TrustSummary, ...] = ()


async def run_batch(
    urls: tuple[str, dict[str, str], str],
    tokens: tuple[str, str],
    receiver: CallbackReceiver,
    plan: tuple[list[Planned], list[Planned]],
    started: float,
    deadline: float,
    trust: Callable[[], dict[str, TrustView]] | None = None,
) -> BatchResult:
    service_url, sim_urls, callback_url = urls
    async with (
        httpx.AsyncClient(base_url=service_url, timeout=30.0, trust_env=False) as service,
        contextlib.AsyncExitStack() as stack,
    ):
        sims = {
            name: await stack.enter_async_context(
                httpx.AsyncClient(base_url=url, timeout=30.0, trust_env=False)
            )
            for name, url in sim_urls.items()
        }
        driver = Driver(service, sims, tokens, callback_url, receiver, trust, started)
        with make_view() as view:
            ops = await drive(driver, plan, view, started, deadline)
        # The last completions a read found first are judged once their grace is over:
        # wait for that (bounded), so the trust state shown includes them.
        await asyncio.sleep(min(JUDGE_WAIT_SECONDS, max(0.0, deadline - time.monotonic())))
        jobs = await driver.sim_jobs()
        await driver.trust_state(time.monotonic() - started)
    cbs, rejected = receiver.counts()
    subs = [driver.submitted[i] for i in sorted(driver.submitted)]
    problems = []
    missing = len(plan[0]) - len(subs) + len(plan[1]) - len(driver.repeats)
    if missing:
        problems.append(f"{missing} submission(s) were not answered before the time bound")
    summary: tuple[TrustSummary, ...] = ()
    if trust is not None:
        views = await asyncio.to_thread(trust)
        summary = tuple(
            TrustSummary(tuple(driver.trust_seen.get(name, ())), view)
            for name, view in views.items()
        )
    return BatchResult(outcomes(subs, ops, jobs, cbs), driver.repeats, rejected, problems, summary)


def _audit(url: str, key: bytes | None) -> tuple[bool, str]:
    db = Database(url)
    try:
        report = audit.verify(db, key)
    finally:
        db.dispose()
    if report.fault is not None:
        return False, f"audit FAILED: {report.fault.describe()}"
    entries = f"{report.operations} operations, {report.entries} history entries intact"
    return True, f"audit ok: {entries}"


@dataclass(frozen=True)
class DemoSecrets:
    webhook: str = dataclasses.field(default_factory=_whsec, repr=False)
    callback: str = dataclasses.field(default_factory=_whsec, repr=False)
    sim_token: str = dataclasses.field(
        default_factory=lambda: secrets.token_urlsafe(24), repr=False
    )

    def service_env(self) -> dict[str, str]:
        return {
            **os.environ,
            "SIM_TOKEN": self.sim_token,
            "SIM_WEBHOOK_SECRETS": self.webhook,
            "RECONCILER_CALLBACK_SECRET": self.callback,
        }

    def sim_env(self) -> dict[str, str]:
        return {**os.environ, "SIM_TOKEN": self.sim_token, "SIM_WEBHOOK_SECRET": self.webhook}


def _run(options: DemoOptions, base: Settings, workdir: Path, started: float) -> RunReport:
    rng = random.Random(options.seed)
    if options.quick:
        planned = plan_quick(rng, options.seed)
    else:
        planned = plan_batch(options.operations, rng, options.seed)
    repeats = pick_repeats(planned, rng)
    keys = DemoSecrets()
    environ = keys.service_env()
    print(f"reconciler demo: {len(planned)} operations, seed {options.seed}, files in {workdir}")
    with ExitStack() as stack:
        stack.enter_context(service_logs(workdir / "service.log", base.log_level))
        receiver = CallbackReceiver(keys.callback)
        receiver_url = stack.enter_context(serve_in_thread(receiver.app, "callback receiver"))
        # The sim needs the service's URL (webhooks) and the service the sim's (base_url):
        # bind the service's socket first.
        service_sock = bound_socket()
        stack.callback(service_sock.close)
        sim_urls = {
            name: stack.enter_context(
                run_sim(
                    workdir / f"{name}.log",
                    keys.sim_env(),
                    f"{url_of(service_sock)}/webhooks/{name}",
                )
            )
            for name in PROVIDERS
        }
        settings = demo_settings(base, workdir, sim_urls)
        runtime = Runtime.build(settings, environ=environ)
        migrate.upgrade(runtime.db)
        *tokens, agent_secret = _make_tokens(runtime)
        receiver.trust(agent_secret)
        service_url = stack.enter_context(
            serve_in_thread(
                create_app(runtime), "service", service_sock, runtime.notifier.close_waits
            )
        )
        sims_text = ", ".join(f"{name} {url}" for name, url in sim_urls.items())
        print(f"service {service_url}, simulated providers {sims_text}, callbacks {receiver_url}")
        print(f"operator console {service_url}/console", flush=True)
        urls = (service_url, sim_urls, f"{receiver_url}/callbacks")
        deadline = started + options.timeout
        batch = asyncio.run(
            run_batch(
                urls,
                (tokens[0], tokens[1]),
                receiver,
                (planned, repeats),
                started,
                deadline,
                lambda: {n: v for n, v in runtime.trust_views().items() if n in PROVIDERS},
            )
        )
        mcp = _walk_mcp(service_url, tokens[0])
        key = settings.audit_key(environ)
        audit_ok, audit_text = _audit(settings.database_url, key.reveal().encode() if key else None)
        report = RunReport(
            seed=options.seed,
            timeout=options.timeout,
            elapsed=time.monotonic() - started,
            outcomes=batch.outcomes,
            repeats=batch.repeats,
            rejected_callbacks=batch.rejected_callbacks,
            problems=[*batch.problems, *mcp.problems],
            audit_text=audit_text,
            audit_ok=audit_ok,
            mcp_lines=mcp.lines,
            trust=batch.trust,
            expected_ends=EXPECTED_ENDS,
        )
        # Printed while the service still runs: --keep-serving leaves it up after this.
        print(render_report(report), flush=True)
        if options.keep_serving:
            serve_until_interrupted(f"{service_url}/console", tokens[1])
    return report


def _walk_mcp(service_url: str, token: str) -> McpWalk:
    """One job through the agent tools, after the batch; a failure is reported, not raised."""
    try:
        return asyncio.run(walk(service_url, token, PROVIDER))
    except Exception as exc:  # the SDK raises its own (and grouped) errors
        return McpWalk((), (f"the MCP walk-through failed: {exc!r}",))


def serve_until_interrupted(console_url: str, operator_token: str) -> None:
    """Keep the demo's service (and its escalated operations) up for the console, until Ctrl-C."""
    print(
        f"\nThe service keeps running: open {console_url} and sign in with this operator "
        f"token (demo-operator):\n  {operator_token}\nPress Ctrl-C to stop.",
        flush=True,
    )
    stop = threading.Event()
    try:
        while not stop.wait(3600):
            pass
    except KeyboardInterrupt:
        print("stopping the demo's service and simulated provider", flush=True)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def run_demo(options: DemoOptions, base: Settings) -> int:
    """Run the demo end to end; 0 only when the run met every check (see the module doc)."""
    if options.operations < 1 or options.timeout <= 0:
        raise DemoFailed("--operations must be at least 1 and --timeout greater than 0")
    started = time.monotonic()
    workdir = prepare_directory(options.directory)
    # SIGTERM stops the demo as Ctrl-C does: the service, then its providers, in order.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        report = _run(options, base, workdir, started)
    except DemoFailed as exc:
        raise DemoFailed(f"{exc.message} (logs in {workdir})") from None
    except KeyboardInterrupt:
        print(f"interrupted; the simulated provider is stopped, files kept in {workdir}")
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    failed = bool(report.failures())
    if failed or options.keep:
        print(f"demo files kept in {workdir} (service.log, sim.log, sim-lossy.log, reconciler.db)")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0
