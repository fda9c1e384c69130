"""A callback slot given back while a claim is in flight is claimed again at once.

The claim counts a host's free slots before it runs (in a write transaction, off the
loop). A delivery that finishes meanwhile frees a slot the claim did not count; the
host is no longer full, so nothing else wakes the worker for it, and the host's due
callbacks waited for the next tick: a burst of completions to one receiver went out a
host's share a second. Here the delivery finishes while the claim waits for the
database, and the same tick must claim the next callback.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import httpx
import pytest

from reconciler.core.completion_lanes import callback_lane
from tests.steps.test_complete_step import CALLBACK_URL, finished
from tests.support.steps import StepRig, step_rig
from tests.support.waiting import wait_until_async

pytestmark = pytest.mark.anyio

# A pool of four and two a host: the receiver host's share is two deliveries.
CALLBACKS = {"concurrency": 4, "per_host_concurrency": 2}


class HeldReceiver:
    """Answers each delivery when the test lets it (by the operation it is for)."""

    def __init__(self) -> None:
        self.release: dict[str, asyncio.Event] = {}
        self.arrived: list[str] = []
        self.answered: list[str] = []

    async def handle(self, request: httpx.Request) -> httpx.Response:
        op_id = request.headers["webhook-id"]
        self.arrived.append(op_id)
        await self.release.setdefault(op_id, asyncio.Event()).wait()
        self.answered.append(op_id)
        return httpx.Response(204)

    def let(self, op_id: str) -> None:
        self.release.setdefault(op_id, asyncio.Event()).set()


async def test_a_slot_freed_during_a_claim_is_claimed_by_the_same_tick(
    tmp_path: Path, db_url: str
) -> None:
    receiver = HeldReceiver()
    transport = httpx.MockTransport(receiver.handle)
    async with step_rig(tmp_path, db_url, callbacks=CALLBACKS, callback_transport=transport) as rig:
        ops = [await finished(rig, callback_url=CALLBACK_URL) for _ in range(4)]
        worker = rig.worker
        await worker.tick()  # the host's two slots: the first two deliveries, held
        await wait_until_async(lambda: len(receiver.arrived) == 2, 10, "two deliveries")
        first, second = receiver.arrived
        receiver.let(first)
        await wait_until_async(lambda: not rig.row(first).completion_pending, 10, "the first")

        # The database is held: the second delivery's answer cannot be recorded yet, and
        # the next claim, counting the one free slot it sees, waits beside that write.
        holder = sqlite3.connect(db_url.removeprefix("sqlite:///"), isolation_level=None)
        try:
            holder.execute("BEGIN IMMEDIATE")
            receiver.let(second)
            await wait_until_async(lambda: second in receiver.answered, 10, "the answer")
            tick = asyncio.ensure_future(worker.tick())
            await wait_until_async(lambda: worker.shares.claiming, 10, "the claim to start")
        finally:
            holder.close()  # rolls back: the write and the claim go on, the slot comes back
        await tick
        await wait_until_async(lambda: not rig.row(second).completion_pending, 10, "the second")

        # Both remaining callbacks are out, the one the claim counted and the one after,
        # with no tick but that one (no other runs here).
        await wait_until_async(lambda: len(receiver.arrived) == 4, 5, "the other two deliveries")
        assert sorted(receiver.arrived[2:]) == sorted(set(ops) - {first, second})
        for op_id in ops:
            receiver.let(op_id)


async def test_a_delivery_answered_gives_its_hosts_slot_back_before_its_record_commits(
    tmp_path: Path, db_url: str
) -> None:
    """The host's share bounds deliveries in flight to it, not the writes that record them:
    once a delivery is answered its slot goes back while the record waits for the database,
    and the next claim sends the host's next callback into it."""
    receiver = HeldReceiver()
    transport = httpx.MockTransport(receiver.handle)
    async with step_rig(tmp_path, db_url, callbacks=CALLBACKS, callback_transport=transport) as rig:
        ops = [await finished(rig, callback_url=CALLBACK_URL) for _ in range(3)]
        worker = rig.worker
        lane = callback_lane(httpx.URL(CALLBACK_URL).host)
        await worker.tick()  # the host's two slots: two deliveries, held
        await wait_until_async(lambda: len(receiver.arrived) == 2, 10, "two deliveries")
        assert worker.shares.used(lane) == 2
        first = receiver.arrived[0]

        holder = sqlite3.connect(db_url.removeprefix("sqlite:///"), isolation_level=None)
        try:
            holder.execute("BEGIN IMMEDIATE")  # no record can commit meanwhile
            receiver.let(first)
            await wait_until_async(lambda: first in receiver.answered, 10, "the answer")
            # Answered, its record not yet written: one delivery in flight, one slot free.
            await wait_until_async(lambda: worker.shares.used(lane) == 1, 10, "the slot back")
            assert rig.row(first).completion_pending
        finally:
            holder.close()
        await wait_until_async(lambda: not rig.row(first).completion_pending, 10, "the record")
        await worker.tick()
        await wait_until_async(lambda: len(receiver.arrived) == 3, 10, "the third delivery")
        assert sorted(receiver.arrived) == sorted(ops)
        for op_id in ops:
            receiver.let(op_id)
        for op_id in ops:
            await wait_until_async(lambda o=op_id: not rig.row(o).completion_pending, 10, "all")
        assert worker.shares.used(lane) == 0  # every slot back once, none twice


async def test_a_create_answered_gives_the_providers_slot_back_before_its_accept_commits(
    tmp_path: Path, db_url: str
) -> None:
    """The provider's share bounds its calls in flight: once the create is answered (the
    step's last call) the slot is free while the accept waits for the database."""
    rigs: list[StepRig] = []
    held: list[sqlite3.Connection] = []

    def provider(request: httpx.Request) -> httpx.Response:
        answer = rigs[0].provider.handle(request)
        if request.method == "POST" and not held:  # the create: no write may commit now
            holder = sqlite3.connect(db_url.removeprefix("sqlite:///"), isolation_level=None)
            holder.execute("BEGIN IMMEDIATE")
            held.append(holder)
        return answer

    async with step_rig(tmp_path, db_url, transport=httpx.MockTransport(provider)) as rig:
        rigs.append(rig)
        op_id = rig.submit()
        worker = rig.worker
        try:
            await worker.tick()
            await wait_until_async(lambda: bool(held), 10, "the create sent")
            await wait_until_async(lambda: worker.shares.used("sim") == 0, 10, "the slot back")
            assert rig.row(op_id).state == "create_pending"  # its accept not yet written
        finally:
            for holder in held:
                holder.close()
        await wait_until_async(lambda: rig.row(op_id).state != "create_pending", 10, "accepted")
        await wait_until_async(lambda: worker.in_flight == 0, 10, "the task done")
        assert worker.shares.used("sim") == 0  # given back once, not twice
        assert len([r for r in rig.provider.requests if r.endpoint == "create"]) == 1
