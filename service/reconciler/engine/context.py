"""What every step shares: the runtime, the lease, bounded provider calls and guarded writes.

Guarantee: one owner per operation. Every write a step makes goes through
``apply``: it reads the row afresh inside the transaction, refuses to write
without the lease, and decides again on the fresh row after a lost race.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy.engine import Connection

from reconciler.core.backoff import BackoffPolicy
from reconciler.core.poll import PollPolicy
from reconciler.core.states import END_STATES, State
from reconciler.core.trust import TrustPolicy
from reconciler.core.vocabulary import EscalationReason, TransportError
from reconciler.errors import StaleWrite
from reconciler.metrics import status_label
from reconciler.providers.adapter import CallResult, ProviderAdapter
from reconciler.providers.spec import ProviderSpec
from reconciler.runtime import Runtime
from reconciler.storage import operations as store
from reconciler.storage.escalations import escalate, open_escalation
from reconciler.storage.journal import Entry, Lease, retry_stale
from reconciler.storage.models import Operation

T = TypeVar("T")
# The final look before a deadline (webhook trust) comes this long before it: at least a
# second, so a tick that wakes a little late still sends it in time; at most one normal
# maximum delay.
FINAL_LOOK_MIN_SECONDS = 1.0
# A step's write after a provider call is retried a few times on a lost race (another
# writer was first on the same row: an agent's cancel, a webhook hint, an operator).
APPLY_ATTEMPTS = 3


def _final_look_seconds(spec: ProviderSpec) -> float:
    polling = spec.polling
    return min(polling.max_delay_seconds, max(polling.base_delay_seconds, FINAL_LOOK_MIN_SECONDS))


@dataclass
class StepContext:
    runtime: Runtime
    _limits: dict[str, asyncio.Semaphore] = field(default_factory=dict)

    @property
    def lease(self) -> Lease:
        return Lease(self.runtime.worker_id)

    @property
    def actor(self) -> str:
        return f"worker:{self.runtime.worker_id}"

    def now(self) -> datetime:
        return self.runtime.clock.now()

    def holds_lease(self, op: Operation) -> bool:
        expires = op.lease_expires_at
        return (
            op.lease_owner == self.runtime.worker_id
            and expires is not None
            and (expires > self.now())
        )

    async def reload(self, op_id: str) -> Operation | None:
        """The operation as stored now (the one way the engine reads a row)."""

        def load() -> Operation | None:
            with self.runtime.db.read() as conn:
                return store.get_operation(conn, op_id)

        return await self.runtime.db.run(load)

    def spec(self, op: Operation) -> ProviderSpec:
        return self.runtime.providers[op.provider]

    def adapter(self, op: Operation) -> ProviderAdapter:
        return self.runtime.adapter(op.provider)

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

    async def call(self, op: Operation, name: str, fn: Callable[[], Awaitable[T]]) -> T:
        """One provider call, bounded per provider so one slow provider cannot starve others."""
        limit = self._limits.get(op.provider)
        if limit is None:
            limit = self._limits[op.provider] = asyncio.Semaphore(
                self.runtime.settings.scheduler.provider_concurrency
            )
        async with limit:
            result = await fn()
        call = getattr(result, "call", result)
        if isinstance(call, CallResult):
            self.count_call(op, name, call)
        return result

    async def write(self, op: Operation, fn: Callable[[Connection], Operation]) -> Operation:
        """Run ``fn`` in one write transaction off the loop, then signal the change."""
        rt = self.runtime

        def run() -> Operation:
            with rt.db.write() as conn:
                return fn(conn)

        after = await rt.db.run(run)
        await self._changed(op, after)
        return after

    async def _changed(self, op: Operation, after: Operation) -> None:
        rt = self.runtime
        if after.state != op.state:
            rt.notifier.changed(op.id)
            if State(after.state) in END_STATES:
                rt.metrics.completions.labels(after.state).inc()
                rt.metrics.reads_per_operation.labels(after.provider).observe(
                    after.status_requests_used
                )
        if after.escalation_id != op.escalation_id and after.escalation_id is not None:
            rt.metrics.escalations.labels(await rt.db.run(self._reason, after)).inc()

    async def apply(
        self, op: Operation, build: Callable[[Connection, Operation], Operation]
    ) -> Operation:
        """Write what a provider call taught us onto the freshest row we still lease.

        While the call was in flight an agent's cancel, a webhook hint or an operator may
        have written the row; their writes stand, and ``build`` decides again on the row
        as it is now, so the provider's answer is recorded instead of being lost to the
        version guard. Losing the lease still stops the write.
        """
        rt = self.runtime

        def fresh() -> Operation:
            with rt.db.write() as conn:
                current = store.load_operation(conn, op.id)
                if not self.holds_lease(current):
                    raise StaleWrite(f"operation {op.id}: the lease was lost")
                return build(conn, current)

        after = await rt.db.run(lambda: retry_stale(fresh, APPLY_ATTEMPTS))
        await self._changed(op, after)
        return after

    def escalate_in(
        self,
        conn: Connection,
        op: Operation,
        reason: EscalationReason,
        detail: str,
        *,
        before: Sequence[Entry] = (),
        changes: Mapping[str, Any] | None = None,
        transport_error: TransportError | None = None,
    ) -> Operation:
        """Stop automatic work on ``op`` and ask a person, inside the caller's transaction."""
        return escalate(
            conn,
            self.runtime.journal,
            op,
            self.runtime.providers.get(op.provider),
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
        op: Operation,
        reason: EscalationReason,
        detail: str,
        *,
        before: Sequence[Entry] = (),
        changes: Mapping[str, Any] | None = None,
        transport_error: TransportError | None = None,
    ) -> Operation:
        """Stop automatic work on ``op`` and ask a person (on the fresh row, under the lease)."""
        return await self.apply(
            op,
            lambda conn, fresh: self.escalate_in(
                conn,
                fresh,
                reason,
                detail,
                before=before,
                changes=changes,
                transport_error=transport_error,
            ),
        )

    def _reason(self, op: Operation) -> str:
        with self.runtime.db.read() as conn:
            esc = open_escalation(conn, op)
        return esc.reason if esc is not None else "unknown"

    def count_call(self, op: Operation, call_name: str, call: CallResult) -> None:
        label = status_label(
            call.http_status, call.transport_error.value if call.transport_error else None
        )
        if call_name == "status":
            self.runtime.metrics.status_requests.labels(op.provider, label).inc()
        else:
            self.runtime.metrics.provider_calls.labels(op.provider, call_name, label).inc()
