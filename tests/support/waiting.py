"""Waiting for something a test observes, instead of sleeping for it.

One helper, so every wait in the suite polls the same way: often (a condition that
holds is seen within a poll interval, so a fast machine does not wait for a slow
one's margin) and for long (a generous timeout costs nothing when the condition
holds, and only a broken one reaches it). The looks thin out as a wait goes on: the
first come every 20 ms, later ones every 100 ms, so a wait of half a minute costs a few
hundred looks (each a query or a request the service answers), not fifteen hundred, on
a machine whose cores the whole suite shares.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

POLL_SECONDS = 0.02  # the first interval
POLL_MAX_SECONDS = 0.1  # the longest one
GROWTH = 1.25


def _intervals(first: float) -> Iterator[float]:
    interval, longest = first, max(first, POLL_MAX_SECONDS)
    while True:
        yield interval
        interval = min(interval * GROWTH, longest)


def wait_until(
    predicate: Callable[[], Any], timeout: float, what: str, *, poll: float = POLL_SECONDS
) -> Any:
    """Poll ``predicate`` until it returns something truthy (bounded); return it."""
    deadline = time.monotonic() + timeout
    intervals = _intervals(poll)
    while (value := _look(predicate, deadline, timeout, what)) is None:
        time.sleep(next(intervals))
    return value


async def wait_until_async(
    predicate: Callable[[], Any], timeout: float, what: str, *, poll: float = POLL_SECONDS
) -> Any:
    """``wait_until`` inside an event loop: the loop keeps running what is awaited."""
    deadline = time.monotonic() + timeout
    intervals = _intervals(poll)
    while (value := _look(predicate, deadline, timeout, what)) is None:
        await asyncio.sleep(next(intervals))
    return value


def _look(predicate: Callable[[], Any], deadline: float, timeout: float, what: str) -> Any:
    """The predicate's value when truthy; ``None`` to look again; past the deadline, fail."""
    value = predicate()
    if value:
        return value
    if time.monotonic() > deadline:
        raise AssertionError(f"timed out after {timeout} s waiting for {what}")
    return None
