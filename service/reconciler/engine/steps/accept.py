"""The job id confirmed (by the create's answer or a lookup): ``accepted``, then watched.

One write: the operation is accepted with the evidence, webhooks that came for the job
before its id was known are attached to it (orphans), and the operation moves on in the
same statement (``Journal.transition(through=...)``): a cancel that arrived before the
job id is applied now that there is a job, otherwise the first status read is set
(``core.next_read.first_poll``). Orphans are rare: only when the write attached some
does a second write in the same transaction make them the operation's hint, its read
due at once (docs/design.md#intake).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.engine import Connection

from reconciler.core.chain import Entry
from reconciler.core.clock import isoformat
from reconciler.core.next_read import first_poll
from reconciler.core.provider_calls import CallResult, call_detail
from reconciler.core.records import OperationRecord
from reconciler.core.states import State
from reconciler.core.vocabulary import DelaySource, HistoryKind
from reconciler.engine.context import StepContext
from reconciler.engine.flow import lend_slot
from reconciler.providers.adapter import CreateOutcome
from reconciler.storage.journal import Checked, Step
from reconciler.storage.notify import WAKE_CHANNEL, notify_in_transaction
from reconciler.storage.webhook_events import (
    attach_orphans,
    attached_events,
    lock_job_for_accept,
)


async def accept_job(
    ctx: StepContext,
    op: OperationRecord,
    job_id: str,
    outcome: CreateOutcome | None,
    call: CallResult,
    via: str,
    *,
    before: Sequence[Entry] = (),
) -> None:
    """Record ``job_id`` as ``op``'s job, learned from ``call`` (``via``: create or lookup)."""
    lend_slot(op)  # the create's calls are over: the provider's slot is free while it is recorded
    spec = ctx.spec(op)
    now = ctx.now()
    policy = ctx.poll_policy(spec)
    adaptive = ctx.trust_policy(spec).adaptive

    def accept(conn: Connection, fresh: OperationRecord) -> OperationRecord:
        journal = ctx.deps.journal
        evidence = {**call_detail(call), "job_id": job_id, "via": via}
        changes: dict[str, Any] = {
            "remote_job_id": job_id,
            "remote_state": outcome.remote_state if outcome else None,
            "accepted_at": now,
            "last_http_status": call.http_status,
            "last_http_at": call.sent_at,
            "last_provider_request_id": call.provider_request_id,
        }
        trusted = lock_job_for_accept(conn, op.provider, job_id, trust=adaptive)
        # Orphans are rare: the write attaches them in its own statement and says whether
        # there were any; only then are they read and made the operation's hint.
        orphans = Checked(attach_orphans(op.provider, job_id, op.id))
        # Accepted, and on to the next state in the same write: one statement, each move
        # its own history entry.
        accepted = Step(State.ACCEPTED, f"{via}_confirmed_job", evidence)
        if fresh.cancel_requested_at is not None:
            # A cancel arrived before the job id: apply it now that there is a job.
            to, cause = State.CANCEL_REQUESTED, "held_cancel_applied"
            detail: dict[str, Any] | None = None
            nxt: dict[str, Any] = {"next_poll_at": now}
        else:
            # The create answer is the first observation: while the provider's webhooks are
            # trusted, even the first fallback read waits the stretched schedule.
            first, source = first_poll(now, op.deadline_at, ctx.deps.rng, policy, trusted=trusted)
            to, cause = State.OBSERVING, "observing"
            detail = {"next_poll_at": isoformat(first)}
            nxt = {"next_poll_at": first, "delay_source": source.value}
        after = journal.transition(
            conn,
            fresh,
            to,
            actor=ctx.actor,
            cause=cause,
            now=now,
            detail=detail,
            changes={**changes, **nxt},
            before=before,
            through=[accepted],
            lease=ctx.lease,
            also=(orphans,),
        )
        # A cancel's read is due at once already; a watched job's comes forward.
        return _hinted(conn, after, orphans, now, wake=to is State.OBSERVING)

    def _hinted(
        conn: Connection, after: OperationRecord, orphans: Checked, now: datetime, *, wake: bool
    ) -> OperationRecord:
        """The orphans the accept attached, if any, as the operation's hint: one entry each,
        and (``wake``) its next read at once."""
        if not orphans.changed:
            return after
        assert after.remote_job_id is not None
        hints = [
            Entry(
                kind=HistoryKind.HINT,
                actor=f"provider:{op.provider}",
                cause=f"webhook:{event_id}",
                detail={"event_id": event_id, "orphan": True},
                delay_source=DelaySource.WEBHOOK_HINT,
            )
            for event_id in attached_events(conn, op.provider, after.remote_job_id, op.id)
        ]
        hint: dict[str, Any] = {}
        if wake:
            hint = {
                "next_poll_at": now,
                "delay_source": DelaySource.WEBHOOK_HINT.value,
                "hinted_at": now,
            }
            notify_in_transaction(conn, WAKE_CHANNEL)
        journal = ctx.deps.journal
        return journal.write(conn, after, now=now, changes=hint, entries=hints, lease=ctx.lease)

    await ctx.apply(op, accept, final=True)
