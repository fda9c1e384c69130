"""The real shell and the simulated provider on one manual clock, in one process.

The service app (routes, worker steps, webhook intake, the trust keeper) and the sim
app talk through ``httpx.ASGITransport``: the service's provider calls go to the sim,
the sim's signed webhooks go to the service's ``/webhooks/sim``. Nothing sleeps: the
rig moves the clock to the next moment anything is due (an operation's next read, a
job's next transition or webhook, a pending verdict's grace), then lets each part act.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa
from fixtures.provider_sim import SimConfig, SimState
from fixtures.provider_sim import create_app as create_sim

from reconciler.app import create_app
from reconciler.config import SchedulerSettings, ServerSettings, Settings
from reconciler.core.clock import ManualClock
from reconciler.core.story import tell
from reconciler.core.trust import TrustView
from reconciler.engine.background import Background
from reconciler.runtime import Runtime
from reconciler.storage.history import history_of
from reconciler.storage.journal import HISTORY, OPS
from reconciler.storage.trust import VERDICTS, trust_view
from tests.support.stack import SIM_TOKEN, WEBHOOK_SECRET, make_tokens, sim_provider_table

START = datetime(2025, 4, 18, 10, 20, tzinfo=UTC)
# The seed-003 schedule with a small trust_after, so trust is earned in a few jobs.
POLLING: dict[str, Any] = {
    "base_delay_seconds": 5,
    "max_delay_seconds": 120,
    "jitter_floor": 0.5,
    "deadline_seconds": 2400,
    "max_status_requests": 40,
    "max_transport_failures": 3,
    "trust_after": 3,
    "webhook_grace_seconds": 30,
}
ENVIRON = {"SIM_TOKEN": SIM_TOKEN, "SIM_WEBHOOK_SECRETS": WEBHOOK_SECRET}
MAX_STEPS = 5000


@dataclass
class Rig:
    clock: ManualClock
    sim: SimState
    runtime: Runtime
    background: Background
    client: httpx.AsyncClient
    agent_token: str
    operator_token: str
    _closers: list[Callable[[], Any]] = field(default_factory=list)

    @property
    def now(self) -> datetime:
        return self.clock.now()

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.agent_token}"}

    async def create(self, **request: Any) -> str:
        body = {"provider": "sim", "request": {"webhook_on_running": False, **request}}
        response = await self.client.post("/v1/operations", json=body, headers=self.headers())
        assert response.status_code == 202, response.text
        return str(response.json()["id"])

    async def get(self, op_id: str) -> dict[str, Any]:
        response = await self.client.get(f"/v1/operations/{op_id}", headers=self.headers())
        response.raise_for_status()
        return dict(response.json())

    async def history(self, op_id: str) -> list[dict[str, Any]]:
        response = await self.client.get(
            f"/v1/operations/{op_id}/history",
            headers={"Authorization": f"Bearer {self.operator_token}"},
        )
        response.raise_for_status()
        return list(response.json()["entries"])

    def story(self, op_id: str) -> list[str]:
        """The operation's history as ``core.story`` tells it."""
        with self.runtime.db.read() as conn:
            return tell(history_of(conn, op_id))

    def job(self, op_id: str) -> Any:
        return self.sim.jobs[self.row(op_id)["remote_job_id"]]

    def row(self, op_id: str) -> dict[str, Any]:
        with self.runtime.db.read() as conn:
            row = conn.execute(sa.select(OPS).where(OPS.c.id == op_id)).mappings().one()
        return dict(row)

    def rows(self, **where: Any) -> list[dict[str, Any]]:
        query = sa.select(OPS)
        for key, value in where.items():
            query = query.where(OPS.c[key] == value)
        with self.runtime.db.read() as conn:
            return [dict(r) for r in conn.execute(query).mappings()]

    def notes(self, op_id: str) -> list[dict[str, Any]]:
        with self.runtime.db.read() as conn:
            rows = conn.execute(
                sa.select(HISTORY).where(HISTORY.c.operation_id == op_id, HISTORY.c.kind == "note")
            )
            return [dict(r) for r in rows.mappings()]

    def verdicts(self) -> list[dict[str, Any]]:
        with self.runtime.db.read() as conn:
            rows = conn.execute(sa.select(VERDICTS).order_by(VERDICTS.c.id)).mappings()
            return [dict(r) for r in rows]

    def view(self) -> TrustView:
        policy = self.runtime.providers["sim"].polling.trust()
        with self.runtime.db.read() as conn:
            return trust_view(conn, "sim", policy)

    # --- driving ----------------------------------------------------------------------------

    async def settle_loop(self) -> None:
        """Let every part act on the present moment until nothing more happens now."""
        worker = self.background.worker
        for _ in range(50):
            delivered = await self.sim.pump()
            claimed = await worker.tick()
            for _ in range(20_000):
                if not worker.in_flight:
                    break
                await asyncio.sleep(0.001)
            sweep = await self.background.trust.sweep()
            if not (delivered or claimed or sweep.restored or sweep.judged):
                return

    def next_moment(self) -> datetime | None:
        """The earliest future moment something is due."""
        now = self.now
        found: list[datetime] = []
        with self.runtime.db.read() as conn:
            due = conn.execute(
                sa.select(sa.func.min(OPS.c.next_poll_at)).where(OPS.c.next_poll_at > now)
            ).scalar()
            if due is not None:
                found.append(due)
            pending = conn.execute(
                sa.select(sa.func.min(VERDICTS.c.settle_after)).where(
                    VERDICTS.c.verdict == "pending"
                )
            ).scalar()
            if pending is not None:
                found.append(max(pending, now + timedelta(microseconds=1)))
        epoch = now.timestamp()
        for job in self.sim.jobs.values():
            if job.plan and job.plan[0].at > epoch:
                found.append(datetime.fromtimestamp(job.plan[0].at, UTC))
        for delivery in self.sim.outbox.pending:
            if delivery.due_at > epoch:
                found.append(datetime.fromtimestamp(delivery.due_at, UTC))
        return min(found) if found else None

    async def run_until(self, done: Callable[[], bool], *, limit_seconds: float = 7200.0) -> None:
        """Advance from one due moment to the next until ``done()`` (bounded)."""
        end = self.now + timedelta(seconds=limit_seconds)
        for _ in range(MAX_STEPS):
            await self.settle_loop()
            if done():
                return
            nxt = self.next_moment()
            if nxt is None or nxt > end:
                raise AssertionError(f"nothing left to happen before {end} and not done")
            self.clock.set(max(nxt, self.now) + timedelta(milliseconds=1))
        raise AssertionError("the rig did not finish in its step bound")

    async def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``, acting at every due moment on the way."""
        end = self.now + timedelta(seconds=seconds)
        for _ in range(MAX_STEPS):
            await self.settle_loop()
            nxt = self.next_moment()
            if nxt is None or nxt > end:
                self.clock.set(end)
                await self.settle_loop()
                return
            self.clock.set(max(nxt, self.now) + timedelta(milliseconds=1))
        raise AssertionError("the rig did not finish in its step bound")

    def done(self, *op_ids: str) -> Callable[[], bool]:
        def check() -> bool:
            return all(self.row(i)["done_at"] is not None for i in op_ids)

        return check

    async def close(self) -> None:
        for closer in reversed(self._closers):
            result = closer()
            if asyncio.iscoroutine(result):
                await result


async def open_rig(
    tmp_path: Path,
    db_url: str,
    *,
    polling: dict[str, Any] | None = None,
    clock: ManualClock | None = None,
    sim: SimState | None = None,
    seed: int = 7,
    provider_concurrency: int = 16,
    tokens: tuple[str, str] | None = None,
) -> Rig:
    """The service on ``db_url`` and the sim, both on ``clock`` (shared with a second rig)."""
    clock = clock or ManualClock(START)
    providers_dir = tmp_path / "no-provider-files"
    providers_dir.mkdir(exist_ok=True)
    table = sim_provider_table("http://sim", polling={**POLLING, **(polling or {})})
    settings = Settings(
        database_url=db_url,
        providers_dir=str(providers_dir),
        providers={"sim": table},
        server=ServerSettings(create_wait_seconds=0.0),
        scheduler=SchedulerSettings(
            tick_seconds=1.0, lease_seconds=30.0, provider_concurrency=provider_concurrency
        ),
    )
    own_sim = sim is None
    if sim is None:
        sim = SimState(
            SimConfig(
                token=SIM_TOKEN,
                webhook_secret=WEBHOOK_SECRET,
                now=lambda: clock.now().timestamp(),
                run_pump=False,
                seed=seed,
            )
        )
    sim_app = create_sim(state=sim)
    runtime = Runtime.build(
        settings,
        clock=clock,
        rng=random.Random(seed),
        environ=ENVIRON,
        transport=httpx.ASGITransport(sim_app),
    )
    app = create_app(runtime, background=False)
    background: Background = app.state.background
    await background.start()
    if own_sim:
        sim.config.webhook_url = "http://service/webhooks/sim"
        sim.config.webhook_transport = httpx.ASGITransport(app)
    agent, operator = tokens if tokens is not None else make_tokens(runtime)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://service")
    rig = Rig(clock, sim, runtime, background, client, agent, operator)
    rig._closers.append(runtime.close)
    rig._closers.append(background.stop)
    rig._closers.append(client.aclose)
    if own_sim:
        rig._closers.append(sim.aclose)
    return rig
