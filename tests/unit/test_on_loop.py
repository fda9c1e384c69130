"""Blocking code in a writer greenlet on the loop (``storage.on_loop``): its waits are the
loop's, what it keeps to itself stays its own, and a cancelled writer ends."""

from __future__ import annotations

import asyncio
import threading

import pytest
from greenlet import greenlet

from reconciler.storage import on_loop

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_wait_in_a_writer_lets_the_loop_go_on() -> None:
    order: list[str] = []
    go = asyncio.Event()

    def writer() -> str:
        order.append("writer waits")
        on_loop.await_(go.wait())
        order.append("writer goes on")
        return "done"

    task = asyncio.ensure_future(on_loop.drive(writer))
    await asyncio.sleep(0)
    order.append("loop runs")
    go.set()
    assert await task == "done"
    assert order == ["writer waits", "loop runs", "writer goes on"]


async def test_an_error_of_what_it_awaited_is_raised_where_it_waited() -> None:
    async def fails() -> None:
        raise LookupError("gone")

    def writer() -> str:
        try:
            on_loop.await_(fails())
        except LookupError as exc:
            return f"caught {exc}"
        return "not raised"

    assert await on_loop.drive(writer) == "caught gone"


async def test_a_lane_of_a_writer_waits_and_goes_on_where_it_was() -> None:
    """A greenlet a writer starts (a pipelined lane) waits too, and is switched back to."""

    def writer() -> list[int]:
        seen: list[int] = []

        def lane(n: int) -> None:
            on_loop.await_(asyncio.sleep(0))
            seen.append(n)

        for n in range(3):
            greenlet(lane).switch(n)
        return seen

    assert await on_loop.drive(writer) == [0, 1, 2]


async def test_what_each_writer_keeps_is_its_own_and_threads_keep_theirs() -> None:
    local = on_loop.WriterLocal(turn=None)
    both = asyncio.Barrier(2)

    def writer(name: str) -> tuple[object, object]:
        local.turn = name
        on_loop.await_(both.wait())  # the other writer set its own meanwhile
        return on_loop.driven() is not None, local.turn

    results = await asyncio.gather(
        on_loop.drive(lambda: writer("a")), on_loop.drive(lambda: writer("b"))
    )
    assert results == [(True, "a"), (True, "b")]
    assert local.turn is None  # the loop itself is not a writer

    def on_a_thread() -> object:
        local.turn = "thread"
        return local.turn

    assert await asyncio.to_thread(on_a_thread) == "thread"
    assert local.turn is None


async def test_a_cancelled_writer_is_told_and_its_task_ends_cancelled() -> None:
    stopped = threading.Event()
    steps: list[str] = []

    def writer() -> None:
        while not stopped.is_set():
            try:
                on_loop.await_(asyncio.Event().wait())  # never set
            except asyncio.CancelledError:
                steps.append("cancelled where it waited")  # a writer catches and goes on
        steps.append("returned")

    task = asyncio.ensure_future(on_loop.drive(writer, on_cancel=stopped.set))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert steps == ["cancelled where it waited", "returned"]
    assert task.cancelled()


def test_outside_a_writer_there_is_none() -> None:
    assert on_loop.driven() is None


async def test_a_pause_in_a_writer_is_the_loops() -> None:
    order: list[str] = []

    def writer() -> None:
        on_loop.sleep(0.001)
        order.append("writer")

    task = asyncio.ensure_future(on_loop.drive(writer))
    await asyncio.sleep(0)
    order.append("loop")
    await task
    assert order == ["loop", "writer"]


def test_waiting_outside_a_writer_is_a_mistake_said_plainly() -> None:
    async def never() -> None:
        raise AssertionError("not awaited")

    waited = never()
    with pytest.raises(RuntimeError, match="writer greenlet"):
        on_loop.await_(waited)
    waited.close()


async def test_a_blocking_call_in_a_writer_goes_to_a_thread_and_the_loop_goes_on() -> None:
    release = threading.Event()
    ran_on: list[str] = []

    def blocks() -> str:
        ran_on.append(threading.current_thread().name)
        assert release.wait(10)
        return "done"

    task = asyncio.ensure_future(on_loop.drive(lambda: on_loop.off_loop(blocks)))
    await asyncio.sleep(0)
    release.set()  # the loop runs this while the writer's call blocks
    assert await task == "done"
    assert ran_on != [threading.current_thread().name]
    assert on_loop.off_loop(lambda: "here") == "here"  # outside a writer: here and now
