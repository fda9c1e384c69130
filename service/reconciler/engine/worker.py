"""The worker: claims due operations under a lease and runs one step at a time on each.

The scheduler only says *when* to look (``tick``); whether there is work,
and who may do it, is decided by the database: ``leases.claim_records`` leases
due rows to this worker, and every write a step makes is conditional on
still holding that lease (``journal.Lease``), so a worker whose lease
expired cannot write. A claimed operation is reloaded before anything is
sent (another worker may have finished it meanwhile, docs/design.md#polling): the claim
reads each row back once the lease is taken, in the same statement.

Fewer transactions: the claim also prepares each claimed operation's step (the
charge, reservation or start record it writes before it sends anything,
``prepare``), and a step's last write prepares the next step or gives the lease
back (``engine.flow``), so a happy path costs one transaction per step. Each claim
is worked by a task of its own (``engine.claim_run``); after its own writes a task
keeps the record they returned: nothing is read again that the lease already
guarantees.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy.engine import Connection

from reconciler.core.catch_up import probe_due
from reconciler.core.completion_lanes import choose
from reconciler.core.errors import (
    Bug,
    ReconcilerError,
    StaleWrite,
    StorageUnavailable,
)
from reconciler.core.records import OperationRecord
from reconciler.engine.catch_up import overdue_after, spread_overdue
from reconciler.engine.claim_run import ClaimRun, Crew
from reconciler.engine.context import StepContext
from reconciler.engine.flow import Prep, flow_var
from reconciler.engine.shares import CALLBACKS, HOOKS, NO_SLOT, Shares, share_of
from reconciler.engine.step_failures import StepFailures, step_retry_policy
from reconciler.engine.step_table import StepChoice, Steps
from reconciler.logs import OutageLog, operation_id_var
from reconciler.storage import leases
from reconciler.storage.availability import explain
from reconciler.storage.journal import rows_together

log = logging.getLogger("reconciler.engine.worker")

# The longest one claim may keep its lease alive by heartbeats.
MAX_HELD_SECONDS = 600.0
# Turns of the loop a tick gives the tasks waiting to move before it claims (each needs one).
MOVER_TURNS = 4


class _Claimed(NamedTuple):
    op: OperationRecord
    previous: str | None  # the holder of an expired lease taken over
    prep: Prep | None


class _PrepFailed(Exception):
    """A step's ``prepare`` failed inside the claim: claim again without preparing."""


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
        self.deps = ctx.deps
        self.failures = StepFailures(ctx, step_retry_policy(ctx.deps.settings.scheduler))
        self.steps = StepChoice.of(steps)
        self.max_in_flight = max_in_flight
        self.on_next_due = on_next_due
        # An outage fails every tick's claim: said when it starts, each minute, and at its end.
        self._claim_log = OutageLog(log, "claims", self.deps.clock.monotonic)
        settings = self.deps.settings
        capacities = dict.fromkeys(self.deps.providers, settings.scheduler.provider_concurrency)
        capacities[HOOKS] = settings.callbacks.hook_concurrency
        self.shares = Shares(
            capacities,
            callbacks=settings.callbacks.concurrency,
            per_host=settings.callbacks.per_host_concurrency,
        )
        self._tasks: set[asyncio.Task[None]] = set()
        self._working: set[str] = set()  # operations one of our tasks is on
        # Claims of operations a task of ours is still on (see ``_spawn``), for that task.
        self._reclaimed: dict[str, tuple[_Claimed, str]] = {}
        self._claiming = False
        # Set while no tick is claiming: a task refused a move by the claim in flight
        # (``Shares.claiming``) waits for it rather than give its lease back.
        self._claims_over = asyncio.Event()
        self._claims_over.set()
        self._movers = 0  # tasks waiting on it: the tick lets them in after its claim
        self._again = False
        self._stopping = False
        self._probed_at: datetime | None = None  # the last claim that looked for a burst
        # The shares whose last claim took all it asked for: due work of theirs may wait.
        self._backlog: set[str] = set()

    @property
    def owner(self) -> str:
        return self.deps.worker_id

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    async def tick(self) -> int:
        """Claim what is due (up to each share's free slots) and start it; returns claims made."""
        if self._stopping:
            return 0
        if self._claiming:
            self._again = True
            return 0
        self._claiming = True
        claimed = 0
        try:
            # Tasks the last claim held back (``move``) were woken as it ended. A claim begun
            # before they run would hold the slots back again, and each would give its
            # lease back (a transaction) for a claim to take it once more: they go first.
            for _ in range(MOVER_TURNS):
                if not self._movers:
                    break
                await asyncio.sleep(0)
            self._claims_over.clear()
            while not self._stopping:
                self._again = False
                wants = self._wants()
                if not wants:
                    break
                claims = await self._claim(wants)
                more = False
                full_before = set(self.shares.full_hosts())
                for key, batch in claims.items():
                    for item in batch:
                        self._spawn(item, share_of(item.op) if key == CALLBACKS else key)
                    claimed += len(batch)
                    more = more or len(batch) == wants[key]
                self._note_backlog(wants, claims)
                # A host that filled up in this claim is left out of the next one, which may
                # find other hosts' work among the candidates it had to pass over.
                more = more or bool(set(self.shares.full_hosts()) - full_before)
                if self._movers and (more or self._again):
                    # Tasks wait to move into slots this claim held back: let them in
                    # first, and claim the rest in a tick of its own right after.
                    self.deps.notifier.wake()
                    break
                if not more and not self._again:
                    break
        finally:
            self._claiming = False
            self._claims_over.set()
        return claimed

    def _note_backlog(self, wants: dict[str, int], claims: dict[str, list[_Claimed]]) -> None:
        """Which shares may have due work left: those the claim filled (a failed claim,
        which took nothing, says nothing of them)."""
        if not claims:
            return
        for key, n in wants.items():
            if len(claims.get(key, ())) == n:
                self._backlog.add(key)
            else:
                self._backlog.discard(key)

    def take(self, key: str) -> bool:
        """One slot of share ``key`` for a task of ours, held ahead of a write that may hand
        the operation to it; False at once when none is free.

        It does not wait for a claim in flight (``_after_claim``): that would hold the
        write back, and queued writes share a commit, so the write saves no transaction
        (measured: more CPU per operation, fewer operations a second). The step's own
        move waits for the claim instead.
        """
        return self.shares.take(key)

    def reserve(self, share: str) -> bool:
        """One slot of ``share`` for an operation a write of this replica is about to lease
        to it (``engine.create_start``); False at once when none is free.

        Also False while a claim is in flight (it holds the free slots back, and a
        request on the wire does not wait for it), and when the share's last claim took
        all it asked for: due work of that share may be waiting, and it goes first (the
        claims take the earliest due); the new operation then waits its turn among it.
        """
        if self._stopping or share in self._backlog or len(self._tasks) >= self.max_in_flight:
            return False
        return self.take(share)

    def start(self, op: OperationRecord, prep: Prep | None, share: str) -> None:
        """Work ``op``, leased to this worker by a write that committed, in the slot of
        ``share`` that ``reserve`` took."""
        self._spawn(_Claimed(op, None, prep), share, held=True)

    async def move(self, frm: str, to: str) -> bool:
        """Move a running operation to share ``to`` (see ``Shares.move``, ``_after_claim``)."""
        if self.shares.move(frm, to):
            return True
        return await self._after_claim(to) and self.shares.move(frm, to)

    async def _after_claim(self, key: str) -> bool:
        """Wait for the claim in flight when only it holds back a free slot of ``key``.

        A claim holds back every share's free slots for what it claims. A task
        refused only for that waits for the claim to end (a write, so bounded by the write
        wait; the tick claims no further while a task waits) and asks again: giving its
        lease back instead would cost a transaction, and a claim of its own to get it
        again. The caller asks again at once, in the same turn of the loop.
        """
        if not self.shares.claiming or self.shares.free(key) <= 0:
            return False
        self._movers += 1
        try:
            # A timeout scope, not wait_for(): that wraps the wait in a task of its own, and
            # each hop more is a turn of the loop in which the next claim may begin first.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.deps.db.write_wait_seconds):
                    await self._claims_over.wait()
        finally:
            self._movers -= 1
        return True

    def _wants(self) -> dict[str, int]:
        """How many operations each share can start now (never more than it has free)."""
        room = self.max_in_flight - len(self._tasks)
        batch = self.deps.settings.scheduler.batch_size
        wants: dict[str, int] = {}
        for key in self.shares:
            n = min(self.shares.free(key), batch, room)
            if n > 0:
                wants[key] = n
                room -= n
        return wants

    async def _claim(self, wants: dict[str, int]) -> dict[str, list[_Claimed]]:
        rt = self.deps
        now = rt.clock.now()
        lease = rt.settings.scheduler.lease_seconds
        # Operations a task of ours is on are not prepared by the claim: that task is
        # inside a step of theirs now, and picks the claim up when it is done.
        busy = frozenset(self._working)
        asks = {key: self._ask(key, n) for key, n in wants.items()}
        probe = probe_due(self._probed_at, now, overdue_after(rt))

        def claim(conn: Connection, prepare: bool) -> dict[str, list[_Claimed]]:
            if probe:
                spread_overdue(conn, rt, now, self.ctx.actor)
            claims = leases.claim_shares(conn, self.owner, now, lease, asks)
            try:
                # The steps' counts before their sends: one statement, not one each.
                with rows_together(conn):
                    return {
                        key: [
                            _Claimed(
                                op,
                                previous,
                                self._prepare_claimed(conn, op, now)
                                if prepare and op.id not in busy
                                else None,
                            )
                            for op, previous in claimed
                        ]
                        for key, claimed in claims.items()
                    }
            except StaleWrite as exc:
                raise _PrepFailed() from exc

        self.shares.claiming = True
        try:
            try:
                claims = await rt.db.run_joined(claim, True)
            except _PrepFailed as failed:
                # One operation's step could not prepare: nothing of this claim was kept.
                # Claim plainly; that step prepares on its own (and fails in its own task).
                log.error("preparing a claimed step failed", exc_info=failed.__cause__)
                claims = await rt.db.run_joined(claim, False)
        except StorageUnavailable as exc:
            self._claim_log.failed("claim failed: %s", explain(exc))
            return {}
        finally:
            self.shares.claiming = False
        if probe:
            self._probed_at = now
        self._claim_log.succeeded()
        for c in (c for batch in claims.values() for c in batch):
            if c.previous is not None and c.previous != self.owner:
                rt.metrics.lease_takeovers.inc()
                log.info(
                    "took over an expired lease",
                    extra={"operation": c.op.id, "previous_owner": c.previous},
                )
        return claims

    def _ask(self, key: str, n: int) -> leases.Ask:
        """The claim of one share, taken on the loop (the claim itself runs in a thread)."""
        if key == HOOKS:
            return leases.Ask(n, leases.ShareFilter(completion=True, lanes=leases.Lanes.HOOKS))
        if key == CALLBACKS:
            shares = self.shares
            room, cap = shares.host_room(), shares.host_cap
            share = leases.ShareFilter(
                completion=True, lanes=leases.Lanes.CALLBACKS, exclude=tuple(shares.full_hosts())
            )
            return leases.Ask(n, share, lambda found: choose(found, room, cap, n))
        return leases.Ask(n, leases.ShareFilter(provider=key, completion=False))

    def _prepare_claimed(self, conn: Connection, op: OperationRecord, now: datetime) -> Prep | None:
        step = self.steps.preparer(op, now)
        if step is None:
            return None
        try:
            return step.prepare(conn, op, now)
        except StorageUnavailable:
            raise
        except Exception as exc:  # the claim is made again without it: see _claim
            raise _PrepFailed() from exc

    def _spawn(self, claimed: _Claimed, share: str, *, held: bool = False) -> None:
        op_id = claimed.op.id
        if not held and not self.shares.take(share, claimed=True):
            return  # cannot happen (the claim asked for free slots only); the lease expires
        if op_id in self._working:
            # A task of ours is still on the operation: a hint made it due again just as
            # that task gave the lease back, or our own lease lapsed during a slow step
            # and the claim renewed it. A second task would pass every lease guard and
            # run the same step twice; the task on it works this claim when it is done.
            previous = self._reclaimed.pop(op_id, None)
            if previous is not None:
                self.give(previous[1])
            self._reclaimed[op_id] = (claimed, share)
            return
        self._working.add(op_id)
        task = asyncio.get_running_loop().create_task(
            self._process(op_id, share, claimed.op, claimed.prep)
        )
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        # A task cancelled before it ran never reached the discard in _process.
        task.add_done_callback(lambda t: self._cancelled(op_id) if t.cancelled() else None)

    def _cancelled(self, op_id: str) -> None:
        self._working.discard(op_id)
        left = self._reclaimed.pop(op_id, None)
        if left is not None:
            self.give(left[1])

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("worker task failed", exc_info=task.exception())

    def give(self, share: str) -> None:
        if share == NO_SLOT:
            return  # lent back already (``Flow.lend``)
        was_full = self.shares.give(share)
        if self._claiming:
            # The claim in flight counted the free slots before this one was given back:
            # claim again after it, or due work waits for the next tick (a burst of
            # callbacks to one host would go out a host's share a second).
            self._again = True
        elif was_full or len(self._tasks) >= self.max_in_flight - 1:
            # The share (or the worker) was full: there may be due work we could not claim.
            self.deps.notifier.wake()

    async def _process(
        self, op_id: str, share: str, op: OperationRecord | None = None, prep: Prep | None = None
    ) -> None:
        operation_id_var.set(op_id)
        self.deps.tracing.detach()
        crew = Crew(self.owner, self.ctx, self.steps, self.failures, self.shares, self)
        task = ClaimRun(crew, share)
        flow_var.set(task.flow)
        heartbeat = asyncio.get_running_loop().create_task(self._heartbeat(op_id))
        try:
            while True:
                await task.run(op_id, op, prep)
                # A claim of ours landed while this task was on the operation: work it now.
                again = self._reclaimed.pop(op_id, None)
                if again is None:
                    break
                claimed, claimed_share = again
                self.give(task.share)
                task.claimed(claimed_share)
                op, prep = claimed.op, claimed.prep
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
            again = self._reclaimed.pop(op_id, None)
            try:
                if again is not None:
                    # Claimed again just now (after an error): a task of its own works it.
                    self.give(again[1])
                    self._spawn(again[0], again[1])
                elif task.flow.released:
                    self._due_at(task.last)  # the step's last write gave the lease back
                elif not task.keep_lease:
                    await self._release(op_id, task.last)
            finally:
                self.give(task.share)

    def give_moved(self, share: str) -> None:
        """A slot freed by a move to another share: wake the claim if the old one was full."""
        if self.shares.free(share) == 1:
            self.deps.notifier.wake()

    async def _heartbeat(self, op_id: str) -> None:
        """Keep the lease while a slow step (a hook, a hung callback) is still running.

        Without it, a step longer than the lease would be claimed and run a second time by
        another worker while the first is still inside it. The lease is kept for at most
        MAX_HELD_SECONDS: a step stuck beyond that is presumed lost and may be taken over.
        """
        rt = self.deps
        lease = rt.settings.scheduler.lease_seconds
        started = rt.clock.monotonic()
        while rt.clock.monotonic() - started < MAX_HELD_SECONDS:
            await asyncio.sleep(lease / 3)

            def extend() -> bool:
                with rt.db.write() as conn:
                    return leases.extend_lease(conn, op_id, self.owner, rt.clock.now(), lease)

            try:
                if not await rt.db.run_write(extend):
                    return
            except StorageUnavailable:
                continue

    async def _release(self, op_id: str, last: OperationRecord | None) -> None:
        rt = self.deps

        def release(conn: Connection) -> dict[str, Any]:
            return leases.release(conn, [op_id], self.owner)

        try:
            released = await rt.db.run_joined(release, key=op_id)
        except StorageUnavailable:
            return  # the lease expires on its own
        if op_id in released:
            at = released[op_id]
            if at is not None and self.on_next_due is not None:
                self.on_next_due(at)

    def _due_at(self, last: OperationRecord | None) -> None:
        if last is not None and last.next_poll_at is not None and self.on_next_due is not None:
            self.on_next_due(last.next_poll_at)

    async def drain(self, timeout: float = 10.0) -> None:
        """Stop claiming and wait for in-flight steps (bounded); leases expire otherwise."""
        self._stopping = True
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout)
        for task in list(self._tasks):
            task.cancel()
