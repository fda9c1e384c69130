"""The SQL text of the one write path (``storage.journal``), apart from the code that runs
it: each statement named (``fastsql.Sql``), the ones whose shape depends on the write
built once for each shape (``functools.cache``).

On PostgreSQL a write is one statement: the operation's row, its history and what
belongs with it (``also``: a completion step's record, a verdict, a part), joined as
CTEs; the history rows are appended only if the row was written, so a lost race writes
nothing and its row count says so. SQLite runs the plain statements one by one.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any

import sqlalchemy as sa

from reconciler.core.chain import HASHED_FIELDS
from reconciler.storage.fastsql import AS_IS, Sql, qualified
from reconciler.storage.notify import NOTIFY
from reconciler.storage.tables import HISTORY, OPS, OPS_COLUMNS, PAYLOAD_TABLE, TOMBSTONES

# Every hashed field is stored, then the two links of the chain.
HISTORY_COLUMNS = (*HASHED_FIELDS, "prev_hash", "hash")
INSERT_OPERATION = Sql(
    "operation-insert",
    OPS,
    f"INSERT INTO operations ({', '.join(OPS_COLUMNS)}) "
    f"VALUES ({', '.join(['?'] * len(OPS_COLUMNS))})",
    params=OPS_COLUMNS,
)
APPEND_HISTORY = Sql(
    "history-append",
    HISTORY,
    f"INSERT INTO history ({', '.join(HISTORY_COLUMNS)}) "
    f"VALUES ({', '.join(['?'] * len(HISTORY_COLUMNS))})",
    params=HISTORY_COLUMNS,
)
BATCH_CONTROL = ("version", "history_head", "history_seq", "updated_at")


@cache
def update(keys: tuple[str, ...], guarded: bool) -> Sql:
    """The journal's conditional UPDATE of ``keys``: version and state (and lease) guarded."""
    lease = " AND lease_owner = ? AND lease_expires_at > ?" if guarded else ""
    return Sql(
        "operation-write",
        OPS,
        f"UPDATE operations SET {', '.join(f'{k} = ?' for k in keys)} "
        f"WHERE id = ? AND version = ? AND state = ?{lease}",
        params=(
            *keys,
            "id",
            "version",
            "state",
            *(("lease_owner", "lease_expires_at") if guarded else ()),
        ),
    )


def _cast_type(column: sa.Column[Any]) -> str:
    """The PostgreSQL type a value of ``column`` is cast to, with no length: a cast to
    VARCHAR(n) would cut a longer value short where the INSERT refuses it."""
    kind = column.type
    if isinstance(kind, sa.TypeDecorator):
        kind = kind.impl_instance
    for family, name in (
        (sa.DateTime, "TIMESTAMP"),
        (sa.Boolean, "BOOLEAN"),
        (sa.Integer, "INTEGER"),
        (sa.Float, "DOUBLE PRECISION"),
        (sa.JSON, "JSON"),
    ):
        if isinstance(kind, family):
            return name
    return "TEXT"


_GUARD = ("id", "version", "state")


@cache
def update_rows(keys: tuple[str, ...], rows: int) -> Sql:
    """PostgreSQL: ``update`` (unguarded by lease) of ``rows`` rows at once, each with its
    own values, in one statement: a webhook batch is one round trip, not one a row. Each
    value is cast to its column's type (a VALUES list has none of its own); the row count
    is the rows that matched their version and state."""
    names = [*(f"set_{i}" for i in range(len(keys))), *(f"old_{c}" for c in _GUARD)]
    casts = [_cast_type(OPS.c[k]) for k in (*keys, *_GUARD)]
    one = "({})".format(", ".join(f"CAST(? AS {cast})" for cast in casts))
    sets = ", ".join(f"{k} = v.set_{i}" for i, k in enumerate(keys))
    guard = " AND ".join(f"operations.{c} = v.old_{c}" for c in _GUARD)
    return Sql(
        "operation-write-rows",
        OPS,
        f"UPDATE operations SET {sets} FROM (VALUES {', '.join([one] * rows)}) "
        f"AS v({', '.join(names)}) WHERE {guard}",
        params=(*keys, *_GUARD) * rows,
    )


# Each history value cast to its column's type: in a VALUES list that is not an INSERT's
# own, PostgreSQL would otherwise take an untyped parameter for text.
_TYPED_HISTORY_ROW = "({})".format(
    ", ".join(f"CAST(? AS {_cast_type(HISTORY.c[c])})" for c in HISTORY_COLUMNS)
)


def _with_history(
    name: str,
    head: Sql,
    also: tuple[Sql, ...],
    entries: int,
    checked: int = -1,
    noted: bool = False,
) -> Sql:
    """PostgreSQL: ``also``, then ``head`` (the operation's row), then ``entries`` history
    rows appended only if ``head`` touched the row, as one statement. Its row count is the
    rows appended (without entries, the rows ``head`` touched), so 0 means a lost race.
    The ``also`` statements run either way; a lost race rolls back what it ran in
    (``StaleWrite`` always undoes its write). ``checked``: the index of an ``also`` whose
    rows changed each returned row answers (``Checked``). ``noted`` (with entries): the
    notifications the write causes (``notify.NOTIFY``), sent only if it was made; counted,
    so that every one is run, as a transaction's tail does."""
    ctes = [
        f"also_{i} AS ({sql.text}{' RETURNING 1' if i == checked else ''})"
        for i, sql in enumerate(also)
    ]
    params = [qualified(sql, p, OPS) for sql in also for p in sql.params]
    answer = f" RETURNING (SELECT count(*) FROM also_{checked})" if checked >= 0 else ""
    if not entries:
        if noted:
            raise ValueError("a write without history sends its notifications at commit")
        return Sql(
            name, OPS, f"WITH {', '.join(ctes)} {head.text}{answer}", (*params, *head.params)
        )
    if noted:
        ctes.append(f"noted AS MATERIALIZED ({NOTIFY.text})")
        params += list(NOTIFY.params)
    ctes.append(f"touched AS ({head.text} RETURNING id)")
    return Sql(
        name,
        OPS,
        _appended(ctes, entries, noted) + answer,
        params=(*params, *head.params, *[f"history.{c}" for c in HISTORY_COLUMNS] * entries),
    )


