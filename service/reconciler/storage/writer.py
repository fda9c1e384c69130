"""Write transactions behind a bounded queue, each with a bound on its wait.

The writers are threads of their own (SQLite), or greenlets on the event loop whose
waits for the server are the loop's (``loop_writers``, PostgreSQL: ``storage.on_loop``).

Guarantee: a wait for the database's write lock blocks only writers. The
event loop hands a write to the queue and awaits it for at most the bound;
past it the caller gets ``StorageUnavailable`` (a 503 with ``Retry-After``)
and the job, if it has not started yet, is dropped unrun. A full queue is
refused at once. Reads never queue here (``Database.run``).

A job that already started when its caller gave up may still commit: the
caller was told "retry", and a retry meets the idempotency key or the
webhook's event id, so nothing is applied twice.

Outcomes go back to the loop through one mailbox per loop: a busy writer thread that
finishes several jobs before the loop runs again wakes it once, not once each. A
writer on the caller's own loop settles the caller's future directly.

Writes that can share a transaction (``run_joined``: a function of the connection) are
taken together: a writer that finds more of them queued behind the one it took hands all
of them to ``join`` (``Database.write_together``), one transaction in which a write that
fails undoes only itself, and answers each only after that transaction committed. The
writes run in the order of their keys (the operation each locks), so two such
transactions take shared rows in one order. What is not joinable keeps its own
transaction and its place in the queue.

A write a request on the wire waits for (``first``: a webhook batch, an agent's create)
goes ahead of the queued ones, in order among such writes: its caller's bound (2 s for
a webhook) is then spent on one transaction, never on the engine's backlog, so a busy
service does not refuse a delivery or a create while its database works.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import sqlalchemy as sa

from reconciler.core.errors import StorageUnavailable
from reconciler.storage import on_loop

T = TypeVar("T")

# What ``join`` gets: each joined write as a function of the shared connection, with the
# attempts it may make after a lost race and its key (the operation whose row it locks),
# in key order. It answers one (result, error) per write, in order, or raises for all.
Joined = tuple[Callable[[Any], Any], int, str]
Join = Callable[[Sequence[Joined]], list[tuple[Any, BaseException | None]]]
# The most writes one transaction carries: the last of them waits for all before it.
JOIN_LIMIT = 32


@dataclass
class _Job:
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    deadline: float  # time.monotonic() after which the job is not started
    mailbox: _Mailbox
    future: asyncio.Future[Any]
    abandoned: bool = field(default=False)
    joins: bool = field(default=False)  # ``fn(conn, *args)``, for ``join``
    attempts: int = field(default=1)
    key: str = field(default="")  # the operation whose row it locks: the order joined
    first: bool = field(default=False)  # ahead of the queued writes (see the module)

    def joined(self) -> Joined:
        return (lambda conn: self.fn(conn, *self.args)), self.attempts, self.key


def _detached(exc: BaseException) -> BaseException:
    """``exc`` without the tracebacks of a driver error in its chain.

    Those tracebacks hold the driver's cursors. Freed on the event loop, a SQLite cursor
    resets its statement, which waits for its connection's mutex, and the pool may have
    handed that connection to the next write, now waiting out the busy timeout: the
    loop would stall for as long. The message and the error's type are what callers use.
    """
    chain: list[BaseException] = []
    link: BaseException | None = exc
    while link is not None and link not in chain:
        chain.append(link)
        orig = getattr(link, "orig", None)
        if isinstance(orig, BaseException) and orig not in chain:
            chain.append(orig)
        link = link.__cause__ or link.__context__
    if any(isinstance(e, sqlite3.Error | sa.exc.DBAPIError) for e in chain):
        for e in chain:
            e.__traceback__ = None
    return exc


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if isinstance(error, asyncio.CancelledError):  # the writer's task was cancelled
        future.cancel()
    elif error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class _Mailbox:
    """Finished jobs waiting for their loop; the loop is woken only when it is not yet due.

    The writer appends, then schedules a drain unless one is pending; the drain clears the
    flag before it empties the box, so an outcome appended meanwhile is either taken by
    this drain or schedules the next (``deque`` appends and pops are atomic).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.box: collections.deque[tuple[asyncio.Future[Any], Any, BaseException | None]] = (
            collections.deque()
        )
        self.pending = False

    def post(self, future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
        self.box.append((future, result, error))
        if not self.pending:
            self.pending = True
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody is waiting
                self.loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        self.pending = False
        box = self.box
        while box:
            _settle(*box.popleft())


class _Queue(queue.Queue[_Job | None]):
    """FIFO, except that ``first`` jobs go ahead of the others, FIFO among themselves."""

    def _init(self, maxsize: int) -> None:
        super()._init(maxsize)
        self.ahead = 0  # the first jobs at the head of the deque

    def _put(self, item: _Job | None) -> None:
        if item is not None and item.first:
            self.queue.insert(self.ahead, item)
            self.ahead += 1
        else:
            self.queue.append(item)

    def _get(self) -> _Job | None:
        if self.ahead:
            self.ahead -= 1
        job: _Job | None = self.queue.popleft()
        return job


class Writer:
    """``threads`` writers fed by one queue of at most ``queue_limit`` jobs: threads, or
    with ``loop_writers`` greenlets on the loop of the writes (started by the first)."""

    def __init__(
        self,
        *,
        threads: int,
        queue_limit: int,
        wait_seconds: float,
        join: Join,
        join_limit: int = JOIN_LIMIT,
        on_timeout: Callable[[str], None] | None = None,
        loop_writers: bool = False,
    ) -> None:
        self.wait_seconds = wait_seconds
        self._join = join
        self._join_limit = join_limit
        self._queue = _Queue(maxsize=queue_limit)
        self._local = on_loop.WriterLocal(deadline=None)
        self._on_loop = loop_writers
        self._count = threads
        # On the loop: the writers' tasks, and what wakes them.
        self._drivers: list[asyncio.Task[None]] = []
        self._nonempty: asyncio.Event | None = None
        self._stopped = False
        # The mailbox of the loop that asked last (each job keeps its own, so a second loop
        # only costs the first its coalescing, never an outcome).
        self._mailbox: _Mailbox | None = None
        self._on_timeout = on_timeout
        self._threads = [
            threading.Thread(target=self._loop, name=f"db-writer-{i}", daemon=True)
            for i in range(0 if loop_writers else threads)
        ]
        for thread in self._threads:
            thread.start()

    @property
    def count(self) -> int:
        """How many write transactions may be in flight at once (one per writer)."""
        return self._count

    def deadline(self) -> float | None:
        """The running job's deadline (``time.monotonic()``), in a writer; else None."""
        value: float | None = getattr(self._local, "deadline", None)
        return value

    async def run(self, fn: Callable[..., T], *args: Any, wait: float | None = None) -> T:
        """Run ``fn(*args)`` in a writer; wait at most ``wait`` (default: the bound)."""
        return await self._submit(fn, args, wait, joins=False)

    async def run_joined(
        self,
        fn: Callable[..., T],
        *args: Any,
        attempts: int = 1,
        key: str = "",
        first: bool = False,
    ) -> T:
        """Run ``fn(conn, *args)`` in a write transaction it may share with the other
        joined writes queued with it (at most ``join_limit``), through ``join``, which
        takes them in ``key`` order (queue order among equal keys); ``first``: ahead of
        the writes queued before it (a request on the wire waits for it)."""
        return await self._submit(
            fn, args, None, joins=True, attempts=attempts, key=key, first=first
        )

    async def _submit(
        self,
        fn: Callable[..., T],
        args: tuple[Any, ...],
        wait: float | None,
        *,
        joins: bool,
        attempts: int = 1,
        key: str = "",
        first: bool = False,
    ) -> T:
        bound = self.wait_seconds if wait is None else wait
        loop = asyncio.get_running_loop()
        mailbox = self._mailbox
        if mailbox is None or mailbox.loop is not loop:
            mailbox = self._mailbox = _Mailbox(loop)
        future = loop.create_future()
        deadline = time.monotonic() + bound
        job = _Job(fn, args, deadline, mailbox, future, joins=joins, attempts=attempts, key=key)
        job.first = first
        if self._on_loop:
            self._start_on(loop)
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            self._timed_out("the write queue is full")
            raise StorageUnavailable(
                "the database is busy (write queue full); retry later"
            ) from None
        self._signal()
        try:
            result: T = await asyncio.wait_for(asyncio.shield(job.future), bound)
        except TimeoutError:
            job.abandoned = True
            job.future.cancel()  # nobody will read its outcome
            self._timed_out(f"a write waited more than {bound:g} s")
            raise StorageUnavailable(
                f"the database did not complete the write within {bound:g} s; retry later"
            ) from None
        except asyncio.CancelledError:
            job.abandoned = True
            job.future.cancel()
            raise
        return result

    def _start_on(self, loop: asyncio.AbstractEventLoop) -> None:
        """On the loop: the writers run on the loop of the first write, and again on a
        later one once theirs has stopped (a loop that no longer runs serves nobody)."""
        running = self._drivers_loop()
        alive = any(not task.done() for task in self._drivers)
        if alive and (running is loop or (running is not None and running.is_running())):
            return
        self._stopped = False
        self._nonempty = asyncio.Event()
        # Each writer starts from an empty context, as a thread would: a job's caller reads
        # what it needs from its own before it queues the job.
        self._drivers = [
            loop.create_task(self._drive(), name=f"db-writer-{i}", context=contextvars.Context())
            for i in range(self._count)
        ]

    def _drivers_loop(self) -> asyncio.AbstractEventLoop | None:
        return self._drivers[0].get_loop() if self._drivers else None

    async def _drive(self) -> None:
        await on_loop.drive(self._loop, on_cancel=self._stop)

    def _stop(self) -> None:
        self._stopped = True

    def _signal(self) -> None:
        """Wake the writers on the loop (from their loop, or from another thread's)."""
        nonempty, loop = self._nonempty, self._drivers_loop()
        if nonempty is None or loop is None:
            return
        if _running_loop() is loop:
            nonempty.set()
        else:
            with contextlib.suppress(RuntimeError):  # their loop closed: nobody is waiting
                loop.call_soon_threadsafe(nonempty.set)

    def _get(self) -> _Job | None:
        """The next job, waiting for one: on a thread, blocked; on the loop, awaited."""
        if not self._on_loop:
            return self._queue.get()
        nonempty = self._nonempty
        assert nonempty is not None
        while not self._stopped:
            try:
                return self._queue.get_nowait()
            except queue.Empty:
                nonempty.clear()
                on_loop.await_(nonempty.wait())
        return None

    def _timed_out(self, why: str) -> None:
        if self._on_timeout is not None:
            self._on_timeout(why)

    def _loop(self) -> None:
        # A job taken from the queue while gathering joined writes, to run next.
        held: collections.deque[_Job | None] = collections.deque()
        while True:
            job = held.popleft() if held else self._get()
            if job is None:
                return
            if not self._startable(job):
                continue
            if not job.joins:
                self._run_one(job)
                continue
            jobs = [job]
            while len(jobs) < self._join_limit and not held:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is not None and more.joins:
                    if self._startable(more):
                        jobs.append(more)
                else:
                    held.append(more)  # its own turn, right after these
            self._run_joined(jobs)

    def _startable(self, job: _Job) -> bool:
        """Whether ``job`` may still start: its caller waits and its deadline is ahead."""
        if job.abandoned or time.monotonic() >= job.deadline:
            self._post(job, None, StorageUnavailable("the write was not started in time"))
            return False
        return True

    def _run_one(self, job: _Job) -> None:
        self._local.deadline = job.deadline
        try:
            result = job.fn(*job.args)
        except BaseException as exc:  # handed to the awaiting coroutine, which raises it
            self._post(job, None, _detached(exc))
        else:
            self._post(job, result, None)
        finally:
            self._local.deadline = None

    def _run_joined(self, jobs: list[_Job]) -> None:
        # The transaction waits for the lock no longer than the most hurried of its callers.
        self._local.deadline = min(job.deadline for job in jobs)
        jobs.sort(key=lambda job: job.key)  # stable: one operation's writes keep their order
        try:
            outcomes = self._join([job.joined() for job in jobs])
        except BaseException as exc:  # the transaction failed: none of them was written
            error = _detached(exc)
            for job in jobs:
                self._post(job, None, error)
        else:
            for job, (result, err) in zip(jobs, outcomes, strict=True):
                self._post(job, result, None if err is None else _detached(err))
        finally:
            self._local.deadline = None

    def _post(self, job: _Job, result: Any, error: BaseException | None) -> None:
        if self._on_loop and job.mailbox.loop is self._drivers_loop():
            _settle(job.future, result, error)  # a writer on the caller's own loop
        else:
            job.mailbox.post(job.future, result, error)

    async def aclose(self, timeout: float = 5.0) -> None:
        """Let the writers finish what is queued, then stop them (on the loop: awaited)."""
        drivers = self._drivers if self._drivers_loop() is _running_loop() else []
        self.close(timeout)
        if drivers:
            _, late = await asyncio.wait(drivers, timeout=timeout)
            for task in late:
                task.cancel()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the writers after the jobs queued now; writer threads are waited for."""
        if self._on_loop:
            for _ in self._drivers:
                with contextlib.suppress(queue.Full):
                    self._queue.put_nowait(None)
            self._signal()
            return
        for _ in self._threads:
            with contextlib.suppress(queue.Full):
                self._queue.put(None, timeout=timeout)
        for thread in self._threads:
            thread.join(timeout=timeout)
