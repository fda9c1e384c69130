"""The engine's steps on a real database, a ``ManualClock`` and an in-process provider.

``StepRig`` builds what ``Background`` builds (the step context, the five steps and
the worker) on a runtime whose provider calls go through ``httpx.MockTransport`` to
a ``FakeProvider``. Nothing listens on a socket and nothing waits for time to pass:
a test moves the clock to the moment the operation asked to be looked at again and
runs the step that is due, so a 20-minute deadline takes as long as a 20 ms one.

``step`` claims one operation and runs the step its state calls for, exactly once;
``tick`` is one real worker tick (claim what is due, run up to the per-claim step
limit); ``advance_to_due`` moves the clock to the next due time; ``run`` repeats the
two until the operation reaches a state the test names.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from reconciler.commands.cancel import cancel as cancel_command
from reconciler.commands.create import create_operation
from reconciler.commands.decide import decide as decide_command
from reconciler.commands.validation import parse_create
from reconciler.config import CallbackSettings, HookSpec, SchedulerSettings, Settings
from reconciler.core.callback_secrets import agent_key, as_whsec
from reconciler.core.clock import ManualClock
from reconciler.core.principal import Principal
from reconciler.core.records import HistoryRecord, OperationRecord
from reconciler.core.states import END_STATES, State
from reconciler.core.vocabulary import Scope
from reconciler.engine.context import StepContext
from reconciler.engine.hooks import load_hooks
from reconciler.engine.step_table import Step, Steps, step_table
from reconciler.engine.steps.cancel import CancelStep
from reconciler.engine.steps.collect import CollectStep
from reconciler.engine.steps.complete import CompleteStep
from reconciler.engine.steps.create import CreateStep
from reconciler.engine.steps.poll import PollStep
from reconciler.engine.worker import Worker
from reconciler.outbound.callbacks import CallbackClient
from reconciler.outbound.ssrf import Resolver
from reconciler.providers.http_adapter import build_adapter
from reconciler.runtime import Runtime
from reconciler.storage import leases
from reconciler.storage import operations as store
from reconciler.storage.history import history_of
from reconciler.storage.operation_reads import view_of
from reconciler.storage.tokens import callback_salt, create_token
from reconciler.wire import parse_decision
from tests.support.provider_mock import BASE_URL, FakeProvider
from tests.support.stack import CALLBACK_SECRET, SIM_TOKEN, WEBHOOK_SECRET, sim_provider_table
from tests.support.waiting import wait_until_async

AGENT = Principal("agent-1", Scope.AGENT)
OPERATOR = Principal("ops-1", Scope.OPERATOR)
ENVIRON = {
    "SIM_TOKEN": SIM_TOKEN,
    "SIM_WEBHOOK_SECRETS": WEBHOOK_SECRET,
    "RECONCILER_CALLBACK_SECRET": CALLBACK_SECRET,
}
# Longer than any step takes: the lease only runs out when a test moves the clock past it.
LEASE_SECONDS = 300.0
# A worker tick is done when its tasks are; this bounds the wait for them (real seconds).
TICK_TIMEOUT = 30.0


class StepRig:
    def __init__(
        self,
        runtime: Runtime,
        provider: FakeProvider,
        clock: ManualClock,
        callbacks: CallbackClient | None,
    ) -> None:
        self.runtime = runtime
        self.provider = provider
        self.clock = clock
        self.ctx = StepContext(runtime)
        hooks = load_hooks(runtime.settings.hooks, runtime.settings.source)
        self.callbacks = callbacks
        self.steps = Steps(
            create=CreateStep(self.ctx),
            poll=PollStep(self.ctx),
            cancel=CancelStep(self.ctx),
            collect=CollectStep(self.ctx),
            complete=CompleteStep(self.ctx, hooks, callbacks),
        )
        self.table = step_table(self.steps)
        self.worker = Worker(self.ctx, self.steps)

    # --- what an agent or an operator does -------------------------------------------

    def submit(self, request: Any = None, **fields: Any) -> str:
        """Store a new operation as ``POST /v1/operations`` would; returns its id."""
        body = {"provider": "sim", "request": request or {"report": "q3"}, **fields}
        rt = self.runtime
        req = parse_create(body, rt.providers, rt.check_callback_url)
        with rt.db.write() as conn:
            op, _ = create_operation(
                conn, rt.journal, AGENT, req, rt.limits_for(req.provider), self.clock.now()
            )
        return op.id

    def cancel(self, op_id: str, reason: str | None = None) -> OperationRecord:
        rt = self.runtime
        return cancel_command(
            rt.db, rt.journal, rt.providers, op_id, AGENT, reason, self.clock.now()
        )

    def decide(self, op_id: str, body: dict[str, Any]) -> OperationRecord:
        rt = self.runtime
        return decide_command(
            rt.db,
            rt.journal,
            rt.providers,
            op_id,
            OPERATOR,
            parse_decision(body),
            self.clock.now(),
        )

    # --- reading ---------------------------------------------------------------------

    def row(self, op_id: str) -> OperationRecord:
        with self.runtime.db.read() as conn:
            return store.load_operation(conn, op_id)

    def view(self, op_id: str) -> dict[str, Any]:
        """The Operation as the API shows it."""
        with self.runtime.db.read() as conn:
            return view_of(conn, store.load_operation(conn, op_id), self.clock.now())

    def callback_secret(self) -> str:
        """The agent's own callback secret (what ``tokens create`` shows it once)."""
        with self.runtime.db.read() as conn:
            salt = callback_salt(conn, AGENT.name)
        assert salt is not None and self.runtime.callback_key is not None
        return as_whsec(agent_key(self.runtime.callback_key, salt))

    def history(self, op_id: str) -> list[HistoryRecord]:
        with self.runtime.db.read() as conn:
            return history_of(conn, op_id)

    def causes(self, op_id: str) -> list[str]:
        return [e.cause for e in self.history(op_id)]

    # --- running the engine ----------------------------------------------------------

    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    def advance_to_due(self, op_id: str) -> OperationRecord:
        """Move the clock to the moment the operation asked to be looked at (never back)."""
        op = self.row(op_id)
        assert op.next_poll_at is not None, f"{op_id} is parked in {op.state}"
        if op.next_poll_at > self.clock.now():
            self.clock.set(op.next_poll_at)
        return op

    def step_for(self, op: OperationRecord) -> Step:
        if op.completion_pending and State(op.state) in END_STATES:
            return self.steps.complete  # type: ignore[return-value]
        return self.table[State(op.state)]

    async def step(self, op_id: str) -> OperationRecord:
        """Claim the operation (it must be due) and run its step once; returns the row after."""
        rt = self.runtime
        owner = rt.worker_id

        def claim() -> list[str]:
            with rt.db.write() as conn:
                claimed = leases.claim_records(conn, owner, self.clock.now(), LEASE_SECONDS, 1000)
                return [op.id for op, _ in claimed]

        claimed = await rt.db.run(claim)
        assert op_id in claimed, f"{op_id} is not due at {self.clock.now()}"
        try:
            op = self.row(op_id)
            await self.step_for(op)(op)
        finally:

            def release() -> None:
                with rt.db.write() as conn:
                    leases.release(conn, claimed, owner)

            await rt.db.run(release)
        return self.row(op_id)

    async def tick(self) -> int:
        """One worker tick, waited for until every task it started has finished."""
        claimed = await self.worker.tick()
        await wait_until_async(
            lambda: not self.worker.in_flight, TICK_TIMEOUT, "the tick's tasks", poll=0.001
        )
        return claimed

    async def run(
        self, op_id: str, states: Sequence[str], max_rounds: int = 200
    ) -> OperationRecord:
        """Advance to each due time and tick until the operation is in one of ``states``
        with nothing left pending; fails if it parks elsewhere or takes too many rounds."""
        wanted = {State(s) for s in states}
        for _ in range(max_rounds):
            op = self.row(op_id)
            if State(op.state) in wanted and not op.completion_pending:
                return op
            self.advance_to_due(op_id)
            await self.tick()
        raise AssertionError(f"{op_id} did not reach {sorted(wanted)}: {self.row(op_id).state}")

    async def close(self) -> None:
        await self.worker.drain()
        if self.callbacks is not None:
            await self.callbacks.aclose()
        await self.runtime.close()


