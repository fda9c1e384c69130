"""The one completion handler per operation: downstream steps, each run once.

When an operation reaches an end state the handler runs its steps in
order — the configured Python hooks, then the agent's callback — and
records each one in ``completion_steps`` (unique per operation, round and
step). A finished step is never run again, whichever worker, replica or
webhook-versus-poll race gets there; only the lease holder runs steps at
all. The guarantee is honest about crashes: a step interrupted by a crash
(marked ``running`` but never ``done``) runs again, with the same
idempotency key, so hooks can make their own side effects idempotent.
The agent's callback is signed with that agent's own secret (see
``core.callback_secrets``), never one that another agent holds.

One transaction between two steps: the write that records a step's outcome also
marks the next one running (with what it needs: the operation as it is, the
callback's signing keys), or records the completion finished and gives the lease
back. The first step is marked running by the transaction that hands the
operation over (the result's, or the claim's: ``prepare``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import anyio.to_thread
from sqlalchemy.engine import Connection

from reconciler.config import CallbackSettings
from reconciler.core.chain import Entry
from reconciler.core.completion_lanes import CALLBACK_STEP, HOOKS_LANE, callback_lane, round_steps
from reconciler.core.completion_retry import (
    CompletionRetryPolicy,
    RetryStepAt,
    after_failure,
)
from reconciler.core.records import OperationRecord, with_changes
from reconciler.core.states import END_STATES, State
from reconciler.core.vocabulary import EscalationReason, HistoryKind
from reconciler.engine.context import StepContext
from reconciler.engine.flow import Flow, Prep, flow_var, lend_slot
from reconciler.engine.hooks import Hook
from reconciler.engine.shares import share_of
from reconciler.outbound.callbacks import CallbackClient, receiver_host
from reconciler.storage import completion_steps as steps
from reconciler.storage import pipelined
from reconciler.storage.completion_steps import StepRow, StepStatus
from reconciler.storage.operation_reads import view_of
from reconciler.storage.tokens import callback_keys, keys_of
from reconciler.tracing import SpanName, Tracing

log = logging.getLogger("reconciler.engine.steps.complete")


def webhook_id(op: OperationRecord) -> str:
    """The callback's ``webhook-id``: the same on every attempt for this completion."""
    return op.id if op.completion_round <= 1 else f"{op.id}_r{op.completion_round}"


@dataclass(frozen=True)
class Plan:
    """Where one completion round stands after a write, and what the next step needs."""

    rows: tuple[StepRow, ...]  # this round's steps in order, as stored now
    index: int = -1  # the step marked running by that write (-1: none runs now)
    view: dict[str, Any] | None = None  # the Operation the running step is given
    keys: list[bytes] | None = None  # the callback's signing keys (None: nobody may sign)
    hinted_at: datetime | None = None  # the last webhook hint (for the lag metric)

    @property
    def current(self) -> StepRow | None:
        return self.rows[self.index] if self.index >= 0 else None


@dataclass(frozen=True)
class Outcome:
    """What running one step came to."""

    done: bool
    detail: dict[str, Any]
    reason: str = ""
    retry_after: str | None = None
    permanent: bool = False
    http_status: int | None = None


def _starts_there(flow: Flow | None, op: OperationRecord, lane: str, now: datetime) -> bool:
    """Whether the step due in share ``lane`` may start in this write, with the move: the
    write that records a step's outcome, when the task would go on with the operation
    there (a slot of it held: ``Flow.reserve``, ``Flow.continues``). One statement, not a
    move, a read of the round's rows and a start."""
    return flow is not None and flow.continues(with_changes(op, {"completion_lane": lane}), now)


def completion_retry_policy(settings: CallbackSettings) -> CompletionRetryPolicy:
    return CompletionRetryPolicy(
        base_seconds=settings.base_delay_seconds,
        max_seconds=settings.max_delay_seconds,
        max_attempts=settings.max_attempts,
    )


def _note(tracing: Tracing, outcome: Outcome) -> None:
    status = outcome.http_status or outcome.detail.get("http_status")
    tracing.note(outcome="done" if outcome.done else "failed", http_status=status)
    if not outcome.done:
        tracing.failed("permanent" if outcome.permanent else "retryable")


