"""What a step's last write may do besides the step's own changes: start the next, or let go.

Guarantee: fewer transactions, not fewer records. A worker's task runs one
operation through consecutive steps under one lease. The write that finishes a
step (``final``) is also the write that either prepares the next step (its
charge, reservation or start record: what that step would otherwise write in a
transaction of its own before it sends anything) or, when nothing is due,
gives the lease back, in the same transaction. Which one is decided by the
worker's own rules (``Flow.next_step``), so a task never prepares a step it
would not run: a second status read in one claim, a full share, the step limit.

A step due now in another share starts in the same write only if the task holds a
slot of that share already: it takes one before the step (the completion after a
result) or before the write (the callback after the hooks: ``Flow.reserve``).

A step due now in another share that was full when this step began (the
completion after a result, the callback after the hooks) gives the lease back in
the same write too, as the task would have done in a transaction of its own
right after it: the claim hands the operation to that share once it has room.
The snapshot may be stale either way, and both are safe: a share that filled
since leaves the task to give the lease back on its own, and one that emptied
costs the operation a claim instead of a move.

``Prep`` is a prepared step: the record as that write left it, and what the
step's ``prepare`` learned for it (the create request, the completion plan).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from sqlalchemy.engine import Connection

from reconciler.core.records import OperationRecord


@dataclass(frozen=True)
class Prep:
    """A step prepared in a write that committed: the record after it, and the step's data.

    ``final`` (set by a build that decides it inside its transaction): this write ends
    the step, as ``final=True`` on the write would say. ``next``: the next step, which
    this write started itself in its own statement (the callback after the hooks, in a
    share of its own: ``Flow.continues``); the flow takes it as what it would have prepared.
    """

    op: OperationRecord
    data: Any = None
    final: bool = False
    next: Prep | None = None


class Preparer(Protocol):
    """A step that can do its first write inside another transaction."""

    def prepare(self, conn: Connection, op: OperationRecord, now: datetime) -> Prep | None: ...


@runtime_checkable
class Charges(Protocol):
    """A step whose first write is a count on its row and nothing else (``Flow.ahead``)."""

    def charge(self, op: OperationRecord, now: datetime) -> dict[str, Any] | None: ...


async def _no_slot() -> None:
    return None


@dataclass
class Flow:
    """One task's view of its operation between steps (set on the loop, used in writes)."""

    # Decides, inside a write, which step the worker would run next on ``after`` (None:
    # it would stop there). Reads only this task's state, never the loop's.
    next_step: Callable[[OperationRecord, datetime], Preparer | None]
    release: Callable[[Connection, str], None]
    # Inside a write: False when ``after``'s next step belongs to a share this task
    # cannot move into (full when the step began); the lease then goes back in the write.
    keeps: Callable[[OperationRecord], bool] = lambda _after: True
    # On the loop, before a write that may hand the operation to share ``lane`` (a
    # completion step's record, when the next step runs elsewhere): hold a slot of it,
    # so that the write can start the step there instead of a transaction of its own.
    reserve: Callable[[str], Awaitable[None]] = lambda _lane: _no_slot()
    # On the loop, once a step's last call to a party is over (the callback's delivery):
    # the slot the call held in ``op``'s share goes back before the write that records
    # it, so the claim can start the next call there while this one commits. The share
    # bounds calls to the party, and none is in flight any more.
    lend: Callable[[OperationRecord], None] = lambda _op: None
    # What the task's writes left: the latest record, a prepared next step, the lease given up.
    last: OperationRecord | None = None
    changed: bool = False
    prepared: Prep | None = None
    released: bool = False

    def begin_step(self) -> None:
        self.changed = False
        self.prepared = None
        self.released = False

    def after_write(
        self, conn: Connection, after: OperationRecord, now: datetime, final: bool
    ) -> tuple[Prep | None, bool]:
        """Inside the write's transaction: prepare the next step, or release, or neither.

        Returns (the prepared next step, whether the lease was given back); nothing on the
        task changes until ``wrote`` (the transaction may still roll back and be retried).
        """
        if not final:
            return None, False
        if after.next_poll_at is None or after.next_poll_at > now or not self.keeps(after):
            # Nothing due here: the lease goes back with the step's own changes.
            self.release(conn, after.id)
            return None, True
        step = self.next_step(after, now)
        return (step.prepare(conn, after, now) if step is not None else None), False

    def ahead(self, after: OperationRecord, now: datetime) -> dict[str, Any] | None:
        """Inside a write, before it: the changes the next step's first write would make on
        ``after`` when they are all it writes (a count before a send: ``Charges``), so the
        write can make them itself and hand the flow the step prepared (``Prep.next``)."""
        if not self.continues(after, now):
            return None
        step = self.next_step(after, now)
        return step.charge(after, now) if isinstance(step, Charges) else None

    def continues(self, after: OperationRecord, now: datetime) -> bool:
        """Inside a write: whether ``after_write`` would prepare the next step on ``after``
        (nothing released, a step of a share this task holds or may move into)."""
        due = after.next_poll_at is not None and after.next_poll_at <= now
        return due and self.keeps(after) and self.next_step(after, now) is not None

    def wrote(self, after: OperationRecord, prep: Prep | None, released: bool) -> None:
        """On the loop, once the write committed."""
        self.last = prep.op if prep is not None else after
        self.changed = True
        self.prepared = prep
        self.released = self.released or released


flow_var: ContextVar[Flow | None] = ContextVar("reconciler_flow", default=None)


def lend_slot(op: OperationRecord) -> None:
    """A step's calls to its party are over: the task's slot for them goes back
    (``Flow.lend``; nothing outside a worker's task holds one)."""
    flow = flow_var.get()
    if flow is not None:
        flow.lend(op)
