"""One status read, in the order of docs/design.md#read-order (``observing``, ``cancelling``).

Deadline and budget are checked before the request; the request is
charged and persisted before it is sent (a crash in between leaves an
unused reservation, never an invisible extra request); the response
metadata is persisted with the decision it led to. What is decided is decided in
``core`` (``core.poll.plan_read``, ``before_send``, ``decide_read``,
``core.next_read.after_answer``); this step sends the request and writes the decision.

Webhook trust: an ``observing`` read of an adaptive provider is decided with the
provider's stored trust state (read in the same transaction as the write), and the
read that confirms a terminal state records how the end was first learned of: a
webhook stored before the read was sent counts into the provider's health at once
(webhook-first), otherwise the completion waits out the grace (``engine.trust``).
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from datetime import datetime
from typing import Any

from sqlalchemy.engine import Connection

from reconciler.core import lapses
from reconciler.core import poll as decisions
from reconciler.core.chain import Entry
from reconciler.core.clock import isoformat
from reconciler.core.errors import StaleWrite
from reconciler.core.next_read import after_answer, hinted_since, retry_floor
from reconciler.core.poll_values import (
    Collect,
    Decision,
    Finish,
    Observation,
    PollPolicy,
    Stop,
    Wait,
)
from reconciler.core.provider_calls import call_detail
from reconciler.core.records import OperationRecord, with_changes
from reconciler.core.states import State
from reconciler.core.trust import Verdict, judge_read, settle_after
from reconciler.core.vocabulary import DelaySource, HistoryKind, RemoteCategory
from reconciler.engine.context import STORAGE_OUTAGE, StepContext
from reconciler.engine.flow import Flow, Prep, flow_var
from reconciler.providers.adapter import StatusOutcome, Subject
from reconciler.storage import trust as health
from reconciler.storage.history import notes_with_cause
from reconciler.storage.journal import Also, Checked

MAX_KEPT_STATUS_BYTES = 65_536
# States in which a status answer may still be applied after a concurrent write.
READ_STATES = frozenset({State.OBSERVING, State.CANCELLING, State.CANCEL_REQUESTED})
# The storage_outage note's mark of the one status read made after recovery.
RECOVERY_LOOK = "recovery_look"


def observation_of(outcome: StatusOutcome) -> Observation:
    call, view = outcome.call, outcome.view
    parse_error = call.parse_error
    if call.refused:
        parse_error = call.refused
    elif call.too_large:
        parse_error = "the response body is larger than the limit (http.max_response_bytes)"
    return Observation(
        at=call.sent_at,
        http_status=call.http_status,
        transport_error=call.transport_error,
        retry_after=call.retry_after,
        category=view.category if view else None,
        remote_state=view.remote_state if view else None,
        poll_after_seconds=view.poll_after if view else None,
        next_check_at=view.next_check_at if view else None,
        expires_at=view.expires_at if view else None,
        required_fields_ok=view.required_fields_ok if view else False,
        parse_error=parse_error,
        rate_limited=call.rate_limited,
        job_id=view.job_id if view else None,
        job_id_matches=view.job_id_matches if view else None,
        not_found=outcome.not_found,
        no_credential=call.refused if call.credential_refused else None,
        credential_problem=call.credential_problem,
    )


def _progress(value: Any) -> Any:
    return value if isinstance(value, dict | list | int | float) else None


class PollStep:
    def __init__(self, ctx: StepContext) -> None:
        self.ctx = ctx

    def _charge(self, conn: Connection, op: OperationRecord, now: datetime) -> OperationRecord:
        """The request is charged and persisted before it is sent."""
        return self.ctx.change_in(conn, op, now, status_requests_used=op.status_requests_used + 1)

    def prepare(self, conn: Connection, op: OperationRecord, now: datetime) -> Prep | None:
        """The charge, inside the transaction that hands the operation to this step.

        Only the ordinary read (``decisions.plan_read``, the plan the step follows): a read
        that would escalate, or the last look after a cancel window, is left to the step.
        """
        if decisions.plan_read(op, now) != decisions.Read():
            return None
        return Prep(self._charge(conn, op, now))

    async def __call__(self, op: OperationRecord, prep: Prep | None = None) -> None:
        ctx = self.ctx
        if prep is not None:
            await self._read(op, prep.op, None)
            return
        now = ctx.now()
        plan = decisions.plan_read(op, now)
        if isinstance(plan, decisions.NoRead):
            lapse = self._lapse(op, now) if plan.recoverable else None
            if lapse is not None:
                await self._recovery_look(op, lapse, now)
                return
            before = self._outage(op) if plan.cancel_window else []
            await ctx.escalate(op, plan.stop.reason, plan.stop.detail, before=before)
            return
        assert isinstance(plan, decisions.Read), plan  # a read needs the job id (NoJobId)
        charged = await ctx.write(op, lambda conn: self._charge(conn, op, now))
        await self._read(op, charged, decisions.LastLook() if plan.last_look else None)

    def _lapse(self, op: OperationRecord, now: datetime) -> lapses.Lapse | None:
        """Our own outage that covered this deadline, if any (``core.lapses.deadline_lapse``)."""
        deadline = op.deadline_at
        due = op.next_poll_at if op.next_poll_at is not None else deadline
        known = [
            lapses.Lapse(o.started_at, o.ended_at)
            for o in self.ctx.deps.db.availability.outages_between(min(due, deadline), now)
        ]
        return lapses.deadline_lapse(
            deadline,
            op.next_poll_at,
            now,
            known,
            slack_seconds=self.ctx.deps.settings.scheduler.catch_up_after_seconds,
        )

    async def _recovery_look(self, op: OperationRecord, lapse: lapses.Lapse, now: datetime) -> None:
        """One status read after our own outage covered the deadline, before any decision.

        The read is charged with the note that says why, in one transaction: a crash after
        it finds the note and escalates instead of reading again (one look, ever).
        """
        ctx = self.ctx
        note = _lapse_note(ctx.actor, op.deadline_at, lapse)
        stop = lapses.recovery_stop(op, lapse, now, looked_before=False)
        if stop is None and await ctx.deps.db.run(self._looked_before, op.id):
            stop = lapses.recovery_stop(op, lapse, now, looked_before=True)  # one look, ever
        if stop is not None:
            await ctx.escalate(op, stop.reason, stop.detail, before=[note])
            return
        looking = replace(note, detail={**(note.detail or {}), RECOVERY_LOOK: True})

        def charge(conn: Connection) -> OperationRecord:
            return ctx.deps.journal.write(
                conn,
                op,
                now=now,
                lease=ctx.lease,
                changes={"status_requests_used": op.status_requests_used + 1},
                entries=[looking],
            )

        charged = await ctx.write(op, charge)
        await self._read(op, charged, decisions.LastLook(lapse))

    def _looked_before(self, op_id: str) -> bool:
        with self.ctx.deps.db.read() as conn:
            notes = notes_with_cause(conn, op_id, STORAGE_OUTAGE)
        return any(n.get(RECOVERY_LOOK) for n in notes)

    async def _read(
        self, op: OperationRecord, charged: OperationRecord, look: decisions.LastLook | None
    ) -> None:
        """Send the charged status request and write what its answer means."""
        ctx = self.ctx
        assert charged.remote_job_id is not None
        withheld: list[Stop] = []

        async def send() -> StatusOutcome | None:
            # Persisting the charge and waiting for a free provider slot take time: the
            # deadline is checked again just before transmission (an unused reservation).
            stop = decisions.before_send(charged, ctx.now(), look)
            if stop is not None:
                withheld.append(stop)
                return None
            return await ctx.adapter(op).status(Subject.of(charged))

        outcome = await ctx.call(op, "status", send)
        if outcome is None:
            await ctx.escalate(charged, withheld[0].reason, withheld[0].detail)
            return
        # A hint, a cancel or a decision may be written while we ask: the answer is still a
        # fact, so it is decided and applied on the fresh record rather than lost.
        tracing = ctx.deps.tracing
        seen: dict[str, Any] | None = {} if tracing.enabled else None
        flow = flow_var.get()  # read here: the write runs on a writer thread
        with contextlib.suppress(StaleWrite):
            # Lost every race, or the lease: the next claim reads afresh and decides again.
            await ctx.apply(
                charged,
                lambda conn, fresh: self._apply(conn, fresh, outcome, look, seen, flow),
                final=True,
            )
        if seen:
            tracing.note(**seen)

    def _outage(self, op: OperationRecord) -> list[Entry]:
        """Our own database's outage during the cancel window, recorded as ours."""
        if op.cancel_requested_at is None or op.cancel_deadline_at is None:
            return []
        note = self.ctx.outage_note(op.cancel_requested_at, op.cancel_deadline_at)
        return [note.entry] if note is not None else []

    def _apply(
        self,
        conn: Connection,
        op: OperationRecord,
        outcome: StatusOutcome,
        look: decisions.LastLook | None = None,
        seen: dict[str, Any] | None = None,
        flow: Flow | None = None,
    ) -> OperationRecord | Prep:
        """Write what the answer means for the row as it is now (``decisions.decide_read``;
        ``seen``, when given, is told the decision and the next wait's source: the status
        read's span). ``look``: the last look after the cancel window or our own outage.
        ``flow``: the task's, whose next step (the fetch) may be counted in this write."""
        if State(op.state) not in READ_STATES:
            return op  # moved on meanwhile (an operator's decision): the answer is moot
        ctx = self.ctx
        policy = ctx.poll_policy(ctx.spec(op))
        now = ctx.now()
        obs = observation_of(outcome)
        decision = decisions.decide_read(
            op,
            obs,
            now,
            ctx.deps.rng,
            policy,
            look=look,
            # Trust is read only for an answer whose wait it could stretch.
            trusted=decisions.may_stretch(obs, look)
            and self._trust_applies(op)
            and health.is_trusted(conn, op.provider),
        )
        changes, detail, delay_source = self._record(op, outcome, obs, decision, now, policy)
        if seen is not None:
            seen.update(decision=type(decision).__name__.lower(), next_delay_source=delay_source)
        lead = self._outage(op) if look is not None and look.lapse is None else []
        entry = Entry(
            kind=HistoryKind.OBSERVATION,
            actor=ctx.actor,
            cause="status_read",
            detail=detail,
            delay_source=delay_source,
        )
        journal = ctx.deps.journal
        if isinstance(decision, Wait):
            return journal.write(
                conn, op, now=now, changes=changes, entries=[entry], lease=ctx.lease
            )
        if isinstance(decision, Stop):
            return ctx.escalate_in(
                conn,
                op,
                decision.reason,
                decision.detail,
                before=[*lead, entry],
                changes=changes,
                transport_error=obs.transport_error,
            )
        # The evidence is stored before the move, the health counted last (see below).
        verdict, evidence = self._judge(conn, op, outcome, now)
        if isinstance(decision, Collect):
            body = outcome.call.body
            size = len(outcome.call.body_bytes or b"")
            changes.update(
                status_body=body if size <= MAX_KEPT_STATUS_BYTES else None,
                next_poll_at=now,
                delay_source=None,
                result_attempts=0,
            )
            moved = {**changes, "state": State.RESULT_COLLECTING.value}
            ahead = flow.ahead(with_changes(op, moved), now) if flow is not None else None
            changes.update(ahead or {})
            after = journal.transition(
                conn,
                op,
                State.RESULT_COLLECTING,
                actor=ctx.actor,
                cause="status_confirmed_done",
                now=now,
                detail={"remote_state": obs.remote_state},
                changes=changes,
                before=[*lead, entry],
                lease=ctx.lease,
                also=evidence,
            )
        else:
            after = self._finish(
                conn, op, decision, outcome.view, changes, [*lead, entry], now, evidence
            )
            ahead = None
        self._count(conn, op, verdict, now, evidence)
        # The fetch counted here is the next step's first write, made (``Flow.ahead``).
        return Prep(after, final=True, next=Prep(after)) if ahead else after

    def _trust_applies(self, op: OperationRecord) -> bool:
        """Trust is about how the provider announces its jobs' ends, so: observing reads only.

        A cancellation we asked for is watched on its own schedule and is not evidence.
        """
        if State(op.state) is not State.OBSERVING:
            return False
        return self.ctx.trust_policy(self.ctx.spec(op)).adaptive

    def _judge(
        self, conn: Connection, op: OperationRecord, outcome: StatusOutcome, now: datetime
    ) -> tuple[Verdict | None, tuple[Also | Checked, ...]]:
        """How this terminal state was first learned of, and its row (the evidence of the
        health), written with the move."""
        if not self._trust_applies(op):
            return None, ()
        policy = self.ctx.trust_policy(self.ctx.spec(op))
        asked = outcome.call.sent_at
        since = op.last_http_at or op.accepted_at or op.created_at
        hinted = op.hinted_at if judge_read(op.hinted_at, asked) is Verdict.WEBHOOK_FIRST else None
        if hinted is None:
            # The stored webhooks decide when the hint does not show one before the read.
            hinted = health.first_webhook_after(
                conn, op.provider, op.remote_job_id, since, until=asked
            )
        # Our own outage only excuses a read no webhook came before.
        outage = hinted is None and bool(
            self.ctx.deps.db.availability.outages_between(since, asked)
        )
        verdict = judge_read(None, asked, hinted, outage=outage)
        first = verdict is Verdict.WEBHOOK_FIRST
        row = health.verdict_row(
            op,
            verdict,
            asked_at=asked,
            seen_at=now,
            hinted_at=hinted if first else None,
            settle_after=settle_after(now, policy) if verdict is Verdict.PENDING else None,
        )
        if first:
            # A trusted provider's count rides with the move (``_count`` does the rest).
            return verdict, (row, Checked(health.trusted_increment(op.provider, 1, now)))
        return verdict, (row,)

    def _count(
        self,
        conn: Connection,
        op: OperationRecord,
        verdict: Verdict | None,
        now: datetime,
        evidence: tuple[Also | Checked, ...],
    ) -> None:
        """A webhook-first completion counts into the health now, the last write before commit.

        A trusted provider's was counted by the move's own statement (``_judge``); another's
        state may change with it, which the health's own rules decide here.
        A read that found the end first is judged once the grace is over (``engine.trust``):
        a webhook may still follow.
        """
        if verdict is not Verdict.WEBHOOK_FIRST:
            return
        tried = next((b for b in evidence if isinstance(b, Checked)), None)
        if tried is not None and tried.changed:
            return
        health.count_completions(
            conn,
            op.provider,
            [(Verdict.WEBHOOK_FIRST, op.id)],
            now,
            self.ctx.trust_policy(self.ctx.spec(op)),
            increment_tried=tried is not None,
        )

    def _record(
        self,
        op: OperationRecord,
        outcome: StatusOutcome,
        obs: Observation,
        decision: Decision,
        now: datetime,
        policy: PollPolicy,
    ) -> tuple[dict[str, Any], dict[str, Any], DelaySource | None]:
        """The row changes and the observation's detail for one status answer."""
        view = outcome.view
        changes: dict[str, Any] = {
            "last_http_status": outcome.call.http_status,
            "last_http_at": outcome.call.sent_at,
            "last_provider_request_id": outcome.call.provider_request_id,
            "retry_not_before": retry_floor(obs.retry_after, now),
        }
        detail: dict[str, Any] = {**call_detail(outcome.call)}
        if view is not None:
            changes["remote_state"] = view.remote_state
            if view.progress is not None:
                changes["progress"] = _progress(view.progress)
            detail.update(remote_state=view.remote_state, category=view.category.value)
        counters = decision.counters
        if counters is not None:
            changes.update(
                transport_failures_used=counters.transport_failures_used,
                rate_limited_count=counters.rate_limited_count,
                poll_attempt=counters.poll_attempt,
            )
            if counters.hint_consumed and not hinted_since(op, obs.at):
                changes["hinted_at"] = None
        if not isinstance(decision, Wait):
            detail["decision"] = type(decision).__name__.lower()
            return changes, detail, None
        nxt = after_answer(op, decision, obs, now, policy)
        changes.update(
            next_poll_at=nxt.at,
            delay_source=nxt.source.value,
            poll_after_seconds=(nxt.at - now).total_seconds(),
            hint_not_before=nxt.hint_not_before,
        )
        detail.update(decision="wait", next_poll_at=isoformat(nxt.at))
        if decision.final_look:
            detail["final_look"] = True
        if decision.notes:
            detail["notes"] = list(decision.notes)
        return changes, detail, nxt.source

    def _finish(
        self,
        conn: Connection,
        op: OperationRecord,
        decision: Finish,
        view: Any,
        changes: dict[str, Any],
        evidence: list[Entry],
        now: datetime,
        also: tuple[Also | Checked, ...],
    ) -> OperationRecord:
        ctx = self.ctx
        provider_error = getattr(view, "error", None)
        if decision.category is RemoteCategory.CANCELLED:
            target = State.CANCELLED
        else:
            target = State.FAILED
            code = "expired" if decision.category is RemoteCategory.EXPIRED else "provider_failed"
            changes["error"] = {
                "code": code,
                "remote_state": getattr(view, "remote_state", None),
                "provider_error": provider_error,
            }
        return ctx.deps.journal.transition(
            conn,
            op,
            target,
            actor=ctx.actor,
            cause="status_confirmed_end",
            now=now,
            detail={"remote_state": getattr(view, "remote_state", None)},
            changes=changes,
            before=evidence,
            lease=ctx.lease,
            also=also,
        )


def _lapse_note(actor: str, deadline: datetime, lapse: lapses.Lapse) -> Entry:
    """The history note that says the deadline passed while this service could not look."""
    return Entry(
        kind=HistoryKind.NOTE,
        actor=actor,
        cause=STORAGE_OUTAGE,
        detail={
            "from": isoformat(lapse.started_at),
            "to": isoformat(lapse.ended_at),
            "seconds": round((lapse.ended_at - lapse.started_at).total_seconds(), 3),
            "deadline_at": isoformat(deadline),
            "inferred": lapse.inferred,
            "meaning": "the deadline passed while this service could not look (its database "
            "was unavailable or it was not running); not the provider's doing",
        },
    )
