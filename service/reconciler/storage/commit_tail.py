"""Writes a transaction saves for its end, sent together just before it commits.

A shared transaction carries many steps' writes, and some of them end in the same small
statement each (a lease given back, a notification to the other replicas). On
PostgreSQL every statement is a round trip, so such writes are gathered on the
connection and sent once, as the transaction's last statements (``Database.write``):
one per kind, whatever the number of steps. A savepoint rolled back takes back what was
gathered inside it, as the database would have undone the statements themselves.

Each kind registers its sender (``sends``), which makes the statements that write
everything gathered of that kind; kinds are sent in the order they registered, and
when there are several statements they go as one (each a CTE of it: a lease given back
and a notification, one round trip). Nothing here runs on SQLite, whose statements
cost no round trip: callers write there at once.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from functools import cache
from typing import Any

from sqlalchemy.engine import Connection

from reconciler.storage.fastsql import Bound, Sql, qualified

_KEY = "reconciler_commit_tail"

Sender = Callable[[list[Any]], list[Bound]]
_senders: dict[str, Sender] = {}


def sends(kind: str, sender: Sender) -> None:
    """Register how the gathered items of ``kind`` are written (once, at import)."""
    _senders[kind] = sender


def gather(conn: Connection, kind: str, item: Hashable) -> None:
    """Save ``item`` for the end of this transaction (an item gathered twice is sent once)."""
    conn.info.setdefault(_KEY, {})[(kind, item)] = None


def begin(conn: Connection) -> None:
    """A write transaction begins: nothing is gathered."""
    conn.info.pop(_KEY, None)


def mark(conn: Connection) -> int:
    """How much is gathered now (a savepoint's start)."""
    return len(conn.info.get(_KEY, ()))


def undo(conn: Connection, since: int) -> None:
    """Drop what was gathered after ``since`` (rolled back to a savepoint)."""
    gathered: dict[tuple[str, Hashable], None] = conn.info.get(_KEY, {})
    for key in list(gathered)[since:]:
        del gathered[key]


def send(conn: Connection) -> None:
    """Write everything gathered as the transaction's last statement."""
    gathered: dict[tuple[str, Hashable], None] | None = conn.info.pop(_KEY, None)
    if not gathered:
        return
    by_kind: dict[str, list[Any]] = {}
    for kind, item in gathered:
        by_kind.setdefault(kind, []).append(item)
    bounds = [
        b for kind, sender in _senders.items() if kind in by_kind for b in sender(by_kind[kind])
    ]
    if len(bounds) == 1:
        bounds[0].run(conn)
    elif bounds:
        together(tuple(b.sql for b in bounds)).run(conn, *[v for b in bounds for v in b.values])


@cache
def together(parts: tuple[Sql, ...]) -> Sql:
    """``parts`` as one statement: each a CTE (materialized, so a SELECT of a function with
    an effect, ``pg_notify``, runs whole), counted so that every one is run."""
    ctes = ", ".join(f"part_{i} AS MATERIALIZED ({sql.text})" for i, sql in enumerate(parts))
    counts = ", ".join(f"(SELECT count(*) FROM part_{i})" for i in range(len(parts)))
    table = next((sql.table for sql in parts if sql.table is not None), None)
    return Sql(
        "commit-tail",
        table,
        f"WITH {ctes} SELECT {counts}",
        params=[qualified(sql, p, table) for sql in parts for p in sql.params],
    )
