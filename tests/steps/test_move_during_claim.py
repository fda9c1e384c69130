"""A task refused a share only because a claim is in flight waits for it, lease in hand.

The claim holds back every share's free slots for what it claims. A task whose
operation moves into one of them meanwhile (a result in, its completion due) used
to give its lease back at once: one transaction for that, and a claim of its own to get
the operation again. It now waits for the claim, which is a write and so bounded, and
moves into the slot that is still free after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from reconciler.engine.shares import HOOKS, NO_SLOT
from reconciler.engine.worker import Worker
from tests.support.steps import step_rig
from tests.support.waiting import wait_until_async

pytestmark = pytest.mark.anyio


@contextlib.asynccontextmanager
async def held_claim(db_url: str, worker: Worker) -> AsyncIterator[asyncio.Future[int]]:
    """A tick whose claim waits for the database, held until the block ends: the tick."""
    holder = sqlite3.connect(db_url.removeprefix("sqlite:///"), isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        tick = asyncio.ensure_future(worker.tick())
        await wait_until_async(lambda: worker.shares.claiming, 10, "the claim to start")
        yield tick
    finally:
        holder.close()


async def turns(n: int = 20) -> None:
    """Turns of the loop in which a task not waiting for anything would have finished."""
    for _ in range(n):
        await asyncio.sleep(0)


async def test_a_move_refused_by_a_claim_in_flight_waits_for_it(
    tmp_path: Path, db_url: str
) -> None:
    async with step_rig(tmp_path, db_url) as rig:
        worker = rig.worker
        assert worker.shares.take("sim")  # a task of ours, on an operation of the provider
        free = worker.shares.free(HOOKS)
        async with held_claim(db_url, worker) as tick:
            move = asyncio.ensure_future(worker.move("sim", HOOKS))
            await turns()
            assert not move.done()  # waiting for the claim, not refused
            assert worker.shares.free(HOOKS) == free
        assert await tick == 0  # nothing was due
        assert await asyncio.wait_for(move, 10)
        assert worker.shares.free(HOOKS) == free - 1 and worker.shares.free("sim") > 0


async def test_a_move_into_a_providers_share_waits_for_the_claim_too(
    tmp_path: Path, db_url: str
) -> None:
    """A task whose create lent the provider's slot back and whose next read is due at
    once takes a slot of the provider's share again. Taken during a claim, it could be
    the one a claimed operation was given: that operation, its read charged, then waited
    with no slot for its lease to expire (30 s), and its charge was never observed."""
    async with step_rig(tmp_path, db_url) as rig:
        worker = rig.worker
        free = worker.shares.free("sim")
        async with held_claim(db_url, worker) as tick:
            move = asyncio.ensure_future(worker.move(NO_SLOT, "sim"))
            await turns()
            assert not move.done()  # waiting for the claim, not taking its slot
            assert worker.shares.free("sim") == free
        assert await tick == 0  # nothing was due
        assert await asyncio.wait_for(move, 10)
        assert worker.shares.free("sim") == free - 1


async def test_a_full_share_refuses_the_move_at_once(tmp_path: Path, db_url: str) -> None:
    async with step_rig(tmp_path, db_url) as rig:
        worker = rig.worker
        assert worker.shares.take("sim")
        while worker.shares.take(HOOKS):
            pass
        assert not await asyncio.wait_for(worker.move("sim", HOOKS), 1)


async def test_the_next_claim_lets_the_waiting_task_move_first(tmp_path: Path, db_url: str) -> None:
    """Under load one claim follows another: begun before the task woken by the first
    resumed, the second held the slot back again and the task gave its lease back."""
    async with step_rig(tmp_path, db_url) as rig:
        worker = rig.worker
        assert worker.shares.take("sim")
        free = worker.shares.free(HOOKS)
        following: list[asyncio.Future[int]] = []
        async with held_claim(db_url, worker) as tick:
            # The moment the first claim is done, the next one starts.
            tick.add_done_callback(lambda _: following.append(asyncio.ensure_future(worker.tick())))
            move = asyncio.ensure_future(worker.move("sim", HOOKS))
            await turns()
            assert not move.done()
        assert await asyncio.wait_for(move, 10)
        assert await tick == 0 and await following[0] == 0
        assert worker.shares.free(HOOKS) == free - 1


async def test_a_slot_held_ahead_is_refused_at_once_while_a_claim_is_in_flight(
    tmp_path: Path, db_url: str
) -> None:
    """The slot a task holds ahead of its write (the completion's, the callback's) does not
    wait for the claim in flight: queued writes share a commit, so the write goes ahead."""
    async with step_rig(tmp_path, db_url) as rig:
        worker = rig.worker
        free = worker.shares.free(HOOKS)
        async with held_claim(db_url, worker) as tick:
            assert worker.take(HOOKS) is False
        assert await tick == 0
        assert worker.shares.free(HOOKS) == free
