"""Sending the provider's cancel call once (``cancel_requested`` -> ``cancelling``).

The send is recorded before it happens (``cancel_sent_at``), so a worker
that crashed after sending does not send again; observation continues and
only the provider's own terminal state decides the outcome — a success or
failure that won the race is reported as it happened.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy.engine import Connection

from reconciler.core.cancel import answer_floor, first_read, send_or_watch
from reconciler.core.provider_calls import call_detail
from reconciler.core.records import OperationRecord
from reconciler.core.states import State
from reconciler.core.vocabulary import DelaySource, HistoryKind
from reconciler.engine.context import StepContext
from reconciler.engine.flow import Prep
from reconciler.storage.journal import Entry


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
        job_id = op.remote_job_id
        if prep is not None:
            sent = prep.op
        else:
            sent = await ctx.write(op, lambda conn: self._mark_sent(conn, op, now))
        call = await ctx.call(op, "cancel", lambda: ctx.adapter(op).cancel(job_id, op.trace_id))
        now = ctx.now()
        entry = Entry(
            kind=HistoryKind.OBSERVATION,
            actor=ctx.actor,
            cause="cancel_call",
            detail=call_detail(call),
        )
        changes: dict[str, Any] = {
            **watch,
            "last_http_status": call.http_status,
            "last_http_at": call.sent_at,
        }
        floor = answer_floor(read_at, now, call.retry_after)
        if floor is not None:
            # The cancel answer asked for a pause: the status read that confirms it waits.
            changes.update(
                next_poll_at=floor,
                delay_source=DelaySource.PROVIDER_RETRY_AFTER.value,
                retry_not_before=floor,
            )

        def record(conn: Connection, fresh: OperationRecord) -> OperationRecord:
            if State(fresh.state) is not State.CANCEL_REQUESTED:
                return journal.write(conn, fresh, now=now, entries=[entry], lease=ctx.lease)
            return journal.transition(
                conn,
                fresh,
                State.CANCELLING,
                actor=ctx.actor,
                cause="cancel_sent",
                now=now,
                detail={"http_status": call.http_status},
                changes=changes,
                before=[entry],
                lease=ctx.lease,
            )

        await ctx.apply(sent, record, final=True)
