"""A step that raised: count it, try again later, and after a few failures ask a person.

Guarantee: a step that fails in a way nothing foresaw never runs again at once and never
loops (docs/design.md#unforeseen-failures). The failure is counted on the operation
(``step_failures``, ``failed_step``) in the write that also says when the step runs
next, as ``core.step_retry`` decides it; that write gives the lease back, so a restart
finds the count and the wait where they were. When the retries are spent the same write
escalates ``internal_error`` naming the step and the exception's type (never its
message). The log carries one traceback per operation and burst (the first failure of
a count), then a line per further failure; a traceback there names each frame and each
exception's type, never an exception's message (it may quote a URL with a password, a
body, a statement's parameters).

A provider's answer holding text no database can store (``UnstorableAnswer``) is not a
failure of ours: the operation escalates ``contract_violation`` at once, with the call's
metadata and the offending value, escaped, as evidence (docs/design.md#provider-text).

A failure that cannot even be recorded (the database refuses the write) keeps the
lease: it runs out, and only then may any worker try the operation again.
"""

from __future__ import annotations

import logging
import traceback
from datetime import timedelta
from typing import Any

from sqlalchemy.engine import Connection

from reconciler.config import SchedulerSettings
from reconciler.core import step_retry
from reconciler.core.chain import Entry
from reconciler.core.clock import isoformat
from reconciler.core.errors import StaleWrite, UnstorableAnswer
from reconciler.core.provider_calls import CallResult, call_detail
from reconciler.core.records import OperationRecord
from reconciler.core.states import END_STATES, State
from reconciler.core.step_retry import GiveUp, RetryDecision, StepRetryPolicy
from reconciler.core.vocabulary import DelaySource, EscalationReason, HistoryKind, StepName
from reconciler.engine.context import StepContext

log = logging.getLogger("reconciler.engine.worker")

STEP_FAILED = "step_failed"  # the history note of each counted failure
MAX_CHAIN = 8  # exceptions of one chain a logged traceback shows


def stack_of(exc: BaseException) -> str:
    """A traceback of ``exc`` and the exceptions it was raised from: every frame and each
    exception's type, no exception's message."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain and len(chain) < MAX_CHAIN:
        chain.append(current)
        cause = current.__cause__
        current = (
            cause if cause is not None or current.__suppress_context__ else current.__context__
        )
    return "\nRaised while handling or from the above:\n\n".join(
        "Traceback (most recent call last):\n"
        + "".join(traceback.format_tb(item.__traceback__))
        + f"{step_retry.exception_name(item)} (its message is not logged)\n"
        for item in reversed(chain)
    )


def step_retry_policy(scheduler: SchedulerSettings) -> StepRetryPolicy:
    return StepRetryPolicy(
        base_seconds=scheduler.step_retry_base_seconds,
        max_seconds=scheduler.step_retry_max_seconds,
        max_attempts=scheduler.step_retry_attempts,
    )


class StepFailures:
    def __init__(self, ctx: StepContext, policy: StepRetryPolicy) -> None:
        self.ctx = ctx
        self.policy = policy

    async def record(self, op: OperationRecord, step: StepName, exc: Exception) -> bool:
        """Record ``exc`` from ``step`` on ``op`` (the record the task holds); False when it
        could not be recorded (the caller then keeps the lease until it runs out)."""
        try:
            if isinstance(exc, UnstorableAnswer):
                await self._violation(op, exc)
            else:
                await self._count(op, step, exc)
        except StaleWrite:
            return True  # the lease or the row moved on: whoever holds it now decides
        except Exception as failed:
            log.error(
                "operation %s: the %s step failed (%s) and the failure could not be "
                "recorded (%s); the operation waits for its lease to run out",
                op.id,
                step_retry.STEP_WORDS[step],
                step_retry.exception_name(exc),
                step_retry.exception_name(failed),
                extra={"operation_id": op.id, "exc": stack_of(exc)},
            )
            return False
        return True

    async def _count(self, op: OperationRecord, step: StepName, exc: Exception) -> None:
        ctx = self.ctx
        name = step_retry.exception_name(exc)
        decided: list[RetryDecision] = []

        def build(conn: Connection, fresh: OperationRecord) -> OperationRecord:
            now = ctx.now()
            failures = step_retry.failures_so_far(fresh.failed_step, fresh.step_failures, step)
            decision = step_retry.decide(self.policy, failures + 1, ctx.deps.rng)
            decided[:] = [decision]
            counts: dict[str, Any] = {
                "step_failures": decision.attempt,
                "failed_step": step.value,
            }
            detail: dict[str, Any] = {
                "step": step.value,
                "exception": name,
                "attempt": decision.attempt,
                "max_attempts": self.policy.max_attempts,
            }
            if isinstance(decision, GiveUp):
                note = Entry(
                    kind=HistoryKind.NOTE, actor=ctx.actor, cause=STEP_FAILED, detail=detail
                )
                if State(fresh.state) in END_STATES:
                    counts["next_poll_at"] = None  # a completion that stops until decided
                why = step_retry.escalation_detail(step, decision.attempt, name)
                return ctx.escalate_in(
                    conn, fresh, EscalationReason.INTERNAL_ERROR, why, before=[note], changes=counts
                )
            at = now + timedelta(seconds=decision.delay_seconds)
            detail["next_attempt_at"] = isoformat(at)
            note = Entry(
                kind=HistoryKind.NOTE,
                actor=ctx.actor,
                cause=STEP_FAILED,
                detail=detail,
                delay_source=DelaySource.STEP_RETRY,
            )
            counts.update(next_poll_at=at, delay_source=DelaySource.STEP_RETRY.value)
            return ctx.deps.journal.write(
                conn, fresh, now=now, changes=counts, entries=[note], lease=ctx.lease
            )

        await ctx.record_failure(op, build)
        decision = decided[0]
        if decision.attempt == 1:
            # The first of a burst carries the traceback; the next ones only count.
            log.error(
                "operation %s: the %s step failed (%s); attempt %d of %d, retried later",
                op.id,
                step_retry.STEP_WORDS[step],
                name,
                decision.attempt,
                self.policy.max_attempts,
                extra={
                    "operation_id": op.id,
                    "step": step.value,
                    "exception": name,
                    "exc": stack_of(exc),
                },
            )
        else:
            log.warning(
                "operation %s: the %s step failed again (%s); attempt %d of %d%s",
                op.id,
                step_retry.STEP_WORDS[step],
                name,
                decision.attempt,
                self.policy.max_attempts,
                ", retries spent" if isinstance(decision, GiveUp) else ", retried later",
                extra={"operation_id": op.id, "step": step.value, "exception": name},
            )

    async def _violation(self, op: OperationRecord, exc: UnstorableAnswer) -> None:
        ctx = self.ctx
        call = exc.call if isinstance(exc.call, CallResult) else None
        evidence: dict[str, Any] = call_detail(call) if call is not None else {}
        evidence["unstorable"] = {"at": exc.where, "value": exc.shown}
        entry = Entry(
            kind=HistoryKind.OBSERVATION,
            actor=ctx.actor,
            cause=f"{exc.call_name}_answer_refused",
            detail=evidence,
        )
        changes: dict[str, Any] = {}
        if call is not None and call.http_status is not None:
            changes.update(last_http_status=call.http_status, last_http_at=call.sent_at)
        detail = (
            f"the {exc.call_name} answer holds text no database can store (a NUL or a lone "
            f'surrogate) at {exc.where}: "{exc.shown}"'
        )
        await ctx.escalate(
            op, EscalationReason.CONTRACT_VIOLATION, detail, before=[entry], changes=changes
        )