class CompleteStep:
    def __init__(
        self, ctx: StepContext, hooks: tuple[Hook, ...], callbacks: CallbackClient | None
    ) -> None:
        self.ctx = ctx
        self.hooks = {h.name: h for h in hooks}
        self.callbacks = callbacks
        # Which completions this process has started, only to observe the lag once.
        self._started: set[tuple[str, int]] = set()

    def lane_of(self, op: OperationRecord, step: str) -> str:
        """The share a step runs in: hooks together, each callback host on its own."""
        if step != CALLBACK_STEP or op.callback_url is None:
            return HOOKS_LANE
        return callback_lane(receiver_host(op.callback_url, self.ctx.deps.allow_hosts))

    def steps_for(self, op: OperationRecord) -> list[str]:
        return round_steps(list(self.hooks), bool(op.callback_url))

    def prepare(self, conn: Connection, op: OperationRecord, now: datetime) -> Prep:
        """Begin (or resume) the round: its step rows, and the first unfinished step started."""
        # The lag is observed when the round's first step starts; a round resumed (a
        # step begun already: the callback after the hooks, a retry) has no hint to add.
        names = self.steps_for(op)
        signs = CALLBACK_STEP in names and self.callbacks is not None
        if conn.dialect.name == "postgresql":
            expected = self._start_expected(conn, op, names, now, signs)
            if expected is not None:
                return expected
        found = steps.ensure_all(conn, op, names, salts=signs)
        return self._advance(conn, op, tuple(found.rows), 0, now, [], found.hinted_at, found=found)

    def _start_expected(
        self, conn: Connection, op: OperationRecord, names: list[str], now: datetime, signs: bool
    ) -> Prep | None:
        """PostgreSQL: the step of the held share started in one statement, when the round
        stands as a claim of that share expects (its rows made with the move that opened
        it; the steps before done, those after untried). None: it stands otherwise, and
        nothing was written."""
        held = share_of(op)
        index = next((i for i, n in enumerate(names) if self.lane_of(op, n) == held), None)
        if index is None:
            return None
        name = names[index]
        hint, salts = index == 0, signs and name == CALLBACK_STEP
        gate = steps.start_expected(op, names, index, now, hint=hint, salts=salts)
        found = self.ctx.deps.journal.write_if(conn, op, gate, now=now, lease=self.ctx.lease)
        if found is None:
            return None
        touched, answer = found
        begun = steps.started(answer, hint=hint, salts=salts)

        def row(step: str, status: StepStatus, attempts: int = 0) -> StepRow:
            return StepRow(step, status, attempts, None, steps.step_key(op, step))

        rows = (
            *(row(n, StepStatus.DONE) for n in names[:index]),
            row(name, StepStatus.RUNNING, begun.attempts),
            *(row(n, StepStatus.PENDING) for n in names[index + 1 :]),
        )
        hinted_at = begun.hinted_at if begun.attempts == 1 else None  # read only with a hint
        keys = self._agent_keys(conn, touched, now, begun) if salts else None
        plan = Plan(rows, index, view_of(conn, touched, now), keys, hinted_at)
        return Prep(touched, plan)

    async def __call__(self, op: OperationRecord, prep: Prep | None = None) -> None:
        ctx = self.ctx
        if prep is None:
            now = ctx.now()
            prep = await ctx.apply_plan(op, lambda conn, fresh: self.prepare(conn, fresh, now))
        plan: Plan = prep.data
        self._observe_lag(prep.op, plan)
        tracing = ctx.deps.tracing
        while plan.current is not None:
            row = plan.current
            hook = self._hook_of(row)
            name = SpanName.CALLBACK if row.step == CALLBACK_STEP else SpanName.HOOK
            with tracing.about(prep.op, name, step=row.step, attempt=row.attempts):
                if hook is not None and hook.transactional:
                    await self._reserve_next(prep.op, plan)
                    prep = await self._in_transaction(prep.op, plan, hook)
                else:
                    outcome = await self._run(prep.op, plan)
                    if tracing.enabled:
                        _note(tracing, outcome)
                    if outcome.done:
                        await self._reserve_next(prep.op, plan)
                    prep = await self._recorded(prep.op, plan, outcome)
            plan = prep.data

    async def _reserve_next(self, op: OperationRecord, plan: Plan) -> None:
        """Before the write that records a step: a slot where the next step runs, so that
        write can start it (``Flow.reserve``; a lane of this task's own is no change)."""
        flow = flow_var.get()
        if flow is None:
            return
        for row in plan.rows[plan.index + 1 :]:
            if row.status not in steps.FINISHED:
                await flow.reserve(self.lane_of(op, row.step))
                return

    def _hook_of(self, row: StepRow) -> Hook | None:
        if not row.step.startswith("hook:"):
            return None
        return self.hooks[row.step.removeprefix("hook:")]

    async def _in_transaction(self, op: OperationRecord, plan: Plan, hook: Hook) -> Prep:
        """A transactional hook: called inside the write that records its step, so its
        effects and the step's ``done`` commit together or not at all (exactly once)."""
        now = self.ctx.now()
        flow = flow_var.get()  # read here: the build runs on a writer thread

        def build(conn: Connection, fresh: OperationRecord) -> Prep:
            return self._record(conn, fresh, plan, self._call_in(conn, hook, plan), now, flow)

        return await self.ctx.apply_plan(op, build)

    def _call_in(self, conn: Connection, hook: Hook, plan: Plan) -> Outcome:
        row = plan.current
        assert row is not None and plan.view is not None
        metrics = self.ctx.deps.metrics
        try:
            # A savepoint: a hook that fails leaves nothing of its own behind, and its
            # failure is still recorded in the transaction around it.
            with pipelined.alone(), conn.begin_nested():
                hook.fn(plan.view, row.idempotency_key, conn)
        except Exception as exc:  # operator code: its failure is data, not a crash
            log.warning("hook %s failed: %s", hook.name, type(exc).__name__)
            metrics.hook_runs.labels("failed").inc()
            return Outcome(False, {}, f"{type(exc).__name__}: {str(exc)[:200]}")
        metrics.hook_runs.labels("ok").inc()
        return Outcome(True, {"transactional": True})

    async def _recorded(self, op: OperationRecord, plan: Plan, outcome: Outcome) -> Prep:
        now = self.ctx.now()
        flow = flow_var.get()  # read here: the build runs on a writer thread
        return await self.ctx.apply_plan(
            op, lambda conn, fresh: self._record(conn, fresh, plan, outcome, now, flow)
        )

    def _observe_lag(self, op: OperationRecord, plan: Plan) -> None:
        started = (op.id, op.completion_round)
        if started in self._started:
            return
        self._started.add(started)
        if plan.hinted_at is not None:
            lag = max(0.0, (self.ctx.now() - plan.hinted_at).total_seconds())
            self.ctx.deps.metrics.lag.observe(lag)

    def _advance(
        self,
        conn: Connection,
        op: OperationRecord,
        rows: tuple[StepRow, ...],
        start: int,
        now: datetime,
        entries: list[Entry],
        hinted_at: datetime | None = None,
        also: tuple[steps.StepChange, ...] = (),
        flow: Flow | None = None,
        found: steps.Round | None = None,
    ) -> Prep:
        """From step ``start`` on: start the first unfinished step, or wait for its retry,
        or record the round finished; ``entries`` (the last step's record) and ``also``
        (its step row's change) go with it, in the operation's write. ``flow``: the task's,
        when a step due in another share may start in this write (``_starts_there``);
        ``found``: the round as ``prepare`` read it, with what came along."""
        ctx = self.ctx
        journal = ctx.deps.journal
        held = share_of(op)
        for index in range(start, len(rows)):
            row = rows[index]
            if row.status in steps.FINISHED:
                continue
            lane = self.lane_of(op, row.step)
            if row.next_attempt_at is not None and row.next_attempt_at > now:
                later = journal.write(
                    conn,
                    op,
                    now=now,
                    entries=entries,
                    changes={"next_poll_at": row.next_attempt_at, "completion_lane": lane},
                    lease=ctx.lease,
                    also=also,
                )
                return Prep(later, Plan(rows, hinted_at=hinted_at), final=True)
            moved_here = lane != held and not _starts_there(flow, op, lane, now)
            if moved_here:
                # The step runs in another share (the callback after the hooks, or a host
                # of its own): hand the operation over due now; it is started there, so a
                # full share never holds a step marked running that nobody runs.
                moved = journal.write(
                    conn,
                    op,
                    now=now,
                    entries=entries,
                    changes={"completion_lane": lane},
                    lease=ctx.lease,
                    also=also,
                )
                return Prep(moved, Plan(rows, hinted_at=hinted_at), final=True)
            # Marked running before it runs: a crash from now on means "may have run". The
            # row is touched under the lease, so a worker that lost it cannot start a step.
            touched = journal.write(
                conn,
                op,
                now=now,
                entries=entries,
                changes={"completion_lane": lane} if lane != held else None,
                lease=ctx.lease,
                also=(*also, steps.running(op, row, now)),
            )
            running = replace(row, status=StepStatus.RUNNING, attempts=row.attempts + 1)
            keys = None
            if row.step == CALLBACK_STEP and self.callbacks is not None:
                keys = self._agent_keys(conn, touched, now, found)
            plan = Plan(
                (*rows[:index], running, *rows[index + 1 :]),
                index,
                view_of(conn, touched, now),
                keys,
                hinted_at,
            )
            if lane != held:
                # Started in the share this task moves into: this step ends here, and the
                # task goes on with the started one there (``Prep.next``).
                ended = Plan(rows, hinted_at=hinted_at)
                return Prep(touched, ended, final=True, next=Prep(touched, plan))
            return Prep(touched, plan)
        if State(op.state) not in END_STATES:
            # Reopened meanwhile by a decision: keep the schedule its flow set.
            after = journal.write(conn, op, now=now, entries=entries, lease=ctx.lease, also=also)
            return Prep(after, Plan(rows, hinted_at=hinted_at), final=True)
        entry = Entry(
            kind=HistoryKind.NOTE,
            actor=ctx.actor,
            cause="completion_finished",
            detail={"round": op.completion_round},
        )
        closed = journal.write(
            conn,
            op,
            now=now,
            entries=[*entries, entry],
            lease=ctx.lease,
            changes={"completion_pending": False, "next_poll_at": None, "delay_source": None},
            also=also,
        )
        return Prep(closed, Plan(rows, hinted_at=hinted_at), final=True)

    def _agent_keys(
        self,
        conn: Connection,
        op: OperationRecord,
        now: datetime,
        found: steps.Round | steps.Started | None,
    ) -> list[bytes] | None:
        """The calling agent's own signing keys: no agent can forge another's callbacks.
        Its salts are read here unless they came with the round's rows (``found``)."""
        service_key = self.ctx.deps.callback_key
        assert service_key is not None  # callbacks exist only with a signing key
        if found is not None and found.salts_read:
            return keys_of(found.salts, service_key, now)
        return callback_keys(conn, op.caller, service_key, now)

    async def _run(self, op: OperationRecord, plan: Plan) -> Outcome:
        row = plan.current
        assert row is not None and plan.view is not None
        if row.step == CALLBACK_STEP:
            return await self._callback(op, plan, plan.view)
        return await self._hook(row, plan.view)

    async def _hook(self, row: StepRow, outcome: dict[str, Any]) -> Outcome:
        metrics = self.ctx.deps.metrics
        hook = self.hooks[row.step.removeprefix("hook:")]
        try:
            if hook.is_async:
                await hook.fn(outcome, row.idempotency_key)
            else:
                await anyio.to_thread.run_sync(hook.fn, outcome, row.idempotency_key)
        except Exception as exc:  # a hook is operator code: its failure is data, not a crash
            log.warning("hook %s failed: %s", hook.name, type(exc).__name__)
            metrics.hook_runs.labels("failed").inc()
            return Outcome(False, {}, f"{type(exc).__name__}: {str(exc)[:200]}")
        metrics.hook_runs.labels("ok").inc()
        return Outcome(True, {})

    async def _callback(self, op: OperationRecord, plan: Plan, outcome: dict[str, Any]) -> Outcome:
        assert op.callback_url is not None
        if self.callbacks is None:
            return Outcome(False, {}, "no callback signing secret is configured", permanent=True)
        if plan.keys is None:
            return Outcome(
                False, {}, f"agent {op.caller!r} has no token to sign for", permanent=True
            )
        event = {"type": "operation.completed", "operation": outcome}
        result = await self.callbacks.deliver(op.callback_url, webhook_id(op), event, plan.keys)
        lend_slot(op)  # the round's last call: the host's slot is free while it is recorded
        label = (
            "delivered"
            if result.delivered
            else ("refused" if result.refused else "permanent" if result.permanent else "retryable")
        )
        self.ctx.deps.metrics.callback_attempts.labels(label).inc()
        if result.delivered:
            return Outcome(True, {"http_status": result.http_status, "webhook_id": webhook_id(op)})
        return Outcome(
            False,
            {},
            result.refused or result.error or f"HTTP {result.http_status}",
            result.retry_after,
            result.permanent,
            result.http_status,
        )

    def _record(
        self,
        conn: Connection,
        op: OperationRecord,
        plan: Plan,
        outcome: Outcome,
        now: datetime,
        flow: Flow | None,
    ) -> Prep:
        """The running step's outcome, and in the same transaction what comes after it
        (``flow``: the task's, see ``_advance``)."""
        row = plan.current
        assert row is not None
        if outcome.done:
            entry = Entry(
                kind=HistoryKind.STEP,
                actor=self.ctx.actor,
                cause=f"step_done:{row.step}",
                detail={
                    "step": row.step,
                    "attempt": row.attempts,
                    "idempotency_key": row.idempotency_key,
                    **outcome.detail,
                },
            )
            rows = self._with(plan, replace(row, status=StepStatus.DONE))
            done = (steps.done(op, row.step, now),)
            return self._advance(conn, op, rows, plan.index + 1, now, [entry], also=done, flow=flow)
        attempts = row.attempts
        decision = after_failure(
            attempts,
            permanent=outcome.permanent,
            retry_after=outcome.retry_after,
            now=now,
            policy=completion_retry_policy(self.ctx.deps.settings.callbacks),
            rng=self.ctx.deps.rng,
        )
        retry_at = decision.at if isinstance(decision, RetryStepAt) else None
        give_up = retry_at is None
        reason = outcome.reason[:500]
        failed = steps.failed(op, row.step, reason, give_up=give_up, retry_at=retry_at)
        entry = Entry(
            kind=HistoryKind.STEP,
            actor=self.ctx.actor,
            cause=f"step_failed:{row.step}",
            detail={
                "step": row.step,
                "attempt": attempts,
                "error": reason,
                "http_status": outcome.http_status,
                "gave_up": give_up,
                "retry_at": None if retry_at is None else retry_at.isoformat(),
            },
        )
        if retry_at is not None:
            waiting = self.ctx.deps.journal.write(
                conn,
                op,
                now=now,
                entries=[entry],
                changes={"next_poll_at": retry_at},
                lease=self.ctx.lease,
                also=(failed,),
            )
            pending = replace(row, status=StepStatus.PENDING, next_attempt_at=retry_at)
            return Prep(waiting, Plan(self._with(plan, pending)), final=True)
        failed.run(conn)
        detail = f"{row.step} failed after {attempts} attempt(s): {reason}"
        escalated = self.ctx.escalate_in(
            conn, op, EscalationReason.CALLBACK_UNDELIVERABLE, detail, before=[entry]
        )
        # A step that gave up does not block the ones after it.
        rows = self._with(plan, replace(row, status=StepStatus.GAVE_UP))
        return self._advance(conn, escalated, rows, plan.index + 1, now, [])

    @staticmethod
    def _with(plan: Plan, row: StepRow) -> tuple[StepRow, ...]:
        return (*plan.rows[: plan.index], row, *plan.rows[plan.index + 1 :])
