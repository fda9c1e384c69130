"""What every step shares: its dependencies, the lease, bounded provider calls and guarded writes.

Guarantee: one owner per operation. Every write a step makes is conditional on
the lease and on the version it was decided on (``storage.journal``). ``apply``
first writes on the record the task holds (the one its own last write or the
claim left: no read), and after a lost race reads the row afresh inside the
transaction, refuses to write without the lease, and decides again on the fresh
row. A write marked ``final`` ends the step: the task's ``Flow`` then prepares
the next step or gives the lease back in the same transaction (``engine.flow``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy.engine import Connection

from reconciler.core.backoff import BackoffPolicy
from reconciler.core.chain import Entry
from reconciler.core.clock import isoformat
from reconciler.core.errors import StaleWrite, UnstorableAnswer
from reconciler.core.escalation import UNKNOWN_PROVIDER, ProviderTerms
from reconciler.core.poll_values import PollPolicy
from reconciler.core.provider_calls import CallResult, unstorable_in
from reconciler.core.records import OperationRecord
from reconciler.core.states import END_STATES, State
from reconciler.core.trust import TrustPolicy
from reconciler.core.vocabulary import EscalationReason, HistoryKind, TransportError
from reconciler.engine.deps import EngineDeps
from reconciler.engine.flow import Prep, flow_var
from reconciler.metrics import status_label
from reconciler.providers.adapter import ProviderAdapter
from reconciler.providers.spec import ProviderSpec
from reconciler.storage import operations as store
from reconciler.storage.escalations import escalate, open_escalation
from reconciler.storage.journal import Lease
from reconciler.tracing import SpanName

T = TypeVar("T")
# The final look before a deadline (webhook trust) comes this long before it: at least a
# second, so a tick that wakes a little late still sends it in time; at most one normal
# maximum delay.
FINAL_LOOK_MIN_SECONDS = 1.0

# The history note that says our own database, not the provider, took part of a window.
STORAGE_OUTAGE = "storage_outage"


@dataclass(frozen=True)
class OutageNote:
    """Our database's outages within a window, and the history entry that records them."""

    started_at: datetime
    ended_at: datetime
    seconds: float
    entry: Entry


# A step's write after a provider call is retried a few times on a lost race (another
# writer was first on the same row: an agent's cancel, a webhook hint, an operator).
APPLY_ATTEMPTS = 3


def _escalation_terms(spec: ProviderSpec | None) -> ProviderTerms:
    if spec is None:
        return UNKNOWN_PROVIDER
    return ProviderTerms(backoff=spec.polling.backoff(), can_cancel=spec.cancel is not None)


def _final_look_seconds(spec: ProviderSpec) -> float:
    polling = spec.polling
    return min(polling.max_delay_seconds, max(polling.base_delay_seconds, FINAL_LOOK_MIN_SECONDS))


