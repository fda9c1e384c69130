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

from datetime import datetime
from typing import Any

from sqlalchemy.engine import Connection

from reconciler.core.chain import Entry
from reconciler.core.clock import isoformat
from reconciler.core.create import (
    RESEND_SAFE,
    Ambiguous,
    CreateDecision,
    FirstSend,
    NeedsEvidence,
    Rejected,
    Resend,
    Settling,
    Unsettled,
    create_observation,
    decide_create,
    given_back_until,
    may_have_sent,
    next_try_at,
    plan_create,
    resend_safe,
    retry_create,
    unsettled,
    unsettled_lookup,
    window_unsettled,
)
from reconciler.core.poll_values import Stop
from reconciler.core.provider_calls import CallResult, answer_words, call_detail
from reconciler.core.records import OperationRecord
from reconciler.core.states import State
from reconciler.core.vocabulary import DelaySource, EscalationReason, HistoryKind
from reconciler.engine.context import STORAGE_OUTAGE, StepContext
from reconciler.engine.flow import Prep
from reconciler.engine.steps.accept import accept_job
from reconciler.engine.steps.resend import resend_allowed
from reconciler.providers.adapter import CreateOutcome, LookupOutcome, LookupVerdict, Subject
from reconciler.providers.spec import IdempotencyMode, ProviderSpec
from reconciler.storage.history import notes_with_cause
from reconciler.storage.payloads import request_of


def settling_of(spec: ProviderSpec) -> Settling:
    """How the provider file lets a create that may have landed be settled."""
    return Settling(
        keyed=spec.create.idempotency is not IdempotencyMode.NONE,
        lookup=spec.lookup is not None,
    )


