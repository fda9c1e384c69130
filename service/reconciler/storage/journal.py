"""The one write path for an operation: conditional row update plus history append.

Every change to an operation row goes through ``Journal.write`` (or its
``transition`` wrapper) so that, in one transaction:

* the UPDATE matches the version (and, for workers, the lease) that the
  caller read — a racing writer finds zero rows and gets ``StaleWrite``;
* the history entries are appended with the hash chain continued from the
  head the caller read, and the row's head and count move with them.

A transition the table does not allow raises before anything is written.
The big parts (request, metadata, confirming status, result) are not row
columns: ``changes`` may name them and they are written to their own table
(``storage.payloads``), so the row's other writes never rewrite them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any, Protocol

from sqlalchemy.engine import Connection

from reconciler.core.chain import GENESIS, Entry, chained
from reconciler.core.errors import StaleWrite
from reconciler.core.records import PAYLOADS, OperationRecord, with_changes
from reconciler.core.states import END_STATES, State, check_transition
from reconciler.core.vocabulary import DelaySource, HistoryKind
from reconciler.storage import journal_sql as sql
from reconciler.storage import payloads
from reconciler.storage.after_commit import after_commit
from reconciler.storage.fastsql import MANY_ROWS, Bound
from reconciler.storage.notify import CHANGE_CHANNEL, notify_in_transaction, sending
from reconciler.storage.tables import OPS, OPS_COLUMNS

log = logging.getLogger("reconciler.storage.journal")


# A statement on another table that belongs to an operation's change and is written with
# it (``Journal.write(also=...)``): a completion step's record, a verdict, a part.
Also = Bound


@dataclass(eq=False)
class Checked:
    """An ``also`` whose writer needs to know whether it changed a row (a count kept only
    in one state, with another way when it is not): the write that ran it sets ``changed``."""

    bound: Bound
    changed: bool | None = None


@dataclass(frozen=True)
class Step:
    """A state an operation passes through on its way in one write (``transition(through=)``):
    its own history entry, checked against the state table like the move it leads to."""

    to: State
    cause: str
    detail: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Lease:
    owner: str


class RowHead(Protocol):
    """What a write needs of the row it changes: which row, the version and state it was
    read in, and the head of its history chain (the webhook batch reads only these)."""

    @property
    def id(self) -> str: ...
    @property
    def version(self) -> int: ...
    @property
    def state(self) -> str: ...
    @property
    def history_head(self) -> str: ...
    @property
    def history_seq(self) -> int: ...


def _stale(op: OperationRecord, lease: Lease | None) -> StaleWrite:
    return StaleWrite(
        f"operation {op.id} changed since version {op.version} was read"
        + (" or the lease was lost" if lease is not None else "")
    )


def _log_move(operation_id: str, move: Entry) -> None:
    frm, to = move.from_state, move.to_state
    assert frm is not None and to is not None
    log.info(
        "operation %s: %s -> %s (%s)",
        operation_id,
        frm.value,
        to.value,
        move.cause,
        extra={
            "operation_id": operation_id,
            "from_state": frm.value,
            "to_state": to.value,
            "actor": move.actor,
            "cause": move.cause,
        },
    )


_GATHERED = "reconciler_row_writes"


@contextmanager
def rows_together(conn: Connection) -> Iterator[None]:
    """PostgreSQL: the row-only writes made inside (no history, nothing with them: a claim's
    counts before its steps send) are sent together as it ends, one statement for each set
    of columns, instead of one each. For rows this transaction leased and holds locked, so
    the writes' lease guard is left out and their version guard kept: a row changed anyway
    raises ``StaleWrite`` for them all. Elsewhere, writes go out as they are made."""
    if conn.dialect.name != "postgresql":
        yield
        return
    gathered: dict[tuple[str, ...], list[tuple[Any, ...]]] = {}
    conn.info[_GATHERED] = gathered
    try:
        yield
    finally:
        conn.info.pop(_GATHERED, None)
    for keys, values in gathered.items():
        for start in range(0, len(values), MANY_ROWS):
            chunk = values[start : start + MANY_ROWS]
            flat = [v for row in chunk for v in row]
            if sql.update_rows(keys, len(chunk)).run(conn, *flat).rowcount != len(chunk):
                raise StaleWrite("an operation changed while its claim's counts were written")


@dataclass(frozen=True)
class _NewRow:
    """A new operation as it is stored: its record, row values, first entry and parts."""

    op: OperationRecord
    row: tuple[Any, ...]
    entry: tuple[Any, ...]
    parts: dict[str, Any]


@dataclass(frozen=True)
class _Write:
    """One ``Journal.write``, its values made: sent as one statement or as several."""

    op: OperationRecord
    lease: Lease | None
    keys: tuple[str, ...]
    params: list[Any]  # the UPDATE's values, its guards included
    rows: list[dict[str, Any]]  # history rows
    also: Sequence[Also | Checked]
    parts: Mapping[str, Any]

    def together(self, conn: Connection, checked: int, notify: Sequence[tuple[str, str]]) -> bool:
        """PostgreSQL, one statement; True when it sent ``notify`` itself."""
        bounds = (
            *(b.bound if isinstance(b, Checked) else b for b in self.also),
            *payloads.changes(self.op.id, self.parts),
        )
        noted = bool(notify and self.rows)
        statement = sql.update_and_append(
            self.keys,
            self.lease is not None,
            len(self.rows),
            tuple(b.sql for b in bounds),
            checked,
            noted,
        )
        before = [value for b in bounds for value in b.values]
        if noted:
            before += sending(notify).values
        values = [value for row in self.rows for value in sql.history_row(row)]
        cursor = statement.run(conn, *before, *self.params, *values)
        if cursor.rowcount != max(1, len(self.rows)):
            raise _stale(self.op, self.lease)
        tally = self.also[checked] if checked >= 0 else None
        if isinstance(tally, Checked):
            tally.changed = int(cursor.fetchone()[0]) > 0
        return noted

    def apart(self, conn: Connection) -> None:
        """A statement each (SQLite, or nothing to go with the row); sends no notification."""
        for bound in self.also:
            if isinstance(bound, Checked):
                bound.changed = bound.bound.run(conn).rowcount > 0
            else:
                bound.run(conn)
        if sql.update(self.keys, self.lease is not None).run(conn, *self.params).rowcount != 1:
            raise _stale(self.op, self.lease)
        if self.parts:
            payloads.store(conn, self.op.id, self.parts)
        sql.APPEND_HISTORY.many(conn, [sql.history_row(row) for row in self.rows])


@dataclass
class Journal:
    key: bytes | None = None
    # The lane a completion round starts in (``core.completion_lanes``); None: unset, which
    # the claim takes as the hooks lane.
    first_lane: Callable[[OperationRecord], str | None] | None = None
    # The rows of the completion round a move to an end state opens (``completion_steps.
    # made``), written with that move; None: the completion handler makes them itself.
    round_rows: Callable[[OperationRecord], Sequence[Also]] | None = None
    _columns: frozenset[str] = field(
        default_factory=lambda: frozenset(c.name for c in OPS.c) | frozenset(PAYLOADS)
    )

    def insert(
        self,
        conn: Connection,
        op: OperationRecord,
        *,
        actor: str,
        cause: str,
        now: datetime,
        detail: Mapping[str, Any] | None = None,
        notify: Sequence[tuple[str, str]] = (),
    ) -> OperationRecord:
        """Store a new operation with its first history entry (``-> create_pending``).
        ``notify``: ``(channel, payload)`` the new operation causes, sent if it commits."""
        new = self._first(op, actor, cause, now, detail)
        if conn.dialect.name == "postgresql":
            # One round trip for the row, its first entry, its parts and its notifications.
            written = payloads.changes(new.op.id, new.parts)
            statement = sql.insert_and_append(tuple(b.sql for b in written), bool(notify))
            sent = sending(notify).values if notify else ()
            statement.run(
                conn, *[v for b in written for v in b.values], *sent, *new.row, *new.entry
            )
        else:
            sql.INSERT_OPERATION.run(conn, *new.row)
            sql.APPEND_HISTORY.run(conn, *new.entry)
            payloads.store(conn, new.op.id, new.parts)
        self._created(conn, new.op)
        return new.op

    def insert_if_key_free(
        self,
        conn: Connection,
        op: OperationRecord,
        key_digest: str,
        *,
        actor: str,
        cause: str,
        now: datetime,
        detail: Mapping[str, Any] | None = None,
        notify: Sequence[tuple[str, str]] = (),
    ) -> OperationRecord | None:
        """PostgreSQL: ``insert`` only while ``op``'s idempotency key is free (no operation
        holds it, no tombstone of a pruned one: ``key_digest``); None when it is not, and
        then nothing was written. One statement where a lookup and an insert were two; a
        create that meets its key looks it up after (a retry, which is rarer)."""
        if conn.dialect.name != "postgresql":
            raise ValueError("an insert that checks its key in its statement is PostgreSQL's")
        new = self._first(op, actor, cause, now, detail)
        names = sorted(new.parts)
        statement = sql.insert_if_key_free(len(names), bool(notify))
        sent = sending(notify).values if notify else ()
        values = [v for name in names for v in (name, new.parts[name])]
        made = statement.run(
            conn,
            *new.row,
            new.op.caller,
            key_digest,
            new.op.caller,
            new.op.idempotency_key,
            *values,
            *sent,
            *new.entry,
        ).rowcount
        if made == 0:
            return None
        self._created(conn, new.op)
        return new.op

    def _first(
        self,
        op: OperationRecord,
        actor: str,
        cause: str,
        now: datetime,
        detail: Mapping[str, Any] | None,
    ) -> _NewRow:
        entry = Entry(HistoryKind.TRANSITION, actor, cause, detail, to_state=State(op.state))
        rows, head, seq = chained(op.id, GENESIS, 0, [entry], now, self.key)
        changes = {"history_seq": seq, "history_head": head, "version": 1}
        op = with_changes(op, {**changes, "created_at": now, "updated_at": now})
        return _NewRow(
            op=op,
            row=tuple(getattr(op, c) for c in OPS_COLUMNS),
            entry=sql.history_row(rows[0]),
            # A new operation has no parts to remove: only those it has are written.
            parts={name: value for name in PAYLOADS if (value := getattr(op, name)) is not None},
        )

    @staticmethod
    def _created(conn: Connection, op: OperationRecord) -> None:
        after_commit(
            conn,
            lambda: log.info(
                "operation %s created for provider %s",
                op.id,
                op.provider,
                extra={"operation_id": op.id, "provider": op.provider, "trace_id": op.trace_id},
            ),
        )

    def write(
        self,
        conn: Connection,
        op: OperationRecord,
        *,
        now: datetime,
        changes: Mapping[str, Any] | None = None,
        entries: Sequence[Entry] = (),
        lease: Lease | None = None,
        also: Sequence[Also | Checked] = (),
        notify: Sequence[tuple[str, str]] = (),
    ) -> OperationRecord:
        """Apply ``changes`` and append ``entries`` if ``op`` is still current; return it.

        ``also``: statements on other tables that belong to this change (a completion
        step's record), run first; on PostgreSQL inside the same statement. At most one
        of them ``Checked``, told whether it changed a row. ``notify``: ``(channel,
        payload)`` this change causes, sent if it commits (on PostgreSQL in its statement
        when it appends history, else with the transaction's tail). A row-only write inside
        ``rows_together`` goes out with the others there, when it ends."""
        changes = dict(changes or {})
        unknown = set(changes) - self._columns
        if unknown:
            raise ValueError(f"unknown operation columns: {sorted(unknown)}")
        rows, head, seq = chained(op.id, op.history_head, op.history_seq, entries, now, self.key)
        changes.update(version=op.version + 1, history_head=head, history_seq=seq, updated_at=now)
        columns, parts = payloads.split(changes)
        keys = tuple(sorted(columns))
        params = [columns[k] for k in keys]
        params += [op.id, op.version, op.state]
        if lease is not None:
            params += [lease.owner, now]
        checks = [i for i, b in enumerate(also) if isinstance(b, Checked)]
        if len(checks) > 1:
            raise ValueError("a write tells at most one statement whether it changed a row")
        gathered = conn.info.get(_GATHERED)
        if gathered is not None and not (rows or also or parts or notify):
            gathered.setdefault(keys, []).append(
                (*params[: len(keys)], op.id, op.version, op.state)
            )
            return with_changes(op, changes)
        write = _Write(op, lease, keys, params, rows, also, parts)
        if conn.dialect.name == "postgresql" and (rows or also or parts):
            # One round trip for the row, its history and what belongs with it.
            sent = write.together(conn, checks[0] if checks else -1, notify)
        else:
            write.apart(conn)
            sent = False
        if not sent:
            for channel, payload in notify:
                notify_in_transaction(conn, channel, payload)
        return with_changes(op, changes)

    def write_if(
        self,
        conn: Connection,
        op: OperationRecord,
        gate: Bound,
        *,
        now: datetime,
        lease: Lease,
        changes: Mapping[str, Any] | None = None,
    ) -> tuple[OperationRecord, Sequence[Any]] | None:
        """PostgreSQL: ``write`` of ``changes`` (row columns, no history) under ``lease``,
        made only if ``gate`` changes a row, in one statement with it: a step started where
        the round stands as expected. Returns the record after and the gate's answer row;
        None when the gate changed nothing (nor was anything written). A gate that changed
        a row of an operation not current any more raises ``StaleWrite``, which undoes it."""
        changes = dict(changes or {})
        changes.update(version=op.version + 1, updated_at=now)
        keys = tuple(sorted(changes))
        if set(keys) - self._columns or set(keys) & set(PAYLOADS):
            raise ValueError("write_if writes row columns only")
        params = [changes[k] for k in keys]
        params += [op.id, op.version, op.state, lease.owner, now]
        rows = sql.update_if(keys, gate.sql).rows(conn, *gate.values, *params)
        if not rows:
            return None
        *answer, touched = rows[0]
        if touched != 1:
            raise _stale(op, lease)
        return with_changes(op, changes), answer

    def write_many(
        self,
        conn: Connection,
        items: Sequence[tuple[RowHead, Mapping[str, Any], Sequence[Entry]]],
        *,
        now: datetime,
    ) -> None:
        """``write`` for many operations at once, all changing the same columns.

        One UPDATE for every row (PostgreSQL: one statement for all of them) and one INSERT
        for all their history, as plain driver statements (see ``fastsql``): this is the
        webhook batch's hot path. For
        callers that hold the rows locked; the version guard stays in the statement.
        """
        if not items:
            return
        keys = tuple(sorted(items[0][1]))
        updates: list[tuple[Any, ...]] = []
        history: list[tuple[Any, ...]] = []
        for op, changes, entries in items:
            if tuple(sorted(changes)) != keys or set(keys) & set(PAYLOADS):
                raise ValueError("write_many needs the same row columns changed for every row")
            rows, head, seq = chained(
                op.id, op.history_head, op.history_seq, entries, now, self.key
            )
            history.extend([sql.history_row(row) for row in rows])
            updates.append(
                (
                    *[changes[k] for k in keys],
                    op.version + 1,
                    head,
                    seq,
                    now,
                    op.id,
                    op.version,
                    op.state,
                )
            )
        columns = (*keys, *sql.BATCH_CONTROL)
        changed: int | None
        if conn.dialect.name == "postgresql":
            changed = 0
            for start in range(0, len(updates), MANY_ROWS):
                chunk = updates[start : start + MANY_ROWS]
                values = [v for row in chunk for v in row]
                changed += sql.update_rows(columns, len(chunk)).run(conn, *values).rowcount
        else:
            changed = sql.update(columns, False).many(conn, updates)
        if changed is not None and changed != len(items):
            raise StaleWrite("an operation changed while its webhook batch was written")
        sql.APPEND_HISTORY.many(conn, history)

    def transition(
        self,
        conn: Connection,
        op: OperationRecord,
        to: State,
        *,
        actor: str,
        cause: str,
        now: datetime,
        detail: Mapping[str, Any] | None = None,
        changes: Mapping[str, Any] | None = None,
        entries: Sequence[Entry] = (),
        lease: Lease | None = None,
        before: Sequence[Entry] = (),
        also: Sequence[Also | Checked] = (),
        through: Sequence[Step] = (),
    ) -> OperationRecord:
        """Move ``op`` to ``to`` with its evidence; raises ``IllegalTransition`` before writing.

        ``before`` entries (the observation that caused the move) precede the transition in
        the history; ``entries`` follow it; ``also`` as for ``write``. ``through``: states
        passed on the way, each recorded as a move of its own, in the same write (the
        accepted job that is watched at once: one statement, not one per move).
        """
        start = State(op.state)
        frm = start
        passed: list[Entry] = []
        for step in through:
            check_transition(frm, step.to)
            if step.to in END_STATES:
                raise ValueError("an end state is where a move ends, not a state it passes")
            passed.append(
                Entry(
                    kind=HistoryKind.TRANSITION,
                    actor=actor,
                    cause=step.cause,
                    detail=step.detail,
                    from_state=frm,
                    to_state=step.to,
                )
            )
            frm = step.to
        check_transition(frm, to)
        all_changes: dict[str, Any] = {"state": to.value}
        if to in END_STATES:
            # Reaching an end state always hands the operation to the completion handler.
            all_changes.update(
                done_at=now,
                completion_round=op.completion_round + 1,
                completion_pending=True,
                completion_lane=self.first_lane(op) if self.first_lane is not None else None,
                next_poll_at=now,
                delay_source=None,
            )
        elif start in END_STATES:
            all_changes["done_at"] = None
        all_changes.update(changes or {})
        if to in END_STATES and self.round_rows is not None:
            also = (*also, *self.round_rows(with_changes(op, all_changes)))
        entry = Entry(
            kind=HistoryKind.TRANSITION,
            actor=actor,
            cause=cause,
            detail=detail,
            from_state=frm,
            to_state=to,
            delay_source=DelaySource(ds) if (ds := all_changes.get("delay_source")) else None,
        )
        after = self.write(
            conn,
            op,
            now=now,
            changes=all_changes,
            entries=[*before, *passed, entry, *entries],
            lease=lease,
            also=also,
            # Waiters on other replicas learn of the change when (and only if) it commits.
            notify=[(CHANGE_CHANNEL, op.id)],
        )
        # Said once the move is committed: a rolled-back move is no move.
        for moved in (*passed, entry):
            after_commit(conn, partial(_log_move, op.id, moved))
        return after