def _appended(ctes: list[str], entries: int, noted: bool) -> str:
    """``ctes``, one of them ``touched`` (the operation's row written), then ``entries``
    history rows appended only if it wrote one; with ``noted``, only if the notifications
    CTE ran too (counted, so that every one of them is sent)."""
    columns = ", ".join(HISTORY_COLUMNS)
    sent = " AND (SELECT count(*) FROM noted) > 0" if noted else ""
    return (
        f"WITH {', '.join(ctes)} INSERT INTO history ({columns}) "
        f"SELECT * FROM (VALUES {', '.join([_TYPED_HISTORY_ROW] * entries)}) "
        f"AS entry ({columns}) WHERE EXISTS (SELECT 1 FROM touched){sent}"
    )


@cache
def update_and_append(
    keys: tuple[str, ...],
    guarded: bool,
    entries: int,
    also: tuple[Sql, ...],
    checked: int,
    noted: bool,
) -> Sql:
    """``update`` with its history and what comes ``also``, in one statement."""
    return _with_history(
        "operation-write-and-append", update(keys, guarded), also, entries, checked, noted
    )


@cache
def insert_and_append(also: tuple[Sql, ...], noted: bool) -> Sql:
    """A new operation's row, its first history entry and its parts, in one statement."""
    return _with_history("operation-insert-and-append", INSERT_OPERATION, also, 1, noted=noted)


@cache
def insert_if_key_free(parts: int, noted: bool) -> Sql:
    """PostgreSQL: a new operation's row unless its caller's idempotency key is taken (by a
    row, or by the tombstone of a pruned one), and only with it its parts, its first
    history entry and its notifications, in one statement. Its row count is the entries
    appended: 0 means the key was not free and nothing was written. Values are cast to
    their columns' types: a VALUES list that is not an INSERT's own has none.

    A row holding the key in the statement's snapshot also stops the insert: ``ON
    CONFLICT`` alone would wait for a prune deleting that row and, once it committed, find
    the key free, while the tombstone it wrote is newer than the snapshot. The lookup
    after then finds the row (prune not committed) or the tombstone."""
    columns = ", ".join(OPS_COLUMNS)
    row = ", ".join(f"CAST(? AS {_cast_type(OPS.c[c])})" for c in OPS_COLUMNS)
    value = _cast_type(PAYLOAD_TABLE.c.value)
    ctes = [
        f"touched AS (INSERT INTO operations ({columns}) SELECT * FROM (VALUES ({row})) "
        f"AS v({columns}) WHERE NOT EXISTS (SELECT 1 FROM {TOMBSTONES.name} "
        "WHERE caller = ? AND key_digest = ?) AND NOT EXISTS (SELECT 1 FROM operations "
        "WHERE caller = ? AND idempotency_key = ?) "
        "ON CONFLICT (caller, idempotency_key) DO NOTHING RETURNING id)",
        *(
            f"part_{i} AS (INSERT INTO operation_payloads (operation_id, name, value) "
            f"SELECT id, CAST(? AS TEXT), CAST(? AS {value}) FROM touched)"
            for i in range(parts)
        ),
    ]
    params = [*OPS_COLUMNS, "tombstones.caller", "tombstones.key_digest"]
    params += ["operations.caller", "operations.idempotency_key"]
    params += ["operation_payloads.name", "operation_payloads.value"] * parts
    if noted:
        # Only with the row: a key found taken commits nothing else, and must wake nobody.
        ctes.append(f"noted AS MATERIALIZED ({NOTIFY.text} WHERE EXISTS (SELECT 1 FROM touched))")
        params += list(NOTIFY.params)
    return Sql(
        "operation-insert-if-key-free",
        OPS,
        _appended(ctes, 1, noted),
        params=(*params, *[f"history.{c}" for c in HISTORY_COLUMNS]),
    )


@cache
def update_if(keys: tuple[str, ...], gate: Sql) -> Sql:
    """PostgreSQL: ``gate`` (a statement on another table that returns what it changed),
    and the lease-guarded ``update`` only if it changed something, in one statement;
    answers the gate's rows, each with whether the operation's row was written."""
    head = update(keys, True)
    return Sql(
        "operation-write-if",
        OPS,
        f"WITH gate AS ({gate.text}), touched AS ({head.text} "
        "AND EXISTS (SELECT 1 FROM gate) RETURNING id) "
        "SELECT gate.*, (SELECT count(*) FROM touched) FROM gate",
        params=(*(qualified(gate, p, OPS) for p in gate.params), *head.params),
        returns=(*(qualified(gate, r, OPS) for r in gate.returns), AS_IS),
    )


def history_row(row: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple(row[c] for c in HISTORY_COLUMNS)
