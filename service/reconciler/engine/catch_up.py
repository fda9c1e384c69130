"""Rescheduling status reads that fell due together, inside the claim's transaction.

Guarantee: a late wake never bursts. When a provider has status reads overdue
by more than ``scheduler.catch_up_after_seconds`` (the service was stopped or
paused, or its database was down), all its due reads are spread out
(``core.catch_up``) instead of being claimed at once, each with a history
note; a read spread once is not spread again.

A read a webhook brought forward is neither spread nor a reason to spread: it is due
because the provider just spoke, not because a schedule was missed, and a burst of
completions the service is still working through (its provider share full, the reads
queued a few seconds) would otherwise wait out their whole polling cadence (two
minutes) behind the webhook that announced them.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from datetime import datetime, timedelta

from sqlalchemy.engine import Connection

from reconciler.core.catch_up import Overdue, spread
from reconciler.core.chain import Entry
from reconciler.core.clock import isoformat
from reconciler.core.errors import StaleWrite
from reconciler.core.poll_values import record_of
from reconciler.core.records import OperationRecord
from reconciler.core.vocabulary import DelaySource, HistoryKind
from reconciler.engine.deps import EngineDeps
from reconciler.storage import leases

# At most this many due reads are looked at per claim (the rest wait for the next tick).
SCAN_LIMIT = 2000
# Reads spread once already, and reads a webhook hint brought forward (see above).
NOT_SPREAD = (DelaySource.CATCH_UP.value, DelaySource.WEBHOOK_HINT.value)


def _overdue(op: OperationRecord, default_interval: float) -> Overdue:
    assert op.next_poll_at is not None
    return Overdue(
        operation_id=op.id,
        due_at=op.next_poll_at,
        interval_seconds=op.poll_after_seconds or default_interval,
        deadline_at=record_of(op).deadline_at,
        not_before=op.retry_not_before,
    )


def overdue_after(rt: EngineDeps) -> timedelta:
    return timedelta(seconds=rt.settings.scheduler.catch_up_after_seconds)


def spread_overdue(conn: Connection, rt: EngineDeps, now: datetime, actor: str) -> int:
    """Spread the due reads of every provider that has one long overdue; returns how many.
    The claim calls it when ``core.catch_up.probe_due`` says so."""
    late_by = overdue_after(rt)
    if not leases.any_status_read_due_before(conn, now, now - late_by, NOT_SPREAD):
        return 0  # nothing long overdue (the usual case): no reason to look at every due read
    by_provider: dict[str, list[OperationRecord]] = defaultdict(list)
    for op in leases.due_status_reads(conn, now, NOT_SPREAD, SCAN_LIMIT):
        by_provider[op.provider].append(op)
    moved = 0
    for provider, ops in by_provider.items():
        spec = rt.providers.get(provider)
        if spec is None or not any(now - o.next_poll_at > late_by for o in ops if o.next_poll_at):
            continue
        # Past its deadline a read is not spread: the claim checks the deadline at once.
        live = {o.id: o for o in ops if record_of(o).deadline_at > now}
        default = spec.polling.max_delay_seconds
        slots = spread(
            [_overdue(o, default) for o in live.values()],
            now,
            rt.rng,
            max_rate=float(rt.settings.scheduler.provider_concurrency),
        )
        for slot in slots:
            op = live[slot.operation_id]
            note = Entry(
                kind=HistoryKind.NOTE,
                actor=actor,
                cause="catch_up",
                detail={
                    "was_due_at": isoformat(op.next_poll_at) if op.next_poll_at else None,
                    "next_poll_at": isoformat(slot.at),
                    "overdue_reads": len(slots),
                    "window_seconds": round(slot.window_seconds, 3),
                },
                delay_source=DelaySource.CATCH_UP,
            )
            changes = {"next_poll_at": slot.at, "delay_source": DelaySource.CATCH_UP.value}
            with contextlib.suppress(StaleWrite):  # changed meanwhile: its writer decided
                rt.journal.write(conn, op, now=now, changes=changes, entries=[note])
                moved += 1
    return moved
