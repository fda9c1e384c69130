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
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

import anyio.to_thread
from sqlalchemy.engine import Connection

from reconciler.core.backoff import BackoffPolicy
from reconciler.core.states import END_STATES, State
from reconciler.core.vocabulary import EscalationReason, HistoryKind
from reconciler.engine.context import StepContext
from reconciler.engine.hooks import Hook
from reconciler.outbound.callbacks import CallbackClient, next_attempt_delay
from reconciler.storage import completion_steps as steps
from reconciler.storage import operations as store
from reconciler.storage.completion_steps import StepRow
from reconciler.storage.history import last_hint_at
from reconciler.storage.journal import Entry
from reconciler.storage.models import Operation
from reconciler.storage.tokens import callback_keys
from reconciler.storage.views import view_of

log = logging.getLogger("reconciler.engine.steps.complete")

CALLBACK_STEP = "callback"


def webhook_id(op: Operation) -> str:
    """The callback's ``webhook-id``: the same on every attempt for this completion."""
    return op.id if op.completion_round <= 1 else f"{op.id}_r{op.completion_round}"


class CompleteStep:
    def __init__(
        self, ctx: StepContext, hooks: tuple[Hook, ...], callbacks: CallbackClient | None
    ) -> None:
        self.ctx = ctx
        self.hooks = {h.name: h for h in hooks}
        self.callbacks = callbacks
        # Which completions this process has started, only to observe the lag once.
        self._started: set[tuple[str, int]] = set()

    def _last_hint(self, op_id: str) -> datetime | None:
        with self.ctx.runtime.db.read() as conn:
            return last_hint_at(conn, op_id)

    def steps_for(self, op: Operation) -> list[str]:
        steps = [f"hook:{name}" for name in self.hooks]
        if op.callback_url:
            steps.append(CALLBACK_STEP)
        return steps

    async def __call__(self, op: Operation) -> None:
        ctx = self.ctx
        rt = ctx.runtime
        started = (op.id, op.completion_round)
        if started not in self._started:
            self._started.add(started)
            hinted = await rt.db.run(self._last_hint, op.id)
            if hinted is not None:
                rt.metrics.lag.observe(max(0.0, (ctx.now() - hinted).total_seconds()))
        for step in self.steps_for(op):
            row = await rt.db.run(self._ensure, op, step)
            if row.status in steps.FINISHED:
                continue
            now = ctx.now()
            if row.next_attempt_at is not None and row.next_attempt_at > now:
                await self._later(op, row.next_attempt_at)
                return
            op = await self._start(op, row)
            finished = await self._run(op, row)
            if not finished:
                return
        await self._close(op)

    async def _later(self, op: Operation, at: datetime) -> None:
        ctx = self.ctx
        now = ctx.now()
        await ctx.apply(
            op,
            lambda conn, fresh: ctx.runtime.journal.write(
                conn, fresh, now=now, changes={"next_poll_at": at}, lease=ctx.lease
            ),
        )

    def _ensure(self, op: Operation, step: str) -> StepRow:
        with self.ctx.runtime.db.write() as conn:
            return steps.ensure(conn, op, step)

    async def _start(self, op: Operation, row: StepRow) -> Operation:
        """Mark the step running before it runs: a crash now means "may have run"."""
        ctx = self.ctx
        now = ctx.now()

        def start(conn: Connection, fresh: Operation) -> Operation:
            steps.mark_running(conn, op, row, now)
            # Touch the row under the lease so a worker that lost it cannot start a step.
            return ctx.runtime.journal.write(conn, fresh, now=now, lease=ctx.lease)

        # The fresh row: a step's own writes (and an operator's decision) move the version.
        return await ctx.apply(op, start)

    async def _run(self, op: Operation, row: StepRow) -> bool:
        if row.step == CALLBACK_STEP:
            return await self._callback(op, row)
        return await self._hook(op, row)

    def _outcome(self, op: Operation) -> dict[str, Any]:
        with self.ctx.runtime.db.read() as conn:
            return view_of(conn, store.get_operation(conn, op.id) or op, self.ctx.now())

    async def _hook(self, op: Operation, row: StepRow) -> bool:
        ctx = self.ctx
        hook = self.hooks[row.step.removeprefix("hook:")]
        outcome = await ctx.runtime.db.run(self._outcome, op)
        try:
            if hook.is_async:
                await hook.fn(outcome, row.idempotency_key)
            else:
                await anyio.to_thread.run_sync(hook.fn, outcome, row.idempotency_key)
        except Exception as exc:  # a hook is operator code: its failure is data, not a crash
            log.warning("hook %s failed: %s", hook.name, type(exc).__name__)
            ctx.runtime.metrics.hook_runs.labels("failed").inc()
            return await self._failed(
                op, row, f"{type(exc).__name__}: {str(exc)[:200]}", None, permanent=False
            )
        ctx.runtime.metrics.hook_runs.labels("ok").inc()
        await self._done(op, row, {})
        return True

    async def _callback(self, op: Operation, row: StepRow) -> bool:
        ctx = self.ctx
        assert op.callback_url is not None
        if self.callbacks is None:
            return await self._failed(
                op, row, "no callback signing secret is configured", None, permanent=True
            )
        keys = await ctx.runtime.db.run(self._agent_keys, op)
        if keys is None:
            return await self._failed(
                op, row, f"agent {op.caller!r} has no token to sign for", None, permanent=True
            )
        outcome = await ctx.runtime.db.run(self._outcome, op)
        event = {"type": "operation.completed", "operation": outcome}
        result = await self.callbacks.deliver(op.callback_url, webhook_id(op), event, keys)
        label = (
            "delivered"
            if result.delivered
            else ("refused" if result.refused else "permanent" if result.permanent else "retryable")
        )
        ctx.runtime.metrics.callback_attempts.labels(label).inc()
        if result.delivered:
            await self._done(
                op, row, {"http_status": result.http_status, "webhook_id": webhook_id(op)}
            )
            return True
        reason = result.refused or result.error or f"HTTP {result.http_status}"
        return await self._failed(
            op,
            row,
            reason,
            result.retry_after,
            permanent=result.permanent,
            http_status=result.http_status,
        )

    def _agent_keys(self, op: Operation) -> list[bytes] | None:
        """The calling agent's own signing keys: no agent can forge another's callbacks."""
        service_key = self.ctx.runtime.callback_key
        assert service_key is not None  # callbacks exist only with a signing key
        with self.ctx.runtime.db.read() as conn:
            return callback_keys(conn, op.caller, service_key, self.ctx.now())

    async def _done(self, op: Operation, row: StepRow, detail: dict[str, Any]) -> None:
        ctx = self.ctx
        now = ctx.now()

        def done(conn: Connection, fresh: Operation) -> Operation:
            steps.mark_done(conn, op, row.step, now)
            entry = Entry(
                kind=HistoryKind.STEP,
                actor=ctx.actor,
                cause=f"step_done:{row.step}",
                detail={
                    "step": row.step,
                    "attempt": row.attempts + 1,
                    "idempotency_key": row.idempotency_key,
                    **detail,
                },
            )
            return ctx.runtime.journal.write(conn, fresh, now=now, entries=[entry], lease=ctx.lease)

        await ctx.apply(op, done)

    async def _failed(
        self,
        op: Operation,
        row: StepRow,
        reason: str,
        retry_after: str | None,
        *,
        permanent: bool,
        http_status: int | None = None,
    ) -> bool:
        ctx = self.ctx
        settings = ctx.runtime.settings.callbacks
        now = ctx.now()
        attempts = row.attempts + 1
        give_up = permanent or attempts >= settings.max_attempts
        policy = BackoffPolicy(settings.base_delay_seconds, settings.max_delay_seconds, 0.5)
        delay = next_attempt_delay(attempts - 1, retry_after, now, policy, ctx.runtime.rng)
        retry_at = now + delay

        def failed(conn: Connection, fresh: Operation) -> Operation:
            steps.mark_failed(conn, op, row.step, reason[:500], give_up=give_up, retry_at=retry_at)
            entry = Entry(
                kind=HistoryKind.STEP,
                actor=ctx.actor,
                cause=f"step_failed:{row.step}",
                detail={
                    "step": row.step,
                    "attempt": attempts,
                    "error": reason[:500],
                    "http_status": http_status,
                    "gave_up": give_up,
                    "retry_at": None if give_up else retry_at.isoformat(),
                },
            )
            if not give_up:
                return ctx.runtime.journal.write(
                    conn,
                    fresh,
                    now=now,
                    entries=[entry],
                    changes={"next_poll_at": retry_at},
                    lease=ctx.lease,
                )
            detail = f"{row.step} failed after {attempts} attempt(s): {reason}"
            return ctx.escalate_in(
                conn, fresh, EscalationReason.CALLBACK_UNDELIVERABLE, detail, before=[entry]
            )

        await ctx.apply(op, failed)
        # A step that gave up does not block the ones after it.
        return give_up

    async def _close(self, op: Operation) -> None:
        ctx = self.ctx
        now = ctx.now()
        fresh = await ctx.reload(op.id)
        if fresh is None or State(fresh.state) not in END_STATES:
            return  # reopened meanwhile by a decision: keep the schedule its flow set
        entry = Entry(
            kind=HistoryKind.NOTE,
            actor=ctx.actor,
            cause="completion_finished",
            detail={"round": fresh.completion_round},
        )
        await ctx.write(
            fresh,
            lambda conn: ctx.runtime.journal.write(
                conn,
                fresh,
                now=now,
                entries=[entry],
                lease=ctx.lease,
                changes={"completion_pending": False, "next_poll_at": None, "delay_source": None},
            ),
        )
