"""Holding the database's writers in place, on threads or on the loop alike."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import TypeVar

from reconciler.storage import on_loop

T = TypeVar("T")


def held_until(go: threading.Event, entered: threading.Semaphore) -> Callable[[], None]:
    """A write (``Database.run_write``) that says it began, then holds its writer until
    ``go``: blocked on a writer thread; awaited by a writer on the loop, which goes on."""

    def hold() -> None:
        entered.release()
        let_go = blocking(lambda: go.wait(10))
        assert let_go, "the test never let the writers go"

    return hold


def blocking(fn: Callable[[], T]) -> T:
    """``fn()``, which blocks (a barrier, an event), from inside a write: on a thread when
    the writer is on the loop, which must go on meanwhile."""
    if on_loop.driven() is None:
        return fn()
    return on_loop.await_(asyncio.to_thread(fn))
