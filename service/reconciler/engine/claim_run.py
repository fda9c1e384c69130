"""One claimed operation run through its steps, one after another, under the claim's lease.

A task runs at most ``MAX_STEPS_PER_CLAIM`` steps per claim and never two status reads
in one claim (a late wake sends no burst), moves between shares as its operation does
(a provider's, the hooks', a callback host's), and owns the ``Flow`` through which a
step's last write prepares the next step or gives the lease back (``engine.flow``).
The worker (``engine.worker``) claims operations and starts one such run per claim,
handing it what it needs as values (``Crew``) and its share slots as ``Slots``: the run
imports nothing of the worker's.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from sqlalchemy.engine import Connection

from reconciler.core.completion_lanes import is_callback_lane, lane_or_hooks
from reconciler.core.errors import StaleWrite, StorageError
from reconciler.core.records import OperationRecord
from reconciler.core.states import State
from reconciler.core.step_retry import step_of
from reconciler.engine.context import StepContext
from reconciler.engine.flow import Flow, Prep, Preparer
from reconciler.engine.shares import CALLBACKS, NO_SLOT, Shares, share_of
from reconciler.engine.step_failures import StepFailures
from reconciler.engine.step_table import SPAN_OF_STATE, STATUS_READ_STATES, Step, StepChoice
from reconciler.logs import trace_id_var
from reconciler.storage import leases
from reconciler.tracing import SpanName

# Steps per claim: enough to go from a confirmed success through result collection to the
# completion handler without waiting for another tick, few enough that one operation cannot
# monopolise a worker.
MAX_STEPS_PER_CLAIM = 6


class Slots(Protocol):
    """The share slots a run moves through (``engine.shares``), as the worker that started
    it keeps them: a slot given back may wake a claim, a move may wait for one."""

    def take(self, key: str) -> bool: ...
    def give(self, share: str) -> None: ...
    def give_moved(self, share: str) -> None: ...
    async def move(self, frm: str, to: str) -> bool: ...


@dataclass(frozen=True)
class Crew:
    """What every run of one worker shares: whose lease it holds, the steps' context and
    choice, the record of unforeseen failures, the shares and the worker's slots."""

    owner: str
    ctx: StepContext
    steps: StepChoice
    failures: StepFailures
    shares: Shares
    slots: Slots


