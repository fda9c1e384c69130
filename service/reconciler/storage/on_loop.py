"""Blocking write code run on the event loop: each PostgreSQL writer is a greenlet there.

A writer on a thread of its own hands the interpreter lock back and forth with the
loop at every answer it waits for: each hand-off wakes a thread on another core, and
while it is in transit no thread of the process runs. Run as a greenlet on the loop
(``drive``), the same blocking code (SQLAlchemy, ``fastsql``, a transactional hook)
waits for the server's answer the way a coroutine does: the connection's waits
(``LoopConnection.wait``) switch back to the loop, which awaits the socket and goes on
with its other work meanwhile, and switches back once the answer is there.

What each writer keeps to itself (its job's deadline, its pipelined turn) lives in a
``WriterLocal``: per writer greenlet on the loop, per thread elsewhere (reads on worker
threads, SQLite's writer thread, tests that call the code directly).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, TypeVar

from greenlet import getcurrent, greenlet

if TYPE_CHECKING:
    import psycopg

T = TypeVar("T")


class Driven(greenlet):  # type: ignore[misc]
    """A writer's greenlet on the loop; ``drive`` runs it."""

    def __init__(self, run: Callable[..., Any]) -> None:
        super().__init__(run)
        self.locals: dict[WriterLocal, Any] = {}


class _Await:
    __slots__ = ("awaitable", "waiter")

    def __init__(self, awaitable: Awaitable[Any], waiter: Any) -> None:
        self.awaitable = awaitable
        self.waiter = waiter


def driven() -> Driven | None:
    """The writer greenlet the running code belongs to (its own or a lane's parent)."""
    g = getcurrent()
    while g is not None:
        if isinstance(g, Driven):
            return g
        g = g.parent
    return None


def await_(awaitable: Awaitable[T]) -> T:
    """Wait for ``awaitable`` from blocking code in a writer greenlet: the loop goes on."""
    writer = driven()
    if writer is None:
        raise RuntimeError("await_ runs in a writer greenlet (on_loop.drive)")
    # To the greenlet that runs the loop (``drive``'s), which awaits and switches back.
    result: T = writer.parent.switch(_Await(awaitable, getcurrent()))
    return result


def sleep(seconds: float) -> None:
    """A pause in blocking code: awaited in a writer on the loop, which goes on meanwhile."""
    if driven() is None:
        time.sleep(seconds)
    else:
        await_(asyncio.sleep(seconds))


def off_loop(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, which blocks (a connect, a barrier): on a thread from a writer on the
    loop, which goes on meanwhile; elsewhere here and now."""
    if driven() is None:
        return fn(*args)
    return await_(asyncio.to_thread(fn, *args))


async def drive(fn: Callable[[], T], on_cancel: Callable[[], None] | None = None) -> T:
    """Run ``fn`` in a writer greenlet; its ``await_``s are awaited here, on the loop.

    Cancelled, the task raises ``CancelledError`` where ``fn`` waited, after
    ``on_cancel`` (which should make ``fn`` return: a caught cancellation is delivered
    once), and ends cancelled once ``fn`` has returned.
    """
    g = Driven(fn)
    cancelled = False
    value = g.switch()
    while isinstance(value, _Await):
        waiter = value.waiter
        try:
            result = await value.awaitable
        except asyncio.CancelledError as exc:
            cancelled = True
            if on_cancel is not None:
                on_cancel()
            value = waiter.throw(exc)
        except BaseException as exc:  # raised where the writer waited
            value = waiter.throw(exc)
        else:
            value = waiter.switch(result)
    if cancelled:
        raise asyncio.CancelledError()
    out: T = value
    return out


class WriterLocal:
    """Attributes of one writer, with defaults: per ``Driven`` greenlet, else per thread."""

    __slots__ = ("_defaults", "_thread")

    def __init__(self, **defaults: Any) -> None:
        object.__setattr__(self, "_defaults", defaults)
        object.__setattr__(self, "_thread", _ThreadSpace(defaults))

    def _space(self) -> Any:
        g = driven()
        if g is None:
            return self._thread
        space = g.locals.get(self)
        if space is None:
            space = g.locals[self] = SimpleNamespace(**self._defaults)
        return space

    def __getattr__(self, name: str) -> Any:
        return getattr(self._space(), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._space(), name, value)


class _ThreadSpace(threading.local):
    def __init__(self, defaults: dict[str, Any]) -> None:
        self.__dict__.update(defaults)


def loop_connection_class() -> type[psycopg.Connection[Any]]:
    """psycopg's Connection whose waits, in a writer greenlet, are the loop's; elsewhere
    (a read on a worker thread) they block as psycopg's own do."""
    import psycopg  # PostgreSQL's driver is an optional dependency
    from psycopg import waiting

    class LoopConnection(psycopg.Connection[Any]):
        def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
            if driven() is None:
                return super().wait(gen, interval, timeout)
            return await_(
                waiting.wait_async(gen, self.pgconn.socket, interval=interval, timeout=timeout)
            )

    return LoopConnection
