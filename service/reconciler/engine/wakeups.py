"""Wake-ups for the worker and change signals for waiters, in-process and across replicas.

In-process: the worker's wake callback runs on the event loop, and waiters
on one operation share an ``asyncio.Event`` per operation id (thousands of
waiters cost a dict entry and a future each, no polling). A change made in
this process hands its waiters the record as it was committed (``Change.record``),
so they need not read it again.

Across replicas (PostgreSQL): writers send ``pg_notify`` in the same
transaction as the change, so a notification is delivered exactly when the
change is committed and never for a change that rolled back; each replica
LISTENs on one dedicated connection and relays to its local waiters.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from reconciler.core.records import OperationRecord
from reconciler.storage.notify import WAKE_CHANNEL, notifications

log = logging.getLogger("reconciler.engine.wakeups")

# The listener tries to reconnect this often while PostgreSQL is away.
RECONNECT_SECONDS = 1.0
# A change this process committed reaches its waiters from the writer, with the record
# it committed (``Notifier.changed``). PostgreSQL's notification of the same change, sent
# by one of this process's own connections, usually comes first, and each waiter would
# read the row again (an agent's create waiting for its job id: one read transaction an
# operation). It is relayed this much later instead: by then the writer's relay has
# come, and a change no writer relays here still wakes its waiters.
OWN_CHANGE_DELAY_SECONDS = 0.05


class _ListenerHealth:
    """One WARNING when the listener loses PostgreSQL, one line when it is back.

    Reconnecting every second while the database is down must not write a line every
    second: the later failures of one outage are logged at debug only.
    """

    def __init__(self) -> None:
        self.down_since: float | None = None
        self.attempts = 0

    def lost(self, exc: Exception) -> None:
        self.attempts += 1
        if self.down_since is not None:
            log.debug("notification listener still down: %s", type(exc).__name__)
            return
        self.down_since = time.monotonic()
        log.warning(
            "notification listener lost its connection: %s; reconnecting every %g s, "
            "other replicas' changes are seen at the next tick meanwhile",
            type(exc).__name__,
            RECONNECT_SECONDS,
        )

    def listening(self) -> None:
        if self.down_since is None:
            return
        log.info(
            "notification listener reconnected after %.1f s (%d failed attempts)",
            time.monotonic() - self.down_since,
            self.attempts,
        )
        self.down_since = None
        self.attempts = 0


class Change(asyncio.Event):
    """Set at the next change of one operation; ``record`` is the committed record when the
    change was made in this process (None: from another replica, or on shutdown)."""

    record: OperationRecord | None = None


class Notifier:
    def __init__(self, own_change_delay: float = OWN_CHANGE_DELAY_SECONDS) -> None:
        self.own_change_delay = own_change_delay
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiters: dict[str, Change] = {}
        self._counts: dict[str, int] = {}
        self._wake_handlers: list[Callable[[], None]] = []
        self._listener: asyncio.Task[None] | None = None
        self.closing = False

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def on_wake(self, handler: Callable[[], None]) -> None:
        self._wake_handlers.append(handler)

    # Both signals may be raised from worker threads (database code); they hop to the loop.
    def wake(self) -> None:
        self._call(self._wake_local)

    def changed(self, operation_id: str, record: OperationRecord | None = None) -> None:
        self._call(self._changed_local, operation_id, record)

    def _call(self, fn: Callable[..., None], *args: Any) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            fn(*args)
        else:
            with contextlib.suppress(RuntimeError):  # loop shutting down
                loop.call_soon_threadsafe(fn, *args)

    def _wake_local(self) -> None:
        for handler in self._wake_handlers:
            handler()

    def _changed_local(self, operation_id: str, record: OperationRecord | None = None) -> None:
        event = self._waiters.pop(operation_id, None)
        self._counts.pop(operation_id, None)
        if event is not None:
            event.record = record
            event.set()

    def close_waits(self) -> None:
        """The process is stopping: every waiter wakes now (and answers what it has)."""
        self._call(self._close_local)

    def _close_local(self) -> None:
        self.closing = True
        waiters, self._waiters = self._waiters, {}
        self._counts.clear()
        for event in waiters.values():
            event.set()

    def subscribe(self, operation_id: str) -> Change:
        """An event set at the next change of this operation (shared by all its waiters)."""
        if self.closing:
            done = Change()
            done.set()
            return done
        event = self._waiters.get(operation_id)
        if event is None:
            event = self._waiters[operation_id] = Change()
        self._counts[operation_id] = self._counts.get(operation_id, 0) + 1
        return event

    def unsubscribe(self, operation_id: str, event: asyncio.Event) -> None:
        if self._waiters.get(operation_id) is not event:
            return  # already fired and replaced
        left = self._counts.get(operation_id, 1) - 1
        if left <= 0:
            self._waiters.pop(operation_id, None)
            self._counts.pop(operation_id, None)
        else:
            self._counts[operation_id] = left

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    async def listen(self, dsn: str, own: Callable[[int], bool] = lambda _pid: False) -> None:
        """Relay PostgreSQL notifications to local handlers until cancelled; reconnects.

        ``own(pid)``: whether the server process that sent one serves this process's own
        connections (its changes are relayed later: ``OWN_CHANGE_DELAY_SECONDS``)."""
        health = _ListenerHealth()
        loop = asyncio.get_running_loop()
        while True:
            try:
                async for channel, payload, pid in notifications(dsn, health.listening):
                    if channel == WAKE_CHANNEL:
                        self._wake_local()
                    elif own(pid):
                        loop.call_later(self.own_change_delay, self._changed_local, payload)
                    else:
                        self._changed_local(payload)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the listener must outlive database restarts
                health.lost(exc)
                await asyncio.sleep(RECONNECT_SECONDS)

    def start_listener(self, url: str, own: Callable[[int], bool] = lambda _pid: False) -> None:
        dsn = sa.make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        self._listener = asyncio.get_running_loop().create_task(self.listen(dsn, own))

    async def stop(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listener
            self._listener = None
