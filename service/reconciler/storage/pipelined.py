"""The writes of one shared PostgreSQL transaction, their statements sent together.

A joined transaction (``Database.write_together``) carries up to ``JOIN_LIMIT`` writes,
most of them one statement each; run one after another, each statement is a round trip
the writer thread waits out, and on a machine whose cores are shared with the server
and the load, each wait is two turns on a core that the thread also waits for. Here
every write runs as a greenlet on the writer thread, in psycopg's pipeline mode: a
write's statement is queued and the write parks (``fastsql.run`` waits on ``fastsql.sent``);
once every write is parked or done, one sync sends all their statements and brings back
all their results, and each write goes on from where it parked. A transaction of many
one-statement writes costs one round trip for all of them, not one each.

What a write sees stays what it would see alone:

* Writes on one operation (one ``key``) run in one lane, one after another, in their
  order: a write that reads what the one before it wrote sees all of it. Lanes are in
  key order, the writes over many rows (key "") first, so each turn's statements reach
  the server in the same order as the writes would have, and rows are locked in that
  order.
* A write reads a statement's result only after the sync that brought it.
* Any failure ends the whole transaction, as in ``Database._all_or_none``: a write's own
  error (a lost race, a conflict) is raised from where it happened, a statement's error
  from the sync that brought it (which write it belonged to is then unknown; the caller
  runs them again one by one, each in a savepoint, to find it). The writes still parked
  are ended (``GreenletExit`` at their park), so none is left half-run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import copy_context
from typing import Any

from greenlet import GreenletExit, getcurrent, greenlet
from sqlalchemy.engine import Connection

from reconciler.storage import fastsql
from reconciler.storage.on_loop import WriterLocal

# The sync of one turn, named in its error (never the statements' values).
_SYNC = "(the joined writes' statements, sent together)"


# The writer's pipelined transaction (``transaction``), and while ``run_lanes`` runs in
# it, its greenlet and its pipeline's sync.
_turns = WriterLocal(pipeline=None, main=None, sync=None)
# What a write hands the turn to ask for the connection alone (``alone``).
_ALONE = object()


@contextmanager
def transaction(connection: Connection) -> Iterator[Connection]:
    """A write transaction in pipeline mode, for ``run_lanes``.

    Its BEGIN goes with its first turn's statements, and its COMMIT with what is sent
    after the turns (``commit_tail``), in the round trip that leaves pipeline mode: a
    transaction of k turns costs k + 1 round trips, where psycopg's own BEGIN, a pipeline
    left before the tail, and a COMMIT of its own would cost k + 4. So the connection is
    in autocommit while it lasts (psycopg then sends no BEGIN of its own) and the BEGIN
    and the COMMIT are statements of ours. A transaction that fails is rolled back; a
    connection that cannot be brought back to a plain idle state is invalidated, so the
    pool never hands out one in autocommit or inside a transaction.
    """
    with connection as conn:
        raw = conn.connection.driver_connection
        raw.autocommit = True  # type: ignore[union-attr]
        try:
            try:
                with raw.pipeline() as pipeline:  # type: ignore[union-attr]
                    _turns.pipeline = pipeline
                    fastsql.run(conn, "BEGIN")
                    yield conn
                    # Sent with the tail by the sync that leaves pipeline mode.
                    fastsql.run(conn, "COMMIT")
            except conn.dialect.loaded_dbapi.Error as exc:  # from that sync: the end failed
                raise fastsql.driver_error(conn, "COMMIT", (), exc) from exc
        except BaseException:
            _abandon(conn, raw)
            raise
        else:
            raw.autocommit = False  # type: ignore[union-attr]
        finally:
            _turns.pipeline = None


def _abandon(conn: Connection, raw: Any) -> None:
    """After a failure: roll back and leave autocommit, or else drop the connection."""
    if conn.invalidated:
        return
    try:
        raw.rollback()
        raw.autocommit = False
    except Exception as exc:  # lost or unusable: the pool must not hand it out again
        conn.invalidate(exc)


@contextmanager
def alone() -> Iterator[None]:
    """Inside, this write's statements alone reach the connection, each answered at once.

    For a savepoint and what runs inside it (a transactional hook's statements): another
    write's statement sent meanwhile would fall inside it, and be undone with it. Outside
    ``run_lanes`` every write is alone already.
    """
    main = _turns.main
    if main is None or getcurrent() is main:
        yield
        return
    main.switch(_ALONE)  # back once every statement sent before is answered
    wait = fastsql.sent.wait
    fastsql.sent.wait = _turns.sync
    try:
        yield
    finally:
        fastsql.sent.wait = wait


def lanes(keys: Sequence[str]) -> list[list[int]]:
    """The writes' indexes grouped into lanes: consecutive writes of one key share one."""
    out: list[list[int]] = []
    for i, key in enumerate(keys):
        if out and keys[out[-1][0]] == key:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def run_lanes(
    conn: Connection, writes: Sequence[Callable[[Connection], Any]], keys: Sequence[str]
) -> list[Any]:
    """Each write's result, in order; the first failure is raised (see the module).

    ``keys``: each write's operation id ("" for a write over many rows), in the order the
    writes are to run (``Writer`` sorts them so).
    """
    pipeline = _turns.pipeline
    if pipeline is None:
        raise RuntimeError("run_lanes runs inside pipelined.transaction")
    main = getcurrent()
    results: list[Any] = [None] * len(writes)

    def lane(indexes: list[int]) -> None:
        for i in indexes:
            results[i] = writes[i](conn)

    runners = []
    for indexes in lanes(keys):
        runner = greenlet(lambda indexes=indexes: lane(indexes), parent=main)
        runner.gr_context = copy_context()  # the caller's trace and flow, as on the thread
        runners.append(runner)

    def sync() -> None:
        try:
            pipeline.sync()
        except conn.dialect.loaded_dbapi.Error as exc:
            raise fastsql.driver_error(conn, _SYNC, (), exc) from exc

    _turns.main, _turns.sync = main, pipeline.sync
    fastsql.sent.wait = main.switch  # a write's statement is queued: back to the turn
    try:
        _take_turns(runners, sync)
    finally:
        fastsql.sent.wait = None
        _turns.main = _turns.sync = None
        for runner in runners:
            if not runner.dead:
                runner.throw(GreenletExit)
    return results


def _take_turns(runners: list[Any], sync: Callable[[], None]) -> None:
    """Run every write up to its next statement, send them all, again until all are done."""
    turn = runners
    while turn:
        for runner in turn:
            while runner.switch() is _ALONE:
                sync()  # what the others sent is answered before it goes on alone
        turn = [runner for runner in turn if not runner.dead]
        if turn:
            sync()
