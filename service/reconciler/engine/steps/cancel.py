"""Sending the provider's cancel call once (``cancel_requested`` -> ``cancelling``).

The send is recorded before it happens (``cancel_sent_at``), so a worker
that crashed after sending does not send again; observation continues and
only the provider's own terminal state decides the outcome — a success or
failure that won the race is reported as it happened.

Only an answer that took the cancel moves to ``cancelling`` (``core.cancel.cancel_answer``):
a refusal sends the operation back to ``observing`` with the refusal kept for its answer;
a cancel the provider did not take ("not now", never delivered) is sent again later
within the cancel window; a refused credential is a person's call
(``authorization_denied``).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy.engine import Connection

from reconciler.core.cancel import (
    CancelAnswer,
    answer_floor,
    first_read,
    refusal_record,
    resend_at,
    send_or_watch,
)
from reconciler.core.chain import Entry
from reconciler.core.clock import isoformat
from reconciler.core.provider_calls import CallResult, answer_words, call_detail
from reconciler.core.records import OperationRecord
from reconciler.core.states import State
from reconciler.core.vocabulary import DelaySource, EscalationReason, HistoryKind
from reconciler.engine.context import StepContext
from reconciler.engine.flow import Prep
from reconciler.providers.adapter import Subject, cancel_outcome

# What a refused cancel clears: the intent is spent, so the agent may ask again.
_INTENT_SPENT = {
    "cancel_requested_at": None,
    "cancel_requested_by": None,
    "cancel_reason": None,
    "cancel_sent_at": None,
    "cancel_deadline_at": None,
}


class CancelStep:
    def __init__(self, ctx: StepContext) -> None:
        self.ctx = ctx

    def _mark_sent(self, conn: Connection, op: OperationRecord, now: datetime) -> OperationRecord:
        """The send is recorded before it happens: a crash after it never sends again."""
        return self.ctx.change_in(conn, op, now, cancel_sent_at=now)

    def prepare(self, conn: Connection, op: OperationRecord, now: datetime) -> Prep | None:
        if send_or_watch(op, self.ctx.spec(op).cancel is not None) is not None:
            return None
        return Prep(self._mark_sent(conn, op, now))

    async def __call__(self, op: OperationRecord, prep: Prep | None = None) -> None:
        ctx = self.ctx
        spec = ctx.spec(op)
        journal = ctx.deps.journal
        now = ctx.now()
        read_at, source = first_read(now, spec.polling.base_delay_seconds, op.retry_not_before)
        watch = {"next_poll_at": read_at, "delay_source": source.value}
        note = send_or_watch(op, spec.cancel is not None)
        if prep is None and note is not None:
            await ctx.write(
                op,
                lambda conn: journal.transition(
                    conn,
                    op,
                    State.CANCELLING,
                    actor=ctx.actor,
                    cause="cancel_watch",
                    now=now,
                    detail={"note": note},
                    changes=watch,
                    lease=ctx.lease,
                ),
                final=True,
            )
            return
        assert op.remote_job_id is not None
        if prep is not None:
            sent = prep.op
        else:
            sent = await ctx.write(op, lambda conn: self._mark_sent(conn, op, now))
        call = await ctx.call(op, "cancel", lambda: ctx.adapter(op).cancel(Subject.of(op)))
        now = ctx.now()
        answer = cancel_outcome(spec, call)
        entry = Entry(
            kind=HistoryKind.OBSERVATION,
            actor=ctx.actor,
            cause="cancel_call",
            detail={**call_detail(call), "answer": answer.value},
        )
        answered: dict[str, Any] = {
            "last_http_status": call.http_status,
            "last_http_at": call.sent_at,
        }
        if answer is CancelAnswer.REFUSED:
            await self._refused(sent, call, entry, {**watch, **answered}, now)
            return
        if answer is CancelAnswer.DENIED:
            detail = (
                f"HTTP {call.http_status} from the cancel call: the provider refused this "
                "service's credential; check it, its scope and the account"
            )
            cleared = {"cancel_sent_at": None, **answered}
            await ctx.escalate(
                sent, EscalationReason.AUTHORIZATION_DENIED, detail, before=[entry], changes=cleared
            )
            return
        if answer is CancelAnswer.NOT_TAKEN:
            await self._not_taken(sent, call, entry, answered, now)
            return
        changes: dict[str, Any] = {**watch, **answered}
        floor = answer_floor(read_at, now, call.retry_after)
        if floor is not None:
            # The cancel answer asked for a pause: the status read that confirms it waits.
            changes.update(
                next_poll_at=floor,
                delay_source=DelaySource.PROVIDER_RETRY_AFTER.value,
                retry_not_before=floor,
            )
        cause = "cancel_accepted" if answer is CancelAnswer.ACCEPTED else "cancel_sent"
        await self._while_requested(
            sent,
            entry,
            now,
            lambda conn, fresh: journal.transition(
                conn,
                fresh,
                State.CANCELLING,
                actor=ctx.actor,
                cause=cause,
                now=now,
                detail={"http_status": call.http_status, "answer": answer.value},
                changes={**changes, "cancel_refusal": None},
                before=[entry],
                lease=ctx.lease,
            ),
        )

    async def _while_requested(
        self,
        op: OperationRecord,
        entry: Entry,
        now: datetime,
        move: Callable[[Connection, OperationRecord], OperationRecord],
    ) -> None:
        """``move`` on the fresh row while it still awaits this cancel; otherwise (a decision
        or the job's own end moved it meanwhile) the answer is only recorded."""
        ctx, journal = self.ctx, self.ctx.deps.journal

        def record(conn: Connection, fresh: OperationRecord) -> OperationRecord:
            if State(fresh.state) is not State.CANCEL_REQUESTED:
                return journal.write(conn, fresh, now=now, entries=[entry], lease=ctx.lease)
            return move(conn, fresh)

        await ctx.apply(op, record, final=True)

    async def _refused(
        self,
        op: OperationRecord,
        call: CallResult,
        entry: Entry,
        changes: dict[str, Any],
        now: datetime,
    ) -> None:
        """The provider said no: the job goes on being observed, and its answer says why."""
        ctx, journal = self.ctx, self.ctx.deps.journal
        refusal = refusal_record(call, now)
        await self._while_requested(
            op,
            entry,
            now,
            lambda conn, fresh: journal.transition(
                conn,
                fresh,
                State.OBSERVING,
                actor=ctx.actor,
                cause="cancel_refused",
                now=now,
                detail=refusal,
                changes={**changes, **_INTENT_SPENT, "cancel_refusal": refusal},
                before=[entry],
                lease=ctx.lease,
            ),
        )

    async def _not_taken(
        self,
        op: OperationRecord,
        call: CallResult,
        entry: Entry,
        answered: dict[str, Any],
        now: datetime,
    ) -> None:
        """Never delivered, or "not now": sent again later, within the cancel window."""
        ctx, journal = self.ctx, self.ctx.deps.journal
        close = op.cancel_deadline_at
        if close is not None and now >= close:
            detail = (
                f"the provider did not take the cancel by {isoformat(close)} "
                f"(last answer: {answer_words(call)}); it was never confirmed sent"
            )
            await ctx.escalate(
                op,
                EscalationReason.CANCELLATION_UNCONFIRMED,
                detail,
                before=[entry],
                changes={"cancel_sent_at": None, **answered},
            )
            return
        at = resend_at(op, now, ctx.spec(op).polling.base_delay_seconds)
        source = DelaySource.LOCAL_BACKOFF
        floor = answer_floor(at, now, call.retry_after)
        if floor is not None:
            at, source = floor, DelaySource.PROVIDER_RETRY_AFTER
        if close is not None and at > close:
            at = close  # the window's end: one more try, or the escalation above
        changes = {
            **answered,
            "cancel_sent_at": None,
            "next_poll_at": at,
            "delay_source": source.value,
        }

        await self._while_requested(
            op,
            entry,
            now,
            lambda conn, fresh: journal.write(
                conn, fresh, now=now, changes=changes, entries=[entry], lease=ctx.lease
            ),
        )
