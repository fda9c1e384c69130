"""Establishing the provider's job id exactly once (``create_pending`` / ``create_unknown``).

The create call carries the stored idempotency token, and the attempt is
counted and persisted *before* sending, so a cancel that arrives first
stops the call and a crash after sending leaves evidence that a job may
exist. An ambiguous outcome (timeout, reset, 5xx without a job id) moves to
``create_unknown`` and is reconciled with the provider's lookup by
idempotency key when the provider file has one, else by resending with the
same token, until the create deadline. Every create and lookup is one backoff
step: its count and the time of the next try are written before it is sent,
so neither a provider that is down nor a lost write makes a tight loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.engine import Connection

from reconciler.core.clock import isoformat
from reconciler.core.create import (
    Ambiguous,
    CreateDecision,
    CreateObservation,
    Rejected,
    before_create,
    body_text,
    decide_create,
    may_have_landed,
    next_try_at,
    retry_create,
)
from reconciler.core.next_read import first_poll
from reconciler.core.poll_values import Stop
from reconciler.core.provider_calls import CallResult, call_detail
from reconciler.core.records import OperationRecord
from reconciler.core.states import State
from reconciler.core.vocabulary import DelaySource, EscalationReason, HistoryKind
from reconciler.engine.context import STORAGE_OUTAGE, StepContext
from reconciler.engine.flow import Prep
from reconciler.engine.steps.resend import (
    RESEND_SAFE,
    lookup_job,
    resend_allowed,
    template_values,
    unsettled_lookup,
)
from reconciler.providers.adapter import CreateOutcome, LookupOutcome, LookupVerdict
from reconciler.providers.create_set import apply_set
from reconciler.providers.spec import IdempotencyMode
from reconciler.storage.history import notes_with_cause
from reconciler.storage.journal import Entry
from reconciler.storage.notify import WAKE_CHANNEL, notify_in_transaction
from reconciler.storage.payloads import load_request
from reconciler.storage.trust import is_trusted
from reconciler.storage.webhook_events import attach_orphans


def _observation(call: CallResult, job_id: str | None) -> CreateObservation:
    error = None
    if call.http_status is not None and call.http_status >= 400:
        error = call.body if call.body is not None else body_text(call.body_bytes)
    return CreateObservation(
        at=call.sent_at,
        http_status=call.http_status,
        transport_error=call.transport_error,
        job_id=job_id,
        retry_after=call.retry_after,
        error=error,
        rate_limited=call.rate_limited,
    )


def _ambiguity(call: CallResult) -> str:
    if call.transport_error is not None:
        return (
            f"the create got no answer ({call.transport_error.value}) after it may have been sent"
        )
    return f"the create was answered HTTP {call.http_status} without a job id"


class CreateStep:
    def __init__(self, ctx: StepContext) -> None:
        self.ctx = ctx

    def prepare(self, conn: Connection, op: OperationRecord, now: datetime) -> Prep | None:
        """A first create's count and next try, inside the claim; with it, the request.

        Only a create that cannot have reached the provider yet: one that may have (an
        attempt on record, or ``create_unknown``) is looked up first, by the step itself.
        """
        if before_create(op.create_deadline_at, now) is not None:
            return None
        if State(op.state) is not State.CREATE_PENDING or op.create_attempts > 0:
            return None
        charged = self._reserve_in(conn, op, {"create_attempts": 1}, [], now)
        return Prep(charged, load_request(conn, op.id))

    async def __call__(self, op: OperationRecord, prep: Prep | None = None) -> None:
        ctx = self.ctx
        if prep is not None:
            await self._send(op, prepared=prep)
            return
        spec = ctx.spec(op)
        now = ctx.now()
        stop = before_create(op.create_deadline_at, now)
        if stop is not None:
            await self._window_ended(op, stop)
            return
        # A create may already have reached the provider: in create_unknown, and also in
        # create_pending after a restart with an attempt on record. Look before resending.
        maybe_sent = State(op.state) is State.CREATE_UNKNOWN or op.create_attempts > 0
        if maybe_sent and spec.create.idempotency is IdempotencyMode.NONE:
            # No key: a resend may make a second job. Only a create that certainly made
            # none, or a person's decision, allows one; otherwise the lookup, if any, asks.
            allowed = await ctx.deps.db.run(resend_allowed, ctx.deps.db, op, ctx.actor)
            if allowed is not None:
                await self._send(op, [allowed])
                return
            if spec.lookup is None:
                await self._create_unknown(op, "the create may have made a job", [])
                return
        if maybe_sent and spec.lookup is not None:
            op = await self._reserve(op, {"create_lookups": op.create_lookups + 1})
            found = await ctx.call(op, "lookup", lambda: lookup_job(ctx.adapter(op), op))
            if found.verdict is LookupVerdict.FOUND and found.job_id:
                await self._accept(op, found.job_id, None, found.call, "lookup")
                return
            if found.verdict is LookupVerdict.UNKNOWN:
                await self._ambiguous_or_stop(op, found.call, None, "lookup", found.job_id_problem)
                return
            # Not found: the create never landed, so resending with the same token is safe.
            # The lookup is recorded: it is the evidence behind the resend.
            seen = Entry(
                kind=HistoryKind.OBSERVATION,
                actor=ctx.actor,
                cause="lookup_response",
                detail={**call_detail(found.call), "job_id": None, "decision": "resend"},
            )
            await self._send(op, [seen])
            return
        await self._send(op)

    async def _window_ended(self, op: OperationRecord, stop: Stop) -> None:
        """The create window is over: look before escalating, and never blame the provider
        for time our own database was down.

        A create that may have landed is looked up once (the job may exist: an outage of
        ours may have lost its answer); found, it is tracked like any late job id. If our
        database was unavailable during the window, that is recorded, and the window is
        given back once (what was left of it when the outage began) instead of escalating
        ``provider_failure`` for a window the provider never had.
        """
        ctx = self.ctx
        spec = ctx.spec(op)
        outage = ctx.outage_note(op.created_at, op.create_deadline_at)
        notes: list[Entry] = [outage.entry] if outage is not None else []
        maybe_sent = State(op.state) is State.CREATE_UNKNOWN or op.create_attempts > 0
        # Without a key, a create that may have made a job and that no lookup could settle
        # is a person's call (abandon or resend), not a provider failure.
        unsettled = maybe_sent and spec.create.idempotency is IdempotencyMode.NONE
        if maybe_sent and spec.lookup is not None:
            found = await ctx.call(op, "lookup", lambda: lookup_job(ctx.adapter(op), op))
            if found.verdict is LookupVerdict.FOUND and found.job_id:
                await self._accept(op, found.job_id, None, found.call, "lookup", before=notes)
                return
            unsettled = unsettled and found.verdict is LookupVerdict.UNKNOWN
            notes.append(
                Entry(
                    kind=HistoryKind.OBSERVATION,
                    actor=ctx.actor,
                    cause="lookup_response",
                    detail={
                        **call_detail(found.call),
                        "job_id": None,
                        "job_id_problem": found.job_id_problem,
                        "decision": "window_ended",
                    },
                )
            )
        if outage is not None:
            left = op.create_deadline_at - max(outage.started_at, op.created_at)
            until = min(ctx.now() + left, op.deadline_at)
            if until > ctx.now() and not await ctx.deps.db.run(self._extended_before, op.id):
                await self._give_back(op, until, notes)
                return
        if unsettled:
            await self._create_unknown(op, f"{stop.detail}; the create may have made a job", notes)
            return
        await self._escalate(op, stop.reason, stop.detail, notes)

    def _extended_before(self, op_id: str) -> bool:
        with self.ctx.deps.db.read() as conn:
            notes = notes_with_cause(conn, op_id, STORAGE_OUTAGE)
        return any("create_window_until" in n for n in notes)

    async def _give_back(self, op: OperationRecord, until: datetime, notes: list[Entry]) -> None:
        ctx = self.ctx
        now = ctx.now()
        first, *rest = notes
        given = Entry(
            kind=first.kind,
            actor=first.actor,
            cause=first.cause,
            detail={**(first.detail or {}), "create_window_until": isoformat(until)},
        )
        changes = {"create_deadline_at": until, "next_poll_at": now, "delay_source": None}
        await ctx.apply(
            op,
            lambda conn, fresh: ctx.deps.journal.write(
                conn, fresh, now=now, changes=changes, entries=[given, *rest], lease=ctx.lease
            ),
            final=True,
        )

    def _reserve_in(
        self,
        conn: Connection,
        op: OperationRecord,
        counts: dict[str, int],
        before: list[Entry],
        now: datetime,
    ) -> OperationRecord:
        """Count the call and schedule the next try one backoff step away, before sending."""
        ctx = self.ctx
        calls = op.create_attempts + op.create_lookups + 1
        retry_at = next_try_at(
            op.create_deadline_at, calls, now, ctx.deps.rng, ctx.backoff(ctx.spec(op))
        )
        changes = {
            **counts,
            "next_poll_at": retry_at,
            "delay_source": DelaySource.LOCAL_BACKOFF.value,
        }
        return ctx.deps.journal.write(
            conn, op, now=now, lease=ctx.lease, changes=changes, entries=before
        )

    async def _reserve(
        self, op: OperationRecord, counts: dict[str, int], before: list[Entry] | None = None
    ) -> OperationRecord:
        now = self.ctx.now()
        return await self.ctx.write(
            op, lambda conn: self._reserve_in(conn, op, counts, before or [], now)
        )

    async def _send(
        self,
        op: OperationRecord,
        before: list[Entry] | None = None,
        *,
        prepared: Prep | None = None,
    ) -> None:
        ctx = self.ctx
        if prepared is not None:
            charged, request = prepared.op, prepared.data
        else:
            charged = await self._reserve(op, {"create_attempts": op.create_attempts + 1}, before)
            request = await ctx.deps.db.run(self._request, op.id)
        spec = ctx.spec(op)
        body = apply_set(request, spec.create.set, template_values(op, spec))
        outcome = await ctx.call(
            op,
            "create",
            lambda: ctx.adapter(op).create(body, op.idempotency_token, op.trace_id),
        )
        if outcome.duplicate:
            await self._duplicate(charged, outcome)
            return
        if outcome.job_id:
            if charged.create_attempts > 1 and ctx.spec(op).lookup is not None:
                # A resend answered: make sure the provider did not start a second job for
                # the same token (an unfamiliar job id is a contract violation:
                # docs/design.md#duplicate-answers).
                check = await ctx.call(op, "lookup", lambda: lookup_job(ctx.adapter(op), op))
                if (
                    check.verdict is LookupVerdict.FOUND
                    and check.job_id
                    and check.job_id != outcome.job_id
                ):
                    await self._violation(charged, outcome, check)
                    return
            await self._accept(charged, outcome.job_id, outcome, outcome.call, "create")
            return
        await self._ambiguous_or_stop(charged, outcome.call, outcome, "create")

    async def _duplicate(self, op: OperationRecord, outcome: CreateOutcome) -> None:
        """The provider says this key already made a job: find it, never resend or fail."""
        ctx = self.ctx
        seen = Entry(
            kind=HistoryKind.OBSERVATION,
            actor=ctx.actor,
            cause="create_response",
            detail={**call_detail(outcome.call), "decision": "duplicate"},
        )
        if ctx.spec(op).lookup is None:
            await self._retry(op, outcome.call, seen, "a duplicate answer, and no lookup")
            return
        op = await self._reserve(op, {"create_lookups": op.create_lookups + 1}, [seen])
        found = await ctx.call(op, "lookup", lambda: lookup_job(ctx.adapter(op), op))
        if found.verdict is LookupVerdict.FOUND and found.job_id:
            await self._accept(op, found.job_id, None, found.call, "lookup")
            return
        entry = Entry(
            kind=HistoryKind.OBSERVATION,
            actor=ctx.actor,
            cause="lookup_response",
            detail={**call_detail(found.call), "job_id": None, "decision": "ambiguous"},
        )
        # The job exists but the lookup does not show it yet (a lagging index): look again.
        await self._retry(op, found.call, entry, "the duplicate's job is not found yet")

    async def _retry(
        self, op: OperationRecord, call: CallResult, entry: Entry, detail: str
    ) -> None:
        ctx = self.ctx
        now = ctx.now()
        decision = retry_create(
            op.create_deadline_at,
            max(op.create_attempts + op.create_lookups, 1),
            detail,
            now,
            ctx.deps.rng,
            ctx.backoff(ctx.spec(op)),
            call.retry_after,
        )
        if isinstance(decision, Stop):
            await self._escalate(op, decision.reason, decision.detail, [entry])
            return
        await self._retry_later(op, decision, entry, call)

    async def _create_unknown(self, op: OperationRecord, detail: str, before: list[Entry]) -> None:
        await self._escalate(
            op,
            EscalationReason.CREATE_UNKNOWN,
            f"{detail}, and the provider takes no idempotency key and no lookup settled "
            "it: it is not resent without a decision",
            before,
        )

    def _request(self, op_id: str) -> Any:
        """The create body as stored (read only here: it is the operation's largest part)."""
        with self.ctx.deps.db.read() as conn:
            return load_request(conn, op_id)

    async def _ambiguous_or_stop(
        self,
        op: OperationRecord,
        call: CallResult,
        outcome: CreateOutcome | None,
        via: str,
        problem: str | None = None,
    ) -> None:
        ctx = self.ctx
        now = ctx.now()
        calls = max(op.create_attempts + op.create_lookups, 1)
        backoff = ctx.backoff(ctx.spec(op))
        decision: CreateDecision
        if via == "lookup":
            # A lookup that could not answer (refused, unreadable, a list not read to its
            # end) says nothing of the create: never a rejection, always "look again".
            why = unsettled_lookup(call, problem)
            decision = retry_create(
                op.create_deadline_at, calls, why, now, ctx.deps.rng, backoff, call.retry_after
            )
        else:
            decision = decide_create(
                op.create_deadline_at, calls, _observation(call, None), now, ctx.deps.rng, backoff
            )
        detail = {
            **call_detail(call),
            "job_id_problem": outcome.job_id_problem if outcome else problem,
            "decision": type(decision).__name__.lower(),
        }
        spec = ctx.spec(op)
        keyless = spec.lookup is None and spec.create.idempotency is IdempotencyMode.NONE
        landed = may_have_landed(
            call.http_status, call.transport_error, call.maybe_delivered, call.rate_limited
        )
        if keyless and via == "create" and not landed:
            # Evidence for the next try: this attempt made no job, so one more is safe.
            detail[RESEND_SAFE] = op.create_attempts
        entry = Entry(
            kind=HistoryKind.OBSERVATION,
            actor=ctx.actor,
            cause=f"{via}_response",
            detail=detail,
        )
        if keyless and landed and isinstance(decision, Ambiguous):
            await self._create_unknown(op, _ambiguity(call), [entry])
            return
        if isinstance(decision, Rejected):
            error = decision.error_record(via)
            await ctx.apply(
                op,
                lambda conn, fresh: ctx.deps.journal.transition(
                    conn,
                    fresh,
                    State.FAILED,
                    actor=ctx.actor,
                    cause=f"{via}_rejected",
                    now=now,
                    detail={"http_status": decision.http_status},
                    changes={"error": error},
                    before=[entry],
                    lease=ctx.lease,
                ),
                final=True,
            )
        elif isinstance(decision, Stop):
            # The window may close while a call is out. Without a key, a create that may
            # have made a job is then the operator's call, as when it closes between calls
            # (``_window_ended``): never a provider failure that hides the possible job.
            unsettled = spec.create.idempotency is IdempotencyMode.NONE and (
                via == "lookup" or landed or State(op.state) is State.CREATE_UNKNOWN
            )
            if unsettled and decision.reason is EscalationReason.PROVIDER_FAILURE:
                detail_text = f"{decision.detail}; the create may have made a job"
                await self._create_unknown(op, detail_text, [entry])
            else:
                await self._escalate(op, decision.reason, decision.detail, [entry])
        elif isinstance(decision, Ambiguous):
            await self._retry_later(op, decision, entry, call)
        else:  # Accepted is handled by the callers, which hold the job id
            raise AssertionError(decision)

    async def _retry_later(
        self, op: OperationRecord, decision: Ambiguous, entry: Entry, call: CallResult
    ) -> None:
        ctx = self.ctx
        now = ctx.now()
        changes = {
            "next_poll_at": decision.retry_at,
            "delay_source": decision.source.value,
            "last_http_status": call.http_status,
            "last_http_at": call.sent_at,
        }
        journal = ctx.deps.journal

        def later(conn: Connection, fresh: OperationRecord) -> OperationRecord:
            if State(fresh.state) is State.CREATE_PENDING and call.maybe_delivered:
                return journal.transition(
                    conn,
                    fresh,
                    State.CREATE_UNKNOWN,
                    actor=ctx.actor,
                    cause="create_ambiguous",
                    now=now,
                    detail={"detail": decision.detail},
                    changes=changes,
                    before=[entry],
                    lease=ctx.lease,
                )
            return journal.write(
                conn, fresh, now=now, changes=changes, entries=[entry], lease=ctx.lease
            )

        await ctx.apply(op, later, final=True)

    async def _accept(
        self,
        op: OperationRecord,
        job_id: str,
        outcome: CreateOutcome | None,
        call: CallResult,
        via: str,
        *,
        before: Sequence[Entry] = (),
    ) -> None:
        ctx = self.ctx
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
            after = journal.transition(
                conn,
                fresh,
                State.ACCEPTED,
                actor=ctx.actor,
                cause=f"{via}_confirmed_job",
                now=now,
                detail=evidence,
                changes=changes,
                before=before,
                lease=ctx.lease,
            )
            orphans = attach_orphans(conn, op.provider, job_id, op.id)
            hints = [
                Entry(
                    kind=HistoryKind.HINT,
                    actor=f"provider:{op.provider}",
                    cause=f"webhook:{event_id}",
                    detail={"event_id": event_id, "orphan": True},
                    delay_source=DelaySource.WEBHOOK_HINT,
                )
                for event_id in orphans
            ]
            if after.cancel_requested_at is not None:
                # A cancel arrived before the job id: apply it now that there is a job.
                return journal.transition(
                    conn,
                    after,
                    State.CANCEL_REQUESTED,
                    actor=ctx.actor,
                    cause="held_cancel_applied",
                    now=now,
                    changes={"next_poll_at": now},
                    entries=hints,
                    lease=ctx.lease,
                )
            # The create answer is the first observation: while the provider's webhooks are
            # trusted, even the first fallback read waits the stretched schedule.
            trusted = adaptive and is_trusted(conn, op.provider)
            first, source = first_poll(now, op.deadline_at, ctx.deps.rng, policy, trusted=trusted)
            nxt: dict[str, Any] = {"next_poll_at": first, "delay_source": source.value}
            if orphans:
                nxt = {
                    "next_poll_at": now,
                    "delay_source": DelaySource.WEBHOOK_HINT.value,
                    "hinted_at": now,
                }
                notify_in_transaction(conn, WAKE_CHANNEL)
            return journal.transition(
                conn,
                after,
                State.OBSERVING,
                actor=ctx.actor,
                cause="observing",
                now=now,
                detail={"next_poll_at": isoformat(nxt["next_poll_at"])},
                changes=nxt,
                entries=hints,
                lease=ctx.lease,
            )

        await ctx.apply(op, accept, final=True)

    async def _violation(
        self, op: OperationRecord, outcome: CreateOutcome, check: LookupOutcome
    ) -> None:
        detail = (
            f"the same idempotency token was answered with job {outcome.job_id} by the "
            f"create call and {check.job_id} by the lookup; neither is chosen"
        )
        entries = [
            Entry(
                kind=HistoryKind.OBSERVATION,
                actor=self.ctx.actor,
                cause="create_response",
                detail={**call_detail(outcome.call), "job_id": outcome.job_id},
            ),
            Entry(
                kind=HistoryKind.OBSERVATION,
                actor=self.ctx.actor,
                cause="lookup_response",
                detail={**call_detail(check.call), "job_id": check.job_id},
            ),
        ]
        await self._escalate(op, EscalationReason.CONTRACT_VIOLATION, detail, entries)

    async def _escalate(
        self, op: OperationRecord, reason: EscalationReason, detail: str, before: list[Entry]
    ) -> None:
        await self.ctx.escalate(op, reason, detail, before=before)
