"""Waiting for something a test observes, instead of sleeping for it.

One helper, so every wait in the suite polls the same way: often (a condition that
holds is seen within a poll interval, so a fast machine does not wait for a slow
one's margin) and for long (a generous timeout costs nothing when the condition
holds, and only a broken one reaches it).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

POLL_SECONDS = 0.02


def wait_until(
    predicate: Callable[[], Any], timeout: float, what: str, *, poll: float = POLL_SECONDS
) -> Any:
    """Poll ``predicate`` until it returns something truthy (bounded); return it."""
    deadline = time.monotonic() + timeout
    while (value := _look(predicate, deadline, timeout, what)) is None:
        time.sleep(poll)
    return value


async def wait_until_async(
    predicate: Callable[[], Any], timeout: float, what: str, *, poll: float = POLL_SECONDS
) -> Any:
    """``wait_until`` inside an event loop: the loop keeps running what is awaited."""
    deadline = time.monotonic() + timeout
    while (value := _look(predicate, deadline, timeout, what)) is None:
        await asyncio.sleep(poll)
    return value


def _look(predicate: Callable[[], Any], deadline: float, timeout: float, what: str) -> Any:
    """The predicate's value when truthy; ``None`` to look again; past the deadline, fail."""
    value = predicate()
    if value:
        return value
    if time.monotonic() > deadline:
        raise AssertionError(f"timed out after {timeout} s waiting for {what}")
    return None
