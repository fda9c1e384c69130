"""The in-process world: the real service and the simulated provider on one manual clock.

The service app (routes, worker steps, webhook intake, the trust keeper) and the sim
app talk through ``httpx.ASGITransport``: the service's provider calls go to the sim,
the sim's signed webhooks go to the service's ``/webhooks/sim``, and a test's requests
go to the service's routes. No socket is opened and nothing waits for time to pass:
``run_until`` moves the clock to the next moment anything is due (an operation's next
read, a job's next transition or webhook, a pending verdict's grace), lets each part
act on it, and repeats until the test's condition holds, so a scenario that takes
minutes of provider time runs in milliseconds.

``open_world`` builds one (``world`` is the same as an async context manager); a
second world on the same database and clock (``clock=``, ``sim=``, ``tokens=``) is a
second replica. Scenarios that need real sockets, real processes or the wall clock
(``tests/support/stack.py``) are the exception, kept for what only they prove.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import httpx
import sqlalchemy as sa

from reconciler.app import create_app
from reconciler.config import (
    CallbackSettings,
    RetentionSettings,
    SchedulerSettings,
    ServerSettings,
    Settings,
)
from reconciler.core.clock import ManualClock
from reconciler.core.story import tell
from reconciler.core.trust import TrustView
from reconciler.demo.sim import SimConfig, SimState
from reconciler.demo.sim import create_app as create_sim
from reconciler.demo.sim.lifecycle import job_snapshot
from reconciler.engine.background import Background
from reconciler.runtime import Runtime
from reconciler.storage.history import history_of
from reconciler.storage.tables import HISTORY, OPS, VERDICTS
from reconciler.storage.trust import trust_view
from reconciler.telemetry import Telemetry
from tests.support.stack import SIM_TOKEN, WEBHOOK_SECRET, make_tokens, sim_provider_table

START = datetime(2025, 4, 18, 10, 20, tzinfo=UTC)
T = TypeVar("T")
ENVIRON = {"SIM_TOKEN": SIM_TOKEN, "SIM_WEBHOOK_SECRETS": WEBHOOK_SECRET}
MAX_STEPS = 5000


class Gate:
    """The sim's ``sleep`` held until the test opens the gate, instead of for a time.

    A chaos ``delay`` or a ``create_fault = "delay"`` answer then stays in flight for as
    long as the test needs to act while it is out: ``held`` is set once a request waits.
    """

    def __init__(self) -> None:
        self.held = asyncio.Event()
        self._open = asyncio.Event()

    async def sleep(self, seconds: float) -> None:
        self.held.set()
        await self._open.wait()

    def open(self) -> None:
        self._open.set()

    @property
    def holding(self) -> bool:
        """A request waits at the gate now."""
        return self.held.is_set() and not self._open.is_set()


@dataclass
class World:
    clock: ManualClock
    sim: SimState
    runtime: Runtime
    background: Background
    client: httpx.AsyncClient
    agent_token: str
    operator_token: str
    # Merged under every ``create``'s request (a test's own fields win).
    request_defaults: dict[str, Any] = field(default_factory=dict)
    # The sim's delays wait here when the world was opened with ``hold_delays``.
    gate: Gate = field(default_factory=Gate)
    # The sim's own API (``/_sim/...`` controls and views), over ASGI too.
    sim_client: httpx.AsyncClient | None = None
    _closers: list[Callable[[], Any]] = field(default_factory=list)

    @property
    def now(self) -> datetime:
        return self.clock.now()

    def headers(self, operator: bool = False) -> dict[str, str]:
        token = self.operator_token if operator else self.agent_token
        return {"Authorization": f"Bearer {token}"}

    async def submit(self, request: dict[str, Any], **fields: Any) -> httpx.Response:
        """``POST /v1/operations`` for the sim, as an agent; the answer as it came."""
        body = {"provider": "sim", "request": {**self.request_defaults, **request}, **fields}
        return await self.client.post("/v1/operations", json=body, headers=self.headers())

    async def create(self, **request: Any) -> str:
        response = await self.submit(request)
        assert response.status_code == 202, response.text
        return str(response.json()["id"])

    async def get(self, op_id: str, operator: bool = False) -> dict[str, Any]:
        response = await self.client.get(f"/v1/operations/{op_id}", headers=self.headers(operator))
        response.raise_for_status()
        return dict(response.json())

    async def cancel(
        self, op_id: str, headers: dict[str, str] | None = None, reason: str = "not needed"
    ) -> httpx.Response:
        return await self.client.post(
            f"/v1/operations/{op_id}/cancel",
            json={"reason": reason},
            headers=headers or self.headers(),
        )

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
                if not worker.in_flight or self.gate.holding:
                    break
                await asyncio.sleep(0.001)
            sweep = await self.background.trust.sweep()
            retention = self.background.retention
            pruned = (await retention.sweep()).tables if retention.enabled else {}
            if not (delivered or claimed or sweep.restored or sweep.judged or pruned):
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
        raise AssertionError("the world did not finish in its step bound")

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
        raise AssertionError("the world did not finish in its step bound")

    def done(self, *op_ids: str) -> Callable[[], bool]:
        def check() -> bool:
            return all(self.row(i)["done_at"] is not None for i in op_ids)

        return check

    def finished(self, *op_ids: str) -> Callable[[], bool]:
        """Done and the completion handler's round closed: nothing more will be written."""

        def check() -> bool:
            rows = [self.row(i) for i in op_ids]
            return all(r["done_at"] is not None and not r["completion_pending"] for r in rows)

        return check

    def in_state(self, op_id: str, *states: str) -> Callable[[], bool]:
        return lambda: self.row(op_id)["state"] in states

    async def close(self) -> None:
        for closer in reversed(self._closers):
            result = closer()
            if asyncio.iscoroutine(result):
                await result


