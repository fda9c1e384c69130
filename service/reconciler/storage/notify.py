"""Notifications that travel with a commit (PostgreSQL ``NOTIFY``/``LISTEN``).

Guarantee: a replica hears of a change exactly when it commits, never for one that
rolled back: writers notify inside the change's own transaction. SQLite has one
process, whose wake-ups stay in memory (``engine.wakeups``).

A transaction's notifications are sent in one statement just before it commits
(``storage.commit_tail``): a joined transaction of many steps would otherwise spend a
round trip on each, most of them the same wake-up again. A write that causes one
itself (an operation's move, a new operation's wake-up) sends it in its own statement
instead (``Journal.write``'s ``notify``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence

from sqlalchemy.engine import Connection

from reconciler.storage import commit_tail
from reconciler.storage.fastsql import AS_IS, Bound, Sql

WAKE_CHANNEL = "reconciler_wake"
CHANGE_CHANNEL = "reconciler_change"
NOTIFY = Sql(
    "notify",
    None,
    "SELECT pg_notify(c, p) FROM unnest(CAST(? AS text[]), CAST(? AS text[])) AS n(c, p)",
    params=(AS_IS, AS_IS),
)
_KIND = "notify"


def sending(items: Sequence[tuple[str, str]]) -> Bound:
    """``(channel, payload)`` pairs as one statement (``NOTIFY``), to send now or inside the
    write that causes them (``Journal.write``'s ``notify``)."""
    return Bound(NOTIFY, ([c for c, _ in items], [p for _, p in items]))


def notify_in_transaction(conn: Connection, channel: str, payload: str = "") -> None:
    """Queue a cross-replica notification that fires only if this transaction commits."""
    if conn.dialect.name == "postgresql":
        # Sent with the transaction's tail; one gathered twice is sent once (as PostgreSQL
        # itself folds a transaction's repeats).
        commit_tail.gather(conn, _KIND, (channel, payload))


def _send(gathered: list[tuple[str, str]]) -> list[Bound]:
    return [sending(gathered)]


commit_tail.sends(_KIND, _send)


async def notifications(
    dsn: str, on_listening: Callable[[], None] | None = None
) -> AsyncIterator[tuple[str, str, int]]:
    """``(channel, payload, pid)`` for every notification on one dedicated connection
    (``pid``: the server process of the session that sent it).

    ``on_listening`` is called once the connection listens (the listener is back).
    """
    import psycopg  # the PostgreSQL extra; never imported on SQLite

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
        await aconn.execute(f"LISTEN {WAKE_CHANNEL}")
        await aconn.execute(f"LISTEN {CHANGE_CHANNEL}")
        if on_listening is not None:
            on_listening()
        async for note in aconn.notifies():
            yield note.channel, note.payload, note.pid
