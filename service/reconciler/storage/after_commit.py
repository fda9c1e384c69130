"""What may happen only once a write transaction committed: a log line that claims a change.

A line written inside the transaction ("operation ... escalated") would claim a change
that a rollback undoes: a lost race, a value the database refused. Such work is queued
on the connection (``after_commit``) and run by ``Database.write`` after the commit; a
rollback drops it, and so does a rollback to a savepoint (``Database.write_together``)
for what was queued inside it. The queue lives in the pooled connection's ``info`` and
is emptied when each write transaction begins, so nothing leaks into the next one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sqlalchemy.engine import Connection

log = logging.getLogger("reconciler.storage.after_commit")

_KEY = "reconciler_after_commit"

Pending = list[Callable[[], None]]


def begin(conn: Connection) -> None:
    """A write transaction begins: nothing is queued."""
    conn.info[_KEY] = []


def after_commit(conn: Connection, fn: Callable[[], None]) -> None:
    """Run ``fn`` once the transaction ``conn`` is in has committed (never if it rolls back)."""
    conn.info.setdefault(_KEY, []).append(fn)


def mark(conn: Connection) -> int:
    """How much is queued now (a savepoint's start)."""
    return len(conn.info.get(_KEY, ()))


def undo(conn: Connection, since: int) -> None:
    """Drop what was queued after ``since`` (rolled back to a savepoint)."""
    pending: Pending = conn.info.get(_KEY, [])
    del pending[since:]


def take(conn: Connection) -> Pending:
    """What is queued, handed over for after the commit; the queue starts empty again."""
    pending: Pending = conn.info.get(_KEY, [])
    conn.info[_KEY] = []
    return pending


def run(pending: Pending) -> None:
    """Run what the committed transaction queued; one failing does not stop the others."""
    for fn in pending:
        try:
            fn()
        except Exception:
            log.exception("work queued for after a commit failed")
