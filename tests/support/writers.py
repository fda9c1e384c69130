"""Holding the database's writers in place, on threads or on the loop alike."""

from __future__ import annotations

import threading
from collections.abc import Callable

from reconciler.storage import on_loop


def held_until(go: threading.Event, entered: threading.Semaphore) -> Callable[[], None]:
    """A write (``Database.run_write``) that says it began, then holds its writer until
    ``go``: blocked on a writer thread; awaited by a writer on the loop, which goes on."""

    def hold() -> None:
        entered.release()
        let_go = on_loop.off_loop(go.wait, 10)
        assert let_go, "the test never let the writers go"

    return hold