class CreateStep:
    def __init__(self, ctx: StepContext) -> None:
        self.ctx = ctx

    def prepare(self, conn: Connection, op: OperationRecord, now: datetime) -> Prep | None:
        """A first create's count and next try, inside the claim; with it, the request.

        Only a create that cannot have reached the provider yet (``plan_create``, the plan
        the step follows): one that may have is looked up first, by the step itself.
        """
        if plan_create(op, now, settling_of(self.ctx.spec(op))) != FirstSend():
            return None
        charged = self._reserve_in(conn, op, {"create_attempts": 1}, [], now)
        return Prep(charged, request_of(conn, op))

    def first_send(self, op: OperationRecord, now: datetime) -> dict[str, Any]:
        """What ``prepare`` writes on a new operation (its first create counted, the next
        try scheduled), as values its insert carries (``engine.create_start``)."""
        return self._reserved(op, {"create_attempts": 1}, now)

    async def __call__(self, op: OperationRecord, prep: Prep | None = None) -> None:
        ctx = self.ctx
        if prep is not None:
            await self._send(op, prepared=prep)
            return
        plan = plan_create(op, ctx.now(), settling_of(ctx.spec(op)))
        if isinstance(plan, Stop):
            await self._window_ended(op, plan)
            return
        if isinstance(plan, FirstSend | Resend):
            await self._send(op)
            return
        if isinstance(plan, NeedsEvidence):
            # No key: a resend may make a second job. Only a create that certainly made
            # none, or a person's decision, allows one; otherwise the lookup, if any, asks.
            allowed = await ctx.deps.db.run(resend_allowed, ctx.deps.db, op, ctx.actor)
            if allowed is not None:
                await self._send(op, [allowed])
                return
            if not plan.lookup:
                await self._create_unknown(op, Unsettled("the create may have made a job"), [])
                return
        op = await self._reserve(op, {"create_lookups": op.create_lookups + 1})
        found = await ctx.call(op, "lookup", lambda: ctx.adapter(op).lookup(Subject.of(op)))
        if found.verdict is LookupVerdict.FOUND and found.job_id:
            await accept_job(ctx, op, found.job_id, None, found.call, "lookup")
            return
        if found.call.denied:
            await self._denied(op, found.call)
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
        settling = settling_of(ctx.spec(op))
        outage = ctx.outage_note(op.created_at, op.create_deadline_at)
        notes: list[Entry] = [outage.entry] if outage is not None else []
        answered = False
        unsettled_by = ""
        if settling.lookup and may_have_sent(State(op.state), op.create_attempts):
            found = await ctx.call(op, "lookup", lambda: ctx.adapter(op).lookup(Subject.of(op)))
            if found.verdict is LookupVerdict.FOUND and found.job_id:
                await accept_job(ctx, op, found.job_id, None, found.call, "lookup", before=notes)
                return
            if found.call.denied:
                await self._denied(op, found.call)
                return
            answered = found.verdict is not LookupVerdict.UNKNOWN
            if not answered:
                unsettled_by = "; " + unsettled_lookup(found.call, found.job_id_problem)
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
            until = given_back_until(op, outage.started_at, ctx.now())
            if until is not None and not await ctx.deps.db.run(self._extended_before, op.id):
                await self._give_back(op, until, notes)
                return
        if window_unsettled(op, settling, answered=answered):
            why = f"{stop.detail}{unsettled_by}; the create may have made a job"
            await self._create_unknown(op, Unsettled(why), notes)
            return
        await self._escalate(op, stop.reason, stop.detail + unsettled_by, notes)

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
        changes = self._reserved(op, counts, now)
        return self.ctx.deps.journal.write(
            conn, op, now=now, lease=self.ctx.lease, changes=changes, entries=before
        )

    def _reserved(
        self, op: OperationRecord, counts: dict[str, int], now: datetime
    ) -> dict[str, Any]:
        ctx = self.ctx
        calls = op.create_attempts + op.create_lookups + 1
        retry_at = next_try_at(
            op.create_deadline_at, calls, now, ctx.deps.rng, ctx.backoff(ctx.spec(op))
        )
        return {
            **counts,
            "next_poll_at": retry_at,
            "delay_source": DelaySource.LOCAL_BACKOFF.value,
        }

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
            request = await ctx.deps.db.run(self._request, op)
        subject = Subject.of(op)
        outcome = await ctx.call(op, "create", lambda: ctx.adapter(op).create(request, subject))
        if outcome.duplicate:
            await self._duplicate(charged, outcome)
            return
        if outcome.job_id:
            if charged.create_attempts > 1 and ctx.spec(op).lookup is not None:
                # A resend answered: make sure the provider did not start a second job for
                # the same token (an unfamiliar job id is a contract violation:
                # docs/design.md#duplicate-answers).
                check = await ctx.call(op, "lookup", lambda: ctx.adapter(op).lookup(Subject.of(op)))
                if (
                    check.verdict is LookupVerdict.FOUND
                    and check.job_id
                    and check.job_id != outcome.job_id
                ):
                    await self._violation(charged, outcome, check)
                    return
            await accept_job(ctx, charged, outcome.job_id, outcome, outcome.call, "create")
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
        found = await ctx.call(op, "lookup", lambda: ctx.adapter(op).lookup(Subject.of(op)))
        if found.verdict is LookupVerdict.FOUND and found.job_id:
            await accept_job(ctx, op, found.job_id, None, found.call, "lookup")
            return
        if found.call.denied:
            await self._denied(op, found.call)
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

    async def _create_unknown(
        self, op: OperationRecord, unsettled: Unsettled, before: list[Entry]
    ) -> None:
        await self._escalate(op, EscalationReason.CREATE_UNKNOWN, unsettled.detail, before)

    def _request(self, op: OperationRecord) -> Any:
        """The create body as stored (read only here: it is the operation's largest part)."""
        with self.ctx.deps.db.read() as conn:
            return request_of(conn, op)

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
            observed = create_observation(call, None)
            decision = decide_create(
                op.create_deadline_at, calls, observed, now, ctx.deps.rng, backoff
            )
        detail = {
            **call_detail(call),
            "job_id_problem": outcome.job_id_problem if outcome else problem,
            "decision": type(decision).__name__.lower(),
        }
        settling = settling_of(ctx.spec(op))
        if resend_safe(call, settling, via_lookup=via == "lookup"):
            # Evidence for the next try: this attempt made no job, so one more is safe.
            detail[RESEND_SAFE] = op.create_attempts
        entry = Entry(
            kind=HistoryKind.OBSERVATION,
            actor=ctx.actor,
            cause=f"{via}_response",
            detail=detail,
        )
        # Without a key a create that may have made a job is the operator's call, also when
        # the window closes while a call is out: never a provider failure hiding a job.
        person = unsettled(decision, call, State(op.state), settling, via_lookup=via == "lookup")
        if person is not None:
            await self._create_unknown(op, person, [entry])
        elif isinstance(decision, Rejected):
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

    async def _denied(self, op: OperationRecord, call: CallResult) -> None:
        """The lookup was refused for this service's credential: looking again cures nothing."""
        said = answer_words(call)
        entry = Entry(
            kind=HistoryKind.OBSERVATION,
            actor=self.ctx.actor,
            cause="lookup_response",
            detail={**call_detail(call), "job_id": None, "decision": "denied"},
        )
        detail = f"the lookup was refused for this service's credential ({said})"
        await self._escalate(op, EscalationReason.AUTHORIZATION_DENIED, detail, [entry])

    async def _escalate(
        self, op: OperationRecord, reason: EscalationReason, detail: str, before: list[Entry]
    ) -> None:
        await self.ctx.escalate(op, reason, detail, before=before)