async def open_world(
    tmp_path: Path,
    db_url: str,
    *,
    polling: dict[str, Any] | None = None,
    provider: dict[str, Any] | None = None,
    clock: ManualClock | None = None,
    sim: SimState | None = None,
    sim_config: dict[str, Any] | None = None,
    seed: int = 7,
    provider_concurrency: int = 16,
    scheduler: dict[str, Any] | None = None,
    tokens: tuple[str, str] | None = None,
    request_defaults: dict[str, Any] | None = None,
    hold_delays: bool = False,
    telemetry: Telemetry | None = None,
    hooks: tuple[str, ...] = (),
    callbacks: CallbackSettings | None = None,
    environ: dict[str, str] | None = None,
    retention: dict[str, Any] | None = None,
) -> World:
    """The service on ``db_url`` and the sim, both on ``clock`` (shared with a second world).

    ``polling`` updates the sim table's polling section, ``provider`` its other sections
    (as ``sim_provider_table`` takes them); ``sim_config`` goes to the sim's ``SimConfig``.
    With ``hold_delays`` every delayed sim answer waits at ``World.gate`` until opened.
    ``scheduler`` overrides the scheduler settings (``catch_up_after_seconds``, ...).
    ``telemetry``: the tracing the service uses (a test's in-memory exporter); ``hooks``,
    ``callbacks`` and ``environ`` (added to the sim's) as the settings take them.
    ``retention``: the ``[retention]`` settings; by default nothing is pruned, and with
    any window set the sweep runs at every moment the world acts on.
    """
    gate = Gate()
    clock = clock or ManualClock(START)
    providers_dir = tmp_path / "no-provider-files"
    providers_dir.mkdir(exist_ok=True)
    sections = dict(provider or {})
    sections["polling"] = {**sections.get("polling", {}), **(polling or {})}
    table = sim_provider_table("http://sim", **sections)
    settings = Settings(
        database_url=db_url,
        providers_dir=str(providers_dir),
        providers={"sim": table},
        server=ServerSettings(create_wait_seconds=0.0),
        scheduler=SchedulerSettings(
            **{
                "tick_seconds": 1.0,
                "lease_seconds": 30.0,
                "provider_concurrency": provider_concurrency,
                **(scheduler or {}),
            }
        ),
        hooks=hooks,
        callbacks=callbacks or CallbackSettings(),
        retention=RetentionSettings(
            **{"operations_days": 0, "events_days": 0, "tombstones_days": 0, **(retention or {})}
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
                **({"sleep": gate.sleep} if hold_delays else {}),
                **(sim_config or {}),
            )
        )
    sim_app = create_sim(state=sim)
    runtime = Runtime.build(
        settings,
        clock=clock,
        rng=random.Random(seed),
        environ={**ENVIRON, **(environ or {})},
        transport=httpx.ASGITransport(sim_app),
        telemetry=telemetry,
    )
    app = create_app(runtime, background=False)
    background: Background = app.state.background
    await background.start()
    if own_sim:
        sim.config.webhook_url = "http://service/webhooks/sim"
        sim.config.webhook_transport = httpx.ASGITransport(app)
    agent, operator = tokens if tokens is not None else make_tokens(runtime)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://service")
    world = World(
        clock, sim, runtime, background, client, agent, operator, dict(request_defaults or {}), gate
    )
    world.sim_client = httpx.AsyncClient(
        transport=httpx.ASGITransport(sim_app), base_url="http://sim"
    )
    world._closers.append(runtime.close)
    world._closers.append(background.stop)
    world._closers.append(client.aclose)
    world._closers.append(world.sim_client.aclose)
    if own_sim:
        world._closers.append(sim.aclose)
    return world


