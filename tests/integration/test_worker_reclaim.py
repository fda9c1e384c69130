"""A claim that lands between a task's release and its end is worked, not left idle.

A webhook hint can make an operation due again while the worker's task on it is
finishing; the next tick claims it as soon as the lease is given back. That claim
must start a task: skipped, the lease would sit unused until it expired, and the
agent would wait that long (seen as lease_seconds-long stalls under load).
"""

from __future__ import annotations

import asyncio
import random

import pytest

from reconciler.config import Settings
from reconciler.core.clock import ManualClock
from reconciler.core.records import OperationRecord
from reconciler.core.states import State
from reconciler.engine.context import StepContext
from reconciler.engine.step_table import Steps
from reconciler.engine.worker import Worker
from reconciler.runtime import Runtime
from reconciler.storage import operations as store
from tests.support.factories import insert_operation
from tests.support.stack import sim_provider_table
from tests.support.steps import BASE_URL, ENVIRON

pytestmark = pytest.mark.both_backends


def test_a_claim_in_the_release_window_is_worked(db_url: str, clock: ManualClock) -> None:
    # Only operations of a configured provider are claimed: the sim's table, never called.
    settings = Settings(database_url=db_url, providers={"sim": sim_provider_table(BASE_URL)})
    runtime = Runtime.build(settings, clock=clock, rng=random.Random(7), environ=ENVIRON)
    try:
        _claim_in_the_release_window(runtime, clock)
    finally:
        runtime.db.dispose()


def _claim_in_the_release_window(runtime: Runtime, clock: ManualClock) -> None:
    op = insert_operation(
        runtime.db,
        runtime.journal,
        clock.now(),
        state=State.OBSERVING.value,
        remote_job_id="job_1",
        next_poll_at=clock.now(),
    )
    polled: list[str] = []

    async def poll(current: OperationRecord) -> None:
        polled.append(current.id)

    async def nothing(current: OperationRecord) -> None:
        return None

    steps = Steps(create=nothing, poll=poll, cancel=nothing, collect=nothing, complete=None)
    worker = Worker(StepContext(runtime), steps)
    release = worker._release

    async def release_then_tick(op_id: str, last: OperationRecord | None) -> None:
        await release(op_id, last)
        if len(polled) == 1:
            # The lease is back and the operation still due: a tick arrives right now.
            await worker.tick()

    worker._release = release_then_tick  # type: ignore[method-assign]

    async def main() -> None:
        await worker.tick()
        for _ in range(500):  # bounded: each task is a few database round trips
            if worker.in_flight == 0:
                return
            await asyncio.sleep(0.01)
        raise AssertionError("the worker's tasks did not finish")

    asyncio.run(main())
    assert polled == [op.id, op.id]
    with runtime.db.read() as conn:
        after = store.load_operation(conn, op.id)
    assert after.lease_owner is None
