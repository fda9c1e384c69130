"""A create stored on this replica starts as its insert commits, with no claim between.

The insert takes the lease and counts the first create call (what a claim and the create
step's ``prepare`` would write), so a crash after it is the crash after a claim: the
create is settled as one that may have been sent. A replayed key, or a share whose last
claim was filled (due work of its own waits), leaves the operation to the claims.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from reconciler.app import create_app
from reconciler.commands import agent_actions
from reconciler.commands.create import create_operation
from reconciler.commands.validation import parse_create
from reconciler.core.states import State
from reconciler.engine.create_start import CreateStarts
from tests.support.provider_mock import FakeProvider
from tests.support.steps import AGENT, LEASE_SECONDS, TICK_TIMEOUT, StepRig, step_rig
from tests.support.waiting import wait_until_async

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

BODY = {"provider": "sim", "request": {"report": "q3"}, "idempotency_key": "k-1"}


def starting(rig: StepRig, lease_seconds: float = LEASE_SECONDS) -> CreateStarts:
    """Creates start here, and changes reach the create's wait (as the app's engine does)."""
    rig.runtime.notifier.bind(asyncio.get_running_loop())
    starts = CreateStarts(rig.worker, rig.steps.create, lease_seconds)
    rig.runtime.create_starts = starts
    return starts


async def settled(rig: StepRig) -> None:
    await wait_until_async(
        lambda: not rig.worker.in_flight, TICK_TIMEOUT, "the started tasks", poll=0.001
    )


async def test_a_create_with_a_free_slot_is_sent_without_a_claim_and_once(
    tmp_path: Path, db_url: str
) -> None:
    async with step_rig(tmp_path, db_url) as rig:
        starting(rig)
        free = rig.worker.shares.free("sim")
        op, created = await agent_actions.start(rig.runtime, AGENT, BODY)
        assert op.remote_job_id is not None  # the answer waited for it, as for any create
        await settled(rig)
        row = rig.row(op.id)
        assert created and row.state == State.OBSERVING
        assert row.remote_job_id is not None and row.create_attempts == 1
        assert row.lease_owner is None  # the step's last write gave the lease back
        assert len(rig.provider.sent("create")) == 1
        assert rig.worker.shares.free("sim") == free
        # A replay of its key gives its slot back and starts nothing.
        again, created = await agent_actions.start(rig.runtime, AGENT, BODY)
        assert not created and again.id == op.id
        assert not rig.worker.in_flight and rig.worker.shares.free("sim") == free
        assert len(rig.provider.sent("create")) == 1
        # The same story a claimed create tells: nothing more, nothing less.
        claimed = rig.submit(idempotency_key="k-2")
        assert await rig.tick() == 1
        assert rig.causes(op.id) == rig.causes(claimed)


async def test_the_insert_holds_the_lease_and_the_count_a_crash_leaves_to_a_takeover(
    tmp_path: Path, db_url: str
) -> None:
    """Inserted as started, then nothing (the process died before the step ran): the
    lease runs out, a claim takes the row over, and the create, which may have been sent,
    goes out once more with the same idempotency token: one job."""
    async with step_rig(tmp_path, db_url) as rig:
        starts = starting(rig, lease_seconds=5)
        start = starts.reserve("sim")
        assert start is not None
        rt = rig.runtime
        req = parse_create(BODY, rt.providers, rt.check_callback_url)
        with rt.db.write() as conn:
            op, created = create_operation(
                conn,
                rt.journal,
                AGENT,
                req,
                rt.limits_for("sim"),
                rig.clock.now(),
                None,
                start.changes,
            )
        assert created
        row = rig.row(op.id)
        assert row.lease_owner == rt.worker_id and row.create_attempts == 1
        assert row.next_poll_at is not None and row.next_poll_at > rig.clock.now()
        assert rig.causes(op.id) == ["agent_request:create"]
        start.cancel()  # the slot of the task that never ran
        assert await rig.tick() == 0  # leased, and its next try not due: nobody takes it
        rig.advance(6)
        after = await rig.run(op.id, [State.OBSERVING])
        assert after.remote_job_id is not None
        assert rig.provider.sent("create") or rig.provider.sent("lookup")
        assert len(rig.provider.jobs) == 1  # under the operation's own token
        assert rig.provider.by_key[row.idempotency_token] == after.remote_job_id


async def test_a_share_whose_last_claim_was_filled_leaves_new_creates_to_the_claims(
    tmp_path: Path, db_url: str
) -> None:
    """Due work of the provider may be waiting: it goes first, earliest due, and the new
    operation waits its turn among it; a claim that finds less than it asked for ends
    that."""
    gate = asyncio.Event()
    fake: list[FakeProvider] = []

    async def held(request: httpx.Request) -> httpx.Response:
        await gate.wait()
        return fake[0].handle(request)

    async with step_rig(tmp_path, db_url, handler=held) as rig:  # type: ignore[arg-type]
        fake.append(rig.provider)
        starts = starting(rig)
        worker = rig.worker
        free = worker.shares.free("sim")
        due = [rig.submit(idempotency_key=f"due-{i}") for i in range(free + 1)]
        assert await worker.tick() == free  # the share filled; one operation still due
        gate.set()
        await settled(rig)
        assert worker.shares.free("sim") == free  # free slots, yet due work may wait
        assert starts.reserve("sim") is None
        op, created = await agent_actions.start(rig.runtime, AGENT, BODY)
        assert created and not worker.in_flight
        assert rig.row(op.id).lease_owner is None
        assert len(rig.provider.sent("create")) == free  # neither the last nor the new one
        assert await rig.tick() == 2  # both, as due: less than the share has free
        assert {rig.row(i).state for i in [*due, op.id]} == {State.OBSERVING}
        start = starts.reserve("sim")
        assert start is not None
        start.cancel()


async def test_a_create_never_waits_for_a_claim_in_flight(tmp_path: Path, db_url: str) -> None:
    """The claim holds the free slots back for what it finds; the request on the wire does
    not wait for it: its operation is left to the claims."""
    async with step_rig(tmp_path, db_url) as rig:
        starts = starting(rig)
        rig.worker.shares.claiming = True  # as ``Worker._claim`` sets it
        assert starts.reserve("sim") is None
        op, created = await agent_actions.start(rig.runtime, AGENT, BODY)
        assert created and not rig.worker.in_flight
        rig.worker.shares.claiming = False
        assert await rig.tick() == 1 and rig.row(op.id).state == State.OBSERVING


async def test_the_app_hands_its_doors_the_starts_only_while_it_runs_the_scheduler(
    tmp_path: Path, db_url: str
) -> None:
    async with step_rig(tmp_path, db_url) as rig:
        create_app(rig.runtime, background=False)
        assert rig.runtime.create_starts is None
        create_app(rig.runtime)
        assert isinstance(rig.runtime.create_starts, CreateStarts)