class ClaimRun:
    """One task's run of steps on one operation under one claim (its ``Flow``'s owner)."""

    def __init__(self, crew: Crew, share: str) -> None:
        self.crew = crew
        self.share = share
        self.steps_left = MAX_STEPS_PER_CLAIM
        self.sent_status_read = False
        self.completion_slot: str | None = None  # a completion share held while collecting
        self.last: OperationRecord | None = None
        self.keep_lease = False  # a failure that could not be recorded: the lease runs out
        # The shares that were full when the current step began (``Shares.full_now``).
        self.full_shares: frozenset[str] = frozenset()
        self.flow = Flow(
            next_step=self._next_step,
            release=self._release_in,
            keeps=self._keeps,
            reserve=self._reserve_lane,
            lend=self._lend,
        )

    def claimed(self, share: str) -> None:
        """A new claim of the same operation: its share, and a fresh allowance of steps."""
        self.share = share
        self.steps_left = MAX_STEPS_PER_CLAIM
        self.sent_status_read = False

    def _lend(self, op: OperationRecord) -> None:
        """The call of the step on ``op`` is over: its slot goes back (``Flow.lend``), and
        the task holds none of that share until it moves into one again."""
        key = share_of(op)
        if key == self.completion_slot:
            self.completion_slot = None
        elif key == self.share:
            self.share = NO_SLOT
        else:
            return
        self.crew.slots.give(key)

    def _moved_to(self, wanted: str) -> None:
        """The task now holds a slot of ``wanted`` (``Worker.move``); the old one went back."""
        if wanted == self.share:
            return
        if self.share != NO_SLOT:
            self.crew.slots.give_moved(self.share)
        self.share = wanted

    def _release_in(self, conn: Connection, op_id: str) -> None:
        leases.release_at_commit(conn, op_id, self.crew.owner)

    def _keeps(self, after: OperationRecord) -> bool:
        """Inside a write: whether this task could go on with ``after`` in its next share."""
        wanted = share_of(after)
        if wanted in (self.share, self.completion_slot):
            return True
        if is_callback_lane(wanted) and CALLBACKS in self.full_shares:
            return False
        return wanted not in self.full_shares

    def _next_step(self, after: OperationRecord, now: datetime) -> Preparer | None:
        """Inside a write: the step this task would run next on ``after`` now (see ``run``)."""
        if self.steps_left <= 0:
            return None
        wanted = share_of(after)
        if wanted != self.share and wanted != self.completion_slot:
            return None
        if State(after.state) in STATUS_READ_STATES and self.sent_status_read:
            return None
        return self.crew.steps.preparer(after, now)

    async def run(self, op_id: str, op: OperationRecord | None, prep: Prep | None) -> None:
        crew = self.crew
        rt = crew.ctx.deps
        while self.steps_left > 0:
            if op is None:
                # Reload after the claim (when it did not read the row) or a lost race.
                op, prep = await crew.ctx.reload(op_id), None
                if op is None or op.lease_owner != crew.owner:
                    return
            self.last = op
            trace_id_var.set(op.trace_id)
            now = rt.clock.now()
            if op.next_poll_at is None or op.next_poll_at > now:
                return
            wanted = share_of(op)
            if not await crew.slots.move(self.share, wanted):
                # The next step belongs to a full share (a callback after a provider's
                # answer): give this slot back and let that share claim it when it can.
                rt.notifier.wake()
                return
            self._moved_to(wanted)
            step = crew.steps.step_for(op)
            if step is None:
                await self._park(op)
                return
            is_status_read = State(op.state) in STATUS_READ_STATES
            if is_status_read and self.sent_status_read:
                return  # never two status reads in one claim: a late wake sends no burst
            self.sent_status_read = self.sent_status_read or is_status_read
            self.steps_left -= 1
            await self._reserve_completion(op)
            self.full_shares = crew.shares.full_now()
            self.flow.begin_step()
            try:
                ran = await self._step(step, op, prep)
            finally:
                self._settle_completion()
            if ran is None:  # a lost race: reload and look again
                op, prep = None, None
                continue
            if not ran:
                return
            if self.flow.released:
                self.last = self.flow.last
                return
            # What our own writes left (the lease guarantees nobody else wrote since);
            # a step that wrote nothing is looked at again.
            op, prep = (self.flow.last, self.flow.prepared) if self.flow.changed else (None, None)

    async def _step(self, step: Step, op: OperationRecord, prep: Prep | None) -> bool | None:
        """Run one step: True when it ran, None when it lost a race, False when it failed."""
        rt = self.crew.ctx.deps
        name = SPAN_OF_STATE.get(State(op.state), SpanName.COMPLETION)
        if step is self.crew.steps.completion:
            name = SpanName.COMPLETION
        try:
            with rt.tracing.about(op, name, state=op.state, delay_source=op.delay_source):
                await (step(op, prep) if prep is not None else step(op))
        except StaleWrite:
            # Someone else wrote first (an agent's cancel, a webhook hint, an operator):
            # look again rather than act on an old picture.
            return None
        except StorageError:
            raise  # the database, not the step: our own outage (``_process``)
        except Exception as exc:
            # Nothing foresaw it: counted, tried again later, in the end a person.
            held = self.flow.last if self.flow.changed and self.flow.last else op
            step_name = step_of(State(op.state))
            self.keep_lease = not await self.crew.failures.record(held, step_name, exc)
            self.last = self.flow.last if self.flow.released else held
            return False
        return True

    async def _park(self, op: OperationRecord) -> None:
        """Nothing to do in this state: stop looking until something changes it."""
        rt = self.crew.ctx.deps

        def park(conn: Connection) -> None:
            rt.journal.write(conn, op, now=rt.clock.now(), changes={"next_poll_at": None})

        with contextlib.suppress(StaleWrite):
            await rt.db.run_joined(park, key=op.id)

    async def _reserve_completion(self, op: OperationRecord) -> None:
        """Hold a slot of the share the completion will start in while collecting a result,
        so its last write can start the completion handler (in the same transaction)
        instead of leaving it to a claim."""
        self.completion_slot = None
        if State(op.state) is not State.RESULT_COLLECTING:
            return
        first = self.crew.ctx.deps.journal.first_lane
        await self._reserve_lane(lane_or_hooks(first(op) if first is not None else None))

    async def _reserve_lane(self, lane: str) -> None:
        """A slot of the share the step's last write may hand the operation to (the callback
        after the hooks), held as the completion's is: ``_settle_completion`` moves the
        task into it or gives it back."""
        if self.completion_slot is not None or lane == self.share:
            return
        if self.crew.slots.take(lane):
            self.completion_slot = lane

    def _settle_completion(self) -> None:
        lane = self.completion_slot
        if lane is None:
            return
        self.completion_slot = None
        last = self.flow.last if self.flow.changed else None
        if last is not None and not self.flow.released and share_of(last) == lane:
            # The result is in and the completion handler is due: this task runs it in the
            # slot it held, and the provider's slot goes back.
            if self.share != NO_SLOT:
                self.crew.slots.give(self.share)
            self.share = lane
            return
        self.crew.slots.give(lane)