@asynccontextmanager
async def world(tmp_path: Path, db_url: str, **options: Any) -> AsyncIterator[World]:
    """``open_world`` that closes itself."""
    opened = await open_world(tmp_path, db_url, **options)
    try:
        yield opened
    finally:
        await opened.close()


class SyncClient:
    """An ``httpx.AsyncClient`` called from synchronous code, on the world's loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, client: httpx.AsyncClient) -> None:
        self._loop = loop
        self._client = client

    def get(self, url: str, **kwargs: Any) -> httpx.Response:
        return self._loop.run_until_complete(self._client.get(url, **kwargs))

    def post(self, url: str, **kwargs: Any) -> httpx.Response:
        return self._loop.run_until_complete(self._client.post(url, **kwargs))


class SyncWorld:
    """The world for synchronous tests, with the calls of ``tests.support.stack.Stack``.

    Each call runs the world's event loop until it is done; between calls nothing runs,
    so the world only moves when the test asks it to. ``wait``/``wait_state`` run from
    one due moment to the next until the operation gets there (the clock, not a timeout,
    is what passes); ``settled`` runs the clock on for ``QUIET_SECONDS``.
    """

    QUIET_SECONDS = 600.0

    def __init__(self, loop: asyncio.AbstractEventLoop, world: World) -> None:
        self.loop = loop
        self.world = world
        self.runtime = world.runtime
        self.sim = world.sim
        self.clock = world.clock
        self.agent_token = world.agent_token
        self.operator_token = world.operator_token
        self.client = SyncClient(loop, world.client)
        assert world.sim_client is not None
        self.sim_client = SyncClient(loop, world.sim_client)

    def _run(self, awaitable: Awaitable[T]) -> T:
        return self.loop.run_until_complete(awaitable)

    def headers(self, operator: bool = False) -> dict[str, str]:
        return self.world.headers(operator)

    def row(self, op_id: str) -> dict[str, Any]:
        return self.world.row(op_id)

    def create(self, request: dict[str, Any], **fields: Any) -> httpx.Response:
        return self._run(self.world.submit(request, **fields))

    def get(self, op_id: str, operator: bool = False) -> dict[str, Any]:
        return self._run(self.world.get(op_id, operator))

    def history(self, op_id: str) -> list[dict[str, Any]]:
        return self._run(self.world.history(op_id))

    def run_until(self, done: Callable[[], Any], *, limit_seconds: float = 7200.0) -> None:
        """``World.run_until``; ``done`` runs inside the loop, so it reads the database or
        the sim directly (``row``, ``sim_job``), never through ``get``."""
        self._run(self.world.run_until(lambda: bool(done()), limit_seconds=limit_seconds))

    def advance(self, seconds: float) -> None:
        self._run(self.world.advance(seconds))

    def wait(self, op_id: str, timeout: float | None = None) -> dict[str, Any]:
        """Run until the operation is done and its completion round closed."""
        self.run_until(self.world.finished(op_id))
        return self.get(op_id)

    def wait_state(
        self, op_id: str, states: set[str], timeout: float | None = None
    ) -> dict[str, Any]:
        self.run_until(self.world.in_state(op_id, *states))
        return self.get(op_id, operator=True)

    def settled(self, op_ids: Any = (), timeout: float | None = None) -> None:
        self.advance(self.QUIET_SECONDS)

    def sim_job(self, job_id: str) -> dict[str, Any]:
        """What ``GET /_sim/jobs/{id}`` shows, read without the loop (usable in a condition)."""
        return job_snapshot(self.sim.jobs[job_id], self.sim.now())


@contextmanager
def sync_world(tmp_path: Path, db_url: str, **options: Any) -> Iterator[SyncWorld]:
    """``open_world`` on a loop of its own, for synchronous tests."""
    loop = asyncio.new_event_loop()
    try:
        opened = loop.run_until_complete(open_world(tmp_path, db_url, **options))
        try:
            yield SyncWorld(loop, opened)
        finally:
            loop.run_until_complete(opened.close())
    finally:
        loop.close()
