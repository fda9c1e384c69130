"""The worker: claims due operations under a lease and runs one step at a time on each.

The scheduler only says *when* to look (``tick``); whether there is work,
and who may do it, is decided by the database: ``store.claim_due`` leases
due rows to this worker, and every write a step makes is conditional on
still holding that lease (``journal.Lease``), so a worker whose lease
expired cannot write. A claimed operation is reloaded before anything is
sent (seed 003: another worker may have finished it meanwhile).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import NamedTuple

from reconciler.core.states import END_STATES, State
from reconciler.engine.context import StepContext
from reconciler.errors import Bug, ReconcilerError, StaleWrite, StorageUnavailable
from reconciler.logs import operation_id_var, trace_id_var
from reconciler.storage import operations as store
from reconciler.storage.models import Operation

log = logging.getLogger("reconciler.engine.worker")

# A step does one unit of work on a leased, freshly loaded operation and writes its outcome.
Step = Callable[[Operation], Awaitable[None]]


class Steps(NamedTuple):
    """The steps a worker runs; which one runs is decided by ``step_table``."""

    create: Step
    poll: Step
    cancel: Step
    collect: Step
    complete: Step | None


def step_table(steps: Steps) -> dict[State, Step]:
    """The state-to-step table: what a worker does with an operation in each local state.

    States without a step (``accepted`` only passes by, ``escalated`` waits for a person,
    the end states are only completed) are parked until something changes them.
    """
    return {
        State.CREATE_PENDING: steps.create,
        State.CREATE_UNKNOWN: steps.create,
        State.OBSERVING: steps.poll,
        State.CANCELLING: steps.poll,
        State.CANCEL_REQUESTED: steps.cancel,
        State.RESULT_COLLECTING: steps.collect,
    }


# Steps per claim: enough to go from a confirmed success through result collection to the
# completion handler without waiting for another tick, few enough that one operation cannot
# monopolise a worker.
MAX_STEPS_PER_CLAIM = 6
# The longest one claim may keep its lease alive by heartbeats.
MAX_HELD_SECONDS = 600.0


class Worker:
    def __init__(
        self,
        ctx: StepContext,
        steps: Steps,
        *,
        max_in_flight: int = 256,
        on_next_due: Callable[[datetime], None] | None = None,
    ) -> None:
        self.ctx = ctx
        self.runtime = ctx.runtime
        self.steps = step_table(steps)
        self.completion = steps.complete
        self.max_in_flight = max_in_flight
        self.on_next_due = on_next_due
        self._tasks: set[asyncio.Task[None]] = set()
        self._working: set[str] = set()  # operations one of our tasks is on
        self._claiming = False
        self._again = False
        self._stopping = False

    @property
    def owner(self) -> str:
        return self.runtime.worker_id

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    async def tick(self) -> int:
        """Claim what is due (up to capacity) and start working on it; returns claims made."""
        if self._stopping:
            return 0
        if self._claiming:
            self._again = True
            return 0
        self._claiming = True
        claimed = 0
        try:
            while not self._stopping:
                self._again = False
                capacity = min(
                    self.max_in_flight - len(self._tasks),
                    self.runtime.settings.scheduler.batch_size,
                )
                if capacity <= 0:
                    break
                ids = await self._claim(capacity)
                for op_id in ids:
                    self._spawn(op_id)
                claimed += len(ids)
                if len(ids) < capacity and not self._again:
                    break
        finally:
            self._claiming = False
        return claimed

    async def _claim(self, limit: int) -> list[str]:
        rt = self.runtime
        now = rt.clock.now()

        def claim() -> list[store.Claim]:
            with rt.db.write() as conn:
                return store.claim_due(
                    conn, self.owner, now, rt.settings.scheduler.lease_seconds, limit
                )

        try:
            claims = await rt.db.run(claim)
        except StorageUnavailable:
            log.warning("claim failed: database unavailable")
            return []
        for c in claims:
            if c.taken_over_from is not None and c.taken_over_from != self.owner:
                rt.metrics.lease_takeovers.inc()
                log.info(
                    "took over an expired lease",
                    extra={"operation": c.operation_id, "previous_owner": c.taken_over_from},
                )
        return [c.operation_id for c in claims]

    def _spawn(self, op_id: str) -> None:
        if op_id in self._working:
            # Our own lease lapsed while a task of ours is still on the operation (a slow
            # step whose heartbeat fell behind); the claim renewed it. Both tasks would pass
            # every lease guard, so a second one would run the same step again.
            return
        self._working.add(op_id)
        task = asyncio.get_running_loop().create_task(self._process(op_id))
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        # A task cancelled before it ran never reached the discard in _process.
        task.add_done_callback(lambda t: self._working.discard(op_id) if t.cancelled() else None)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("worker task failed", exc_info=task.exception())
        if len(self._tasks) == self.max_in_flight - 1:
            # We were at capacity: there may be due work we could not claim.
            self.runtime.notifier.wake()

    def _step_for(self, op: Operation) -> Step | None:
        state = State(op.state)
        # Only an end state is completed: an operator may have reopened one (extend, cancel)
        # before its completion finished, and then the flows own the operation again.
        if op.completion_pending and self.completion is not None and state in END_STATES:
            return self.completion
        return self.steps.get(state)

    async def _process(self, op_id: str) -> None:
        rt = self.runtime
        operation_id_var.set(op_id)
        last: Operation | None = None
        sent_status_read = False
        heartbeat = asyncio.get_running_loop().create_task(self._heartbeat(op_id))
        try:
            for _ in range(MAX_STEPS_PER_CLAIM):
                op = await self.ctx.reload(op_id)  # reload after the claim, before anything is sent
                if op is None or op.lease_owner != self.owner:
                    return
                last = op
                trace_id_var.set(op.trace_id)
                now = rt.clock.now()
                if op.next_poll_at is None or op.next_poll_at > now:
                    break
                step = self._step_for(op)
                if step is None:
                    await self._park(op)
                    break
                is_status_read = State(op.state) in (State.OBSERVING, State.CANCELLING)
                if is_status_read and sent_status_read:
                    break  # never two status reads in one claim: a late wake sends no burst
                sent_status_read = sent_status_read or is_status_read
                try:
                    await step(op)
                except StaleWrite:
                    # Someone else wrote first (an agent's cancel, a webhook hint, an operator):
                    # reload and look again rather than act on an old picture.
                    continue
        except Bug as exc:
            log.error("bug in the step for operation %s: %s", op_id, exc.message, exc_info=exc)
        except ReconcilerError as exc:
            log.warning("step failed: %s", exc.message)
        finally:
            heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat
            # Off the list before the lease is given back: once it is, a tick may claim the
            # operation again, and that claim must start a task rather than be skipped as
            # "ours already" (the lease would then sit idle until it expired).
            self._working.discard(op_id)
            await self._release(op_id, last)

    async def _heartbeat(self, op_id: str) -> None:
        """Keep the lease while a slow step (a hook, a hung callback) is still running.

        Without it, a step longer than the lease would be claimed and run a second time by
        another worker while the first is still inside it. The lease is kept for at most
        MAX_HELD_SECONDS: a step stuck beyond that is presumed lost and may be taken over.
        """
        rt = self.runtime
        lease = rt.settings.scheduler.lease_seconds
        started = rt.clock.monotonic()
        while rt.clock.monotonic() - started < MAX_HELD_SECONDS:
            await asyncio.sleep(lease / 3)

            def extend() -> bool:
                with rt.db.write() as conn:
                    return store.extend_lease(conn, op_id, self.owner, rt.clock.now(), lease)

            try:
                if not await rt.db.run(extend):
                    return
            except StorageUnavailable:
                continue

    async def _park(self, op: Operation) -> None:
        """Nothing to do in this state: stop looking until something changes it."""
        rt = self.runtime

        def park() -> None:
            with rt.db.write() as conn:
                rt.journal.write(conn, op, now=rt.clock.now(), changes={"next_poll_at": None})

        with contextlib.suppress(StaleWrite):
            await rt.db.run(park)

    async def _release(self, op_id: str, last: Operation | None) -> None:
        rt = self.runtime

        def release() -> Operation | None:
            with rt.db.write() as conn:
                store.release(conn, [op_id], self.owner)
                return store.get_operation(conn, op_id)

        try:
            op = await rt.db.run(release)
        except StorageUnavailable:
            return  # the lease expires on its own
        if op is not None and op.next_poll_at is not None and self.on_next_due is not None:
            self.on_next_due(op.next_poll_at)

    async def drain(self, timeout: float = 10.0) -> None:
        """Stop claiming and wait for in-flight steps (bounded); leases expire otherwise."""
        self._stopping = True
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout)
        for task in list(self._tasks):
            task.cancel()