@asynccontextmanager
async def step_rig(
    tmp_path: Path,
    db_url: str,
    *,
    provider: dict[str, dict[str, Any]] | None = None,
    drop: tuple[str, ...] = (),
    hooks: tuple[str | HookSpec, ...] = (),
    callbacks: dict[str, Any] | None = None,
    callback_transport: httpx.AsyncBaseTransport | None = None,
    seed: int = 7,
    table: dict[str, Any] | None = None,
    resolver: Resolver | None = None,
    handler: Callable[[httpx.Request], httpx.Response] | None = None,
    environ: dict[str, str] | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> AsyncIterator[StepRig]:
    """A rig whose provider calls go to a ``FakeProvider``, on the test's clock.

    ``provider`` updates sections of the sim's provider table, ``drop`` removes some;
    ``table`` replaces the whole table (for keys a section update cannot remove);
    with ``callback_transport`` the completion step delivers agent callbacks through it;
    ``resolver`` answers for the host names of provider URLs on other hosts; ``handler``
    answers the provider's calls instead of the ``FakeProvider`` (another API's shape);
    ``environ`` adds variables to the rig's environment (a credential's); ``transport``
    carries the provider's calls instead (a real API over real HTTP).
    """
    clock = ManualClock()
    fake = FakeProvider(clock)
    transport = transport or httpx.MockTransport(handler or fake.handle)
    empty = tmp_path / "no-provider-files"
    empty.mkdir(exist_ok=True)
    settings = Settings(
        database_url=db_url,
        providers_dir=str(empty),
        providers={"sim": table or sim_provider_table(BASE_URL, drop=drop, **(provider or {}))},
        hooks=hooks,
        scheduler=SchedulerSettings(lease_seconds=LEASE_SECONDS),
        callbacks=CallbackSettings(**{"allow_hosts": ("127.0.0.1",), **(callbacks or {})}),
    )
    runtime = Runtime.build(
        settings,
        clock=clock,
        rng=random.Random(seed),
        environ={**ENVIRON, **(environ or {})},
        transport=transport,
    )
    # The adapter times its calls on the test's clock too, so what the provider answered
    # and what the worker decided carry moments of one clock.
    if resolver is not None:
        runtime.resolver = resolver
    runtime.adapters["sim"] = build_adapter(
        runtime.providers["sim"],
        runtime.environ,
        transport,
        clock=clock,
        guard=runtime.provider_url_guard,
    )
    sender = None
    if callback_transport is not None:
        assert runtime.callback_key is not None
        sender = CallbackClient(
            signing_key=runtime.callback_key,
            allow_hosts=settings.callbacks.allow_hosts,
            clock=clock,
            timeout_seconds=settings.callbacks.timeout_seconds,
            transport=callback_transport,
        )
    with runtime.db.write() as conn:  # the agent's token, and with it its callback secret
        create_token(conn, AGENT.name, AGENT.scope.value, clock.now())
    rig = StepRig(runtime, fake, clock, sender)
    try:
        yield rig
    finally:
        await rig.close()