@dataclass
class StepContext:
    deps: EngineDeps

    @property
    def lease(self) -> Lease:
        return Lease(self.deps.worker_id)

    @property
    def actor(self) -> str:
        return f"worker:{self.deps.worker_id}"

    def now(self) -> datetime:
        return self.deps.clock.now()

    def holds_lease(self, op: OperationRecord) -> bool:
        expires = op.lease_expires_at
        return (
            op.lease_owner == self.deps.worker_id and expires is not None and (expires > self.now())
        )

    async def reload(self, op_id: str) -> OperationRecord | None:
        """The operation as stored now (the one way the engine reads a row)."""

        def load() -> OperationRecord | None:
            with self.deps.db.read() as conn:
                return store.get_operation(conn, op_id)

        return await self.deps.db.run(load)

    def fresh(self, conn: Connection, op_id: str) -> OperationRecord:
        """The row as stored now, inside a write; ``StaleWrite`` once the lease is not ours."""
        found = store.load_records(conn, [op_id], lock=True)
        if not found:
            raise StaleWrite(f"operation {op_id} does not exist any more")
        current = found[0]
        if not self.holds_lease(current):
            raise StaleWrite(f"operation {op_id}: the lease was lost")
        return current

    def change_in(
        self, conn: Connection, op: OperationRecord, now: datetime, **changes: Any
    ) -> OperationRecord:
        """``changes`` on ``op`` under this step's lease, in ``conn``'s transaction: how a
        step records a request before sending it (a crash after the send never repeats it
        uncounted)."""
        return self.deps.journal.write(conn, op, now=now, lease=self.lease, changes=changes)

    def spec(self, op: OperationRecord) -> ProviderSpec:
        return self.deps.providers[op.provider]

    def adapter(self, op: OperationRecord) -> ProviderAdapter:
        return self.deps.adapter(op.provider)

    def backoff(self, spec: ProviderSpec) -> BackoffPolicy:
        return spec.polling.backoff()

    def poll_policy(self, spec: ProviderSpec) -> PollPolicy:
        polling = spec.polling
        trust = polling.trust()
        return PollPolicy(
            backoff=self.backoff(spec),
            max_rate_limited=polling.max_rate_limited,
            rate_limit_delay_seconds=polling.rate_limit_delay_seconds,
            not_found_grace_seconds=spec.status.not_found_grace_seconds,
            # webhook_trust = "off" keeps the schedule exactly as it was without trust.
            trusted_max_delay_seconds=trust.trusted_max_delay_seconds if trust.adaptive else None,
            final_look_seconds=_final_look_seconds(spec) if trust.adaptive else None,
        )

    def trust_policy(self, spec: ProviderSpec) -> TrustPolicy:
        return spec.polling.trust()

    async def call(self, op: OperationRecord, name: str, fn: Callable[[], Awaitable[T]]) -> T:
        """One provider call, counted. Its bound is the provider's share of the worker
        (``engine.shares``): the claim takes no more of a provider's operations than its
        share has slots, so a call never queues behind another provider's.

        Every answer a step receives passes here, and is checked before any of it is kept:
        text no database can store raises ``UnstorableAnswer`` (the worker escalates
        ``contract_violation``; docs/design.md#provider-text)."""
        result = await fn()
        call = getattr(result, "call", result)
        if isinstance(call, CallResult):
            self.count_call(op, name, call)
        refuse_unstorable(name, result, call)
        return result

    async def write(
        self,
        op: OperationRecord,
        fn: Callable[[Connection], OperationRecord],
        *,
        final: bool = False,
    ) -> OperationRecord:
        """Run ``fn`` in one write transaction off the loop, then signal the change.

        ``fn`` writes on ``op`` as the task holds it; a lost race raises ``StaleWrite``.
        """
        return (await self._commit(op, lambda conn, _: fn(conn), final, retry=False)).op

    async def apply(
        self,
        op: OperationRecord,
        build: Callable[[Connection, OperationRecord], OperationRecord | Prep],
        *,
        final: bool = False,
    ) -> OperationRecord:
        """Write what a provider call taught us onto the freshest row we still lease.

        While the call was in flight an agent's cancel, a webhook hint or an operator may
        have written the row; their writes stand, and ``build`` decides again on the row
        as it is now, so the provider's answer is recorded instead of being lost to the
        version guard. Losing the lease still stops the write.
        """
        return (await self._commit(op, build, final, retry=True)).op

    async def apply_plan(
        self,
        op: OperationRecord,
        build: Callable[[Connection, OperationRecord], Prep],
        *,
        final: bool = False,
    ) -> Prep:
        """``apply`` for a build that also answers what it learned (``Prep.data``)."""
        return await self._commit(op, build, final, retry=True)

    async def _commit(
        self,
        op: OperationRecord,
        build: Callable[[Connection, OperationRecord], OperationRecord | Prep],
        final: bool,
        *,
        retry: bool,
        ends_step: bool = True,
    ) -> Prep:
        """``ends_step``: a final write ends the step as done, so a count of its earlier
        failures (``core.step_retry``) is cleared in the same transaction; the write that
        records a failure is final without ending the step that way."""
        rt = self.deps
        flow = flow_var.get()
        tries = [0]

        def once(conn: Connection) -> tuple[Prep, Prep | None, bool]:
            tries[0] += 1
            # First on the record we hold (no read): the write's own guards say whether it
            # is still current. After a lost race, on the row as it is now.
            current = op if tries[0] == 1 else self.fresh(conn, op.id)
            built = build(conn, current)
            done = built if isinstance(built, Prep) else Prep(built)
            if ends_step and (final or done.final) and done.op.step_failures:
                cleared = self._clear_failures(conn, done.op)
                # A next step this write started holds its record: the cleared one now.
                ahead = replace(done.next, op=cleared) if done.next is not None else None
                done = replace(done, op=cleared, next=ahead)
            nxt, released = (done.next, False)
            if flow is not None and nxt is None:
                nxt, released = flow.after_write(conn, done.op, self.now(), final or done.final)
            return done, nxt, released

        attempts = APPLY_ATTEMPTS if retry else 1
        done, nxt, released = await rt.db.run_joined(once, attempts=attempts, key=op.id)
        if flow is not None:
            flow.wrote(done.op, nxt, released)
        await self._changed(op, nxt.op if nxt is not None else done.op)
        return done

    def _clear_failures(self, conn: Connection, op: OperationRecord) -> OperationRecord:
        changes = {"step_failures": 0, "failed_step": None}
        return self.deps.journal.write(conn, op, now=self.now(), lease=self.lease, changes=changes)

    async def record_failure(
        self, op: OperationRecord, build: Callable[[Connection, OperationRecord], OperationRecord]
    ) -> OperationRecord:
        """``apply`` for the write that records a step's failure: final (it decides when the
        step runs next), without clearing the count it writes."""
        return (await self._commit(op, build, True, retry=True, ends_step=False)).op

    async def _changed(self, op: OperationRecord, after: OperationRecord) -> None:
        rt = self.deps
        if after.state != op.state:
            # Local waiters get the record itself: they need not read it again.
            rt.notifier.changed(op.id, after)
            if State(after.state) in END_STATES:
                rt.metrics.completions.labels(after.state).inc()
                rt.metrics.reads_per_operation.labels(after.provider).observe(
                    after.status_requests_used
                )
        if after.escalation_id != op.escalation_id and after.escalation_id is not None:
            reason = await rt.db.run(self._reason, after)
            rt.metrics.escalations.labels(reason).inc()
            rt.tracing.mark(after, SpanName.ESCALATION, reason=reason, state=after.state)

    def outage_note(self, start: datetime, end: datetime, **detail: Any) -> OutageNote | None:
        """Record, as ours, any outage of our database that overlapped ``[start, end]``.

        A provider is never blamed for a window this process spent unable to write.
        """
        outages = self.deps.db.availability.outages_between(start, end)
        if not outages:
            return None
        first, last = outages[0], outages[-1]
        seconds = round(sum(o.seconds for o in outages), 3)
        entry = Entry(
            kind=HistoryKind.NOTE,
            actor=self.actor,
            cause=STORAGE_OUTAGE,
            detail={
                "from": isoformat(first.started_at),
                "to": isoformat(last.ended_at),
                "seconds": seconds,
                "failure": last.failure.value,
                "meaning": "this service's database was unavailable; not the provider's doing",
                **detail,
            },
        )
        return OutageNote(first.started_at, last.ended_at, seconds, entry)

    def escalate_in(
        self,
        conn: Connection,
        op: OperationRecord,
        reason: EscalationReason,
        detail: str,
        *,
        before: Sequence[Entry] = (),
        changes: Mapping[str, Any] | None = None,
        transport_error: TransportError | None = None,
    ) -> OperationRecord:
        """Stop automatic work on ``op`` and ask a person, inside the caller's transaction."""
        return escalate(
            conn,
            self.deps.journal,
            op,
            _escalation_terms(self.deps.providers.get(op.provider)),
            reason,
            detail,
            now=self.now(),
            actor=self.actor,
            lease=self.lease,
            before=before,
            changes=changes,
            transport_error=transport_error,
        )

    async def escalate(
        self,
        op: OperationRecord,
        reason: EscalationReason,
        detail: str,
        *,
        before: Sequence[Entry] = (),
        changes: Mapping[str, Any] | None = None,
        transport_error: TransportError | None = None,
    ) -> OperationRecord:
        """Stop automatic work on ``op`` and ask a person (on the fresh row, under the lease)."""
        return await self.apply(
            op,
            final=True,
            build=lambda conn, fresh: self.escalate_in(
                conn,
                fresh,
                reason,
                detail,
                before=before,
                changes=changes,
                transport_error=transport_error,
            ),
        )

    def _reason(self, op: OperationRecord) -> str:
        with self.deps.db.read() as conn:
            esc = open_escalation(conn, op)
        return esc.reason if esc is not None else "unknown"

    def count_call(self, op: OperationRecord, call_name: str, call: CallResult) -> None:
        label = status_label(
            call.http_status, call.transport_error.value if call.transport_error else None
        )
        if call_name == "status":
            self.deps.metrics.status_requests.labels(op.provider, label).inc()
        else:
            self.deps.metrics.provider_calls.labels(op.provider, call_name, label).inc()


def refuse_unstorable(name: str, answer: Any, call: Any) -> None:
    """Raise ``UnstorableAnswer`` when ``answer`` (what the ``name`` call brought back, or
    what was read out of it) holds text no database can store."""
    found = unstorable_in(answer)
    if found is not None:
        raise UnstorableAnswer(name, found.where, found.shown, call)
