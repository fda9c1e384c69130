"""Driving the demo's batch through the agent API, and what came of it.

``Driver`` submits the batch in its two waves (see ``demo.plan``), cancels what the plan
cancels, sends the repeated keys, and watches the operations, the simulators' counts,
the callbacks and each provider's webhook trust until everything is answered or the
time bound; ``run_batch`` returns each operation's outcome for the report.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx

from reconciler.core.errors import DemoFailed
from reconciler.core.trust import TrustView
from reconciler.demo.plan import DEMO_POLLING, PROVIDER, WARMUP_KINDS, Planned, first_wave
from reconciler.demo.processes import CallbackReceiver
from reconciler.demo.report import (
    OpOutcome,
    ProgressView,
    Snapshot,
    TrustSummary,
    make_view,
    settled,
)

WATCH_INTERVAL = 0.5
# The second wave waits this long at most for the warm-up to earn trust (see demo.plan).
TRUST_WAIT_SECONDS = 25.0
JUDGE_WAIT_SECONDS = float(DEMO_POLLING["webhook_grace_seconds"]) + 1.5


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
