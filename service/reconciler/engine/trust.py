"""Keeping webhook trust: judge completions once their grace is over, withdraw stretched waits.

Guarantee: an outage is caught at the first miss and no operation stays on a stretched
schedule its provider's health no longer justifies. Both halves are driven by what
the database holds, so any replica may run them, a crash between them loses nothing,
and running them again is harmless:

* ``settle``: pending completions whose grace is over are judged ``late`` (a verified
  webhook for the job was stored after the read, within the grace) or ``miss``, and
  counted into the provider's health in the same transaction (the miss may distrust
  the provider);
* ``restore``: operations of a provider that is not trusted (or whose trust is now
  "off") still waiting on a stretched schedule get their normal one back, spread over a
  window so that at most ``provider_concurrency`` reads a second come due (never a
  burst), each with a history entry saying why.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy.engine import Connection

from reconciler.core.chain import Entry
from reconciler.core.clock import isoformat
from reconciler.core.errors import StorageUnavailable
from reconciler.core.next_read import restore
from reconciler.core.poll_values import record_of
from reconciler.core.records import OperationRecord
from reconciler.core.story import SOURCE_WORDS, clock_text
from reconciler.core.trust import Change, Health, TrustPolicy, TrustState, Verdict, settle, spread
from reconciler.core.vocabulary import HistoryKind
from reconciler.engine.context import StepContext
from reconciler.logs import OutageLog
from reconciler.storage import trust as store
from reconciler.storage.availability import explain
from reconciler.storage.database import retry_stale
from reconciler.storage.history import last_read_before

log = logging.getLogger("reconciler.engine.trust")

SETTLE_BATCH = 500  # pending completions judged per transaction
RESTORE_BATCH = 1000  # stretched operations brought back per provider and transaction
ACTOR = "reconciler:webhook-trust"


@dataclass
class Sweep:
    """What one sweep did."""

    judged: dict[Verdict, int] = field(default_factory=lambda: defaultdict(int))
    changes: list[tuple[str, Change]] = field(default_factory=list)  # (provider, change)
    restored: int = 0
    earliest: datetime | None = None


class TrustKeeper:
    def __init__(self, ctx: StepContext) -> None:
        self.ctx = ctx
        self.deps = ctx.deps
        self._outage = OutageLog(log, "webhook trust sweeps", self.deps.clock.monotonic)

    def policy(self, provider: str) -> TrustPolicy:
        spec = self.deps.providers.get(provider)
        return spec.polling.trust() if spec is not None else TrustPolicy()

    async def sweep(self) -> Sweep:
        """Settle what is due, then bring back what trust no longer covers."""
        result = Sweep()
        db = self.deps.db
        try:
            await db.run_write(lambda: retry_stale(lambda: self._settle(result)))
            await db.run_write(lambda: retry_stale(lambda: self._restore(result)))
        except StorageUnavailable as exc:
            self._outage.failed("webhook trust sweep skipped: %s", explain(exc))
            return result
        self._outage.succeeded()
        for provider, change in result.changes:
            log.warning(
                "webhooks of provider %s: %s -> %s after a %s on %s",
                provider,
                change.before.value,
                change.after.value,
                change.verdict.value.replace("_", "-"),
                change.operation_id,
                extra={"provider": provider, "operation_id": change.operation_id},
            )
        if result.restored:
            self.deps.notifier.wake()
        return result

    # --- settle ------------------------------------------------------------------------------

    def _settle(self, result: Sweep) -> None:
        rt = self.deps
        now = rt.clock.now()
        with rt.db.read() as conn:
            if not store.any_due_pending(conn, now):
                return
        with rt.db.write() as conn:
            pending = store.due_pending(conn, now, SETTLE_BATCH)
            by_provider: dict[str, list[tuple[Verdict, str]]] = defaultdict(list)
            for item in pending:
                # Webhooks received since the previous read was answered: none was answered
                # by a read, whether stored before this read was judged or after.
                since = last_read_before(conn, item.operation_id, item.asked_at)
                webhook = store.first_webhook_after(
                    conn, item.provider, item.remote_job_id, since, until=item.settle_after
                )
                # A webhook due while our storage was down was refused by us, not lost.
                ours = rt.db.availability.outages_between(item.asked_at, item.settle_after)
                verdict = settle(item.asked_at, webhook, item.settle_after, outage=bool(ours))
                kept = webhook if verdict in (Verdict.LATE, Verdict.WEBHOOK_FIRST) else None
                store.judge(conn, item, verdict, kept, now)
                by_provider[item.provider].append((verdict, item.operation_id))
            changes: list[tuple[str, Change]] = []
            for provider, judged in sorted(by_provider.items()):
                found = store.count_completions(conn, provider, judged, now, self.policy(provider))
                changes.extend((provider, c) for c in found)
        # Only once committed: a retried transaction must not report twice.
        for _, judged in by_provider.items():
            for verdict, _ in judged:
                result.judged[verdict] += 1
        result.changes.extend(changes)

    # --- restore -----------------------------------------------------------------------------

    def _untrusted(self, healths: dict[str, Health]) -> list[str]:
        """Configured providers whose stretched waits, if any, trust no longer covers."""
        out = []
        for name, spec in self.deps.providers.items():
            trusted = healths.get(name, Health()).state is TrustState.TRUSTED
            if not (spec.polling.trust().adaptive and trusted):
                out.append(name)
        return out

    def _restore(self, result: Sweep) -> None:
        rt = self.deps
        with rt.db.read() as conn:
            providers = [
                p for p in self._untrusted(store.load_all(conn)) if store.has_stretched(conn, p)
            ]
        if not providers:
            return
        restored = 0
        earliest: datetime | None = None
        with rt.db.write() as conn:
            healths = store.load_all(conn)
            now = rt.clock.now()
            for provider in self._untrusted(healths):
                if provider not in providers:
                    continue
                items = self._restored(conn, provider, healths.get(provider, Health()), now)
                rt.journal.write_many(conn, items, now=now)
                restored += len(items)
                for _, changes, _ in items:
                    at = changes["next_poll_at"]
                    earliest = at if earliest is None else min(earliest, at)
        result.restored += restored
        result.earliest = earliest

    def _restored(
        self, conn: Connection, provider: str, health: Health, now: datetime
    ) -> list[tuple[OperationRecord, dict[str, Any], Sequence[Entry]]]:
        rt = self.deps
        spec = rt.providers[provider]
        ops = store.stretched_operations(conn, provider, RESTORE_BATCH)
        if not ops:
            return []
        policy = self.ctx.poll_policy(spec)
        slots = spread(
            len(ops),
            now,
            spec.polling.base_delay_seconds,
            rt.settings.scheduler.provider_concurrency,
            rt.rng,
        )
        why = _why(health, spec.polling.trust())
        items: list[tuple[OperationRecord, dict[str, Any], Sequence[Entry]]] = []
        for op, slot in zip(ops, slots, strict=True):
            back = restore(
                record_of(op),
                op.last_http_at or op.accepted_at or now,
                op.next_poll_at or now,
                op.hint_not_before,
                op.retry_not_before,
                slot,
                now,
                rt.rng,
                policy,
            )
            words = SOURCE_WORDS.get(back.source.value, back.source.value)
            note = f"{why}; next poll {clock_text(back.at)} from {words}"
            detail: dict[str, Any] = {
                "note": note,
                "trust_state": health.state.value,
                "next_poll_at": isoformat(back.at),
                "stretched_until": isoformat(op.next_poll_at),
            }
            if health.last_miss_operation:
                detail["miss_operation"] = health.last_miss_operation
            if back.final_look:
                detail["final_look"] = True
            changes = {
                "next_poll_at": back.at,
                "delay_source": back.source.value,
                "poll_after_seconds": max(0.0, (back.at - now).total_seconds()),
                "hint_not_before": None,
            }
            entry = Entry(
                kind=HistoryKind.NOTE,
                actor=ACTOR,
                cause="webhook_trust_withdrawn",
                detail=detail,
                delay_source=back.source,
            )
            items.append((op, changes, [entry]))
        return items


def _why(health: Health, policy: TrustPolicy) -> str:
    if not policy.adaptive:
        return "webhook trust is off for this provider"
    if health.state is TrustState.DISTRUSTED:
        if health.last_miss_operation:
            return f"webhooks distrusted after a miss on {health.last_miss_operation}"
        return "webhooks distrusted"
    return f"webhooks not trusted ({health.state.value})"
