"""Result collection, its own recorded action (``result_collecting``).

Fetch through the provider file's result path or the result reference,
validate (required fields; content type, size and checksum where given; the
body is read off the event loop, ``providers.result_check``), keep small
results inline and large ones as a reference with SHA-256 and size. Fetch
failures are retried with backoff up to the provider's failure budget, then
the operation ends ``result_unavailable``; a result that arrives but does not
validate ends ``result_validation_failed``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.engine import Connection

from reconciler.core.chain import Entry
from reconciler.core.collect import (
    CollectPlan,
    Denied,
    Invalid,
    RetryFetch,
    Unavailable,
    Verified,
    decide_collect,
    plan_collect,
)
from reconciler.core.provider_calls import CallResult, call_detail
from reconciler.core.records import OperationRecord
from reconciler.core.states import State
from reconciler.core.vocabulary import EscalationReason, HistoryKind
from reconciler.engine.context import StepContext, refuse_unstorable
from reconciler.engine.flow import Prep, lend_slot
from reconciler.providers.adapter import Subject
from reconciler.providers.result_check import check_off_loop, release


def _ref(op: OperationRecord, ctx: StepContext) -> str | None:
    spec = ctx.spec(op)
    pointer = spec.status.result_ref
    if pointer is None or op.status_body is None:
        return None
    value = pointer.resolve(op.status_body)
    return value if isinstance(value, str) else None


def _errors_ref(op: OperationRecord, ctx: StepContext) -> str | None:
    """The status body's reference to a JSONL result's errors file (``status.errors_ref``)."""
    spec = ctx.spec(op)
    pointer = spec.status.errors_ref
    if pointer is None or op.status_body is None or spec.result is None:
        return None
    if spec.result.errors_path is None:
        return None
    value = pointer.resolve(op.status_body)
    return value if isinstance(value, str) and value else None


def _count(op: OperationRecord) -> dict[str, Any]:
    return {"result_attempts": op.result_attempts + 1}


class CollectStep:
    def __init__(self, ctx: StepContext) -> None:
        self.ctx = ctx

    def _charge(self, conn: Connection, op: OperationRecord, now: datetime) -> OperationRecord:
        """The fetch is counted before it is sent (its failures are budgeted)."""
        return self.ctx.change_in(conn, op, now, **_count(op))

    def charge(self, op: OperationRecord, now: datetime) -> dict[str, Any] | None:
        """What ``prepare`` writes on ``op``: the fetch's count (``Flow.ahead``)."""
        plan = plan_collect(self.ctx.spec(op).result is not None, op.remote_job_id)
        return _count(op) if plan is CollectPlan.FETCH else None

    def prepare(self, conn: Connection, op: OperationRecord, now: datetime) -> Prep | None:
        """The count of the fetch, inside the transaction that hands the operation over
        (the confirming status read's, usually, which makes the count itself when it can:
        ``charge``)."""
        changes = self.charge(op, now)
        if changes is None:
            return None
        return Prep(self.ctx.change_in(conn, op, now, **changes))

    async def __call__(self, op: OperationRecord, prep: Prep | None = None) -> None:
        ctx = self.ctx
        spec = ctx.spec(op)
        journal = ctx.deps.journal
        now = ctx.now()
        ref = _ref(op, ctx)
        plan = plan_collect(spec.result is not None, op.remote_job_id)
        if plan is CollectPlan.SUCCEED:
            # Nothing to fetch or check: the confirmed terminal status is the outcome.
            await ctx.write(
                op,
                lambda conn: journal.transition(
                    conn,
                    op,
                    State.SUCCEEDED,
                    actor=ctx.actor,
                    cause="no_result_to_collect",
                    now=now,
                    changes={"result": {"ref": ref, "status": op.status_body}},
                    lease=ctx.lease,
                ),
                final=True,
            )
            return
        assert plan is CollectPlan.FETCH and op.remote_job_id is not None, plan
        if prep is not None:
            charged = prep.op
        else:
            charged = await ctx.write(op, lambda conn: self._charge(conn, op, now))
        call = await ctx.call(
            op, "result", lambda: ctx.adapter(op).fetch_result(Subject.of(op), ref)
        )
        errors_call = None
        try:
            errors_call = await self._errors_file(op) if call.ok else None
            # The bodies are read where they cannot stall the service, and let go at once.
            check = (
                await check_off_loop(spec, call, op.status_body, errors_call)
                if call.ok and not call.refused and (errors_call is None or errors_call.ok)
                else None
            )
        finally:
            release(call, errors_call)
        lend_slot(op)  # no more calls: the provider's slot is free while this is recorded
        # A body too large to hold was scanned apart from the call: what the scan kept of it
        # (summary values, failed items) is checked as an answer is.
        refuse_unstorable("result", check, call)
        now = ctx.now()
        fetched = call_detail(call)
        if errors_call is not None:
            fetched["errors_file"] = call_detail(errors_call)
        entry = Entry(
            kind=HistoryKind.OBSERVATION,
            actor=ctx.actor,
            cause="result_fetch",
            detail=fetched,
        )
        if errors_call is not None and not errors_call.ok:
            call = errors_call  # the errors file decides: retry it, or it is unavailable
        decision = decide_collect(
            call,
            check,
            ref=ref,
            category=spec.states.category_of(op.remote_state),
            attempts=charged.result_attempts,
            max_failures=charged.max_transport_failures,
            detail=dict(entry.detail or {}),
            backoff=ctx.backoff(spec),
            rng=ctx.deps.rng,
        )
        if isinstance(decision, Denied):
            await ctx.escalate(
                charged, EscalationReason.AUTHORIZATION_DENIED, decision.detail, before=[entry]
            )
            return
        if isinstance(decision, RetryFetch):
            retry_at = now + timedelta(seconds=decision.delay_seconds)
            await ctx.apply(
                charged,
                lambda conn, fresh: journal.write(
                    conn,
                    fresh,
                    now=now,
                    lease=ctx.lease,
                    entries=[entry],
                    changes={"next_poll_at": retry_at},
                ),
                final=True,
            )
            return
        target, cause, changes, detail = self._ending(decision)
        await ctx.apply(
            charged,
            lambda conn, fresh: journal.transition(
                conn,
                fresh,
                target,
                actor=ctx.actor,
                cause=cause,
                now=now,
                changes=changes,
                detail=detail,
                before=[entry],
                lease=ctx.lease,
            ),
            final=True,
        )

    async def _errors_file(self, op: OperationRecord) -> CallResult | None:
        """The JSONL result's errors file, when the status names one; its lines are failed."""
        ctx = self.ctx
        ref = _errors_ref(op, ctx)
        fetch = getattr(ctx.adapter(op), "fetch_errors", None)
        if ref is None or fetch is None:
            return None
        subject = Subject.of(op)
        result: CallResult = await ctx.call(op, "result", lambda: fetch(subject, ref))
        return result

    @staticmethod
    def _ending(
        decision: Unavailable | Invalid | Verified,
    ) -> tuple[State, str, dict[str, Any], dict[str, Any] | None]:
        """The end state, cause, row changes and transition detail of a final decision."""
        if isinstance(decision, Unavailable):
            return State.RESULT_UNAVAILABLE, "result_fetch_failed", {"error": decision.error}, None
        if isinstance(decision, Invalid):
            return (
                State.RESULT_VALIDATION_FAILED,
                "result_validation_failed",
                {"error": decision.error},
                {"problems": list(decision.problems)},
            )
        record = decision.record
        detail = {"sha256": record["sha256"], "size": record["size"], "summary": record["summary"]}
        return decision.state, "result_verified", {"result": record}, detail
