"""A change this process committed reaches its waiters with its record, not a read.

PostgreSQL notifies the listener of every committed change, this process's own too, and
that notification usually arrives before the writer hands its waiters the record it
committed: each waiter would then read the row again (an agent's create waiting for its
job id read its operation once an operation). The listener relays a change sent by one
of this process's own connections only after a delay (``OWN_CHANGE_DELAY_SECONDS``); one
from another process (another replica) at once.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa

from reconciler.engine.wakeups import Notifier
from reconciler.storage.database import Database
from reconciler.storage.notify import CHANGE_CHANNEL, notify_in_transaction
from tests.support.databases import PostgresFactory, need_postgres
from tests.support.factories import new_operation
from tests.support.waiting import wait_until_async

pytestmark = [pytest.mark.postgres, pytest.mark.anyio]

NOW = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _notify(db: Database, payload: str) -> None:
    with db.write() as conn:
        notify_in_transaction(conn, CHANGE_CHANNEL, payload)


async def test_an_own_change_waits_for_the_writers_record_and_another_replicas_does_not(
    postgres_factory: PostgresFactory | None,
) -> None:
    factory = need_postgres(postgres_factory)
    url = factory.clone()
    ours, theirs = Database(url), Database(url)  # this process, and another replica
    notifier = Notifier(own_change_delay=30.0)  # never within this test's waits
    notifier.bind(asyncio.get_running_loop())
    dsn = sa.make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    task = asyncio.get_running_loop().create_task(notifier.listen(dsn, ours.is_own_backend))
    try:
        await _until_heard(theirs, notifier, "probe")  # the listener listens
        mine, other = notifier.subscribe("op_mine"), notifier.subscribe("op_other")
        await asyncio.to_thread(_notify, ours, "op_mine")
        await asyncio.to_thread(_notify, theirs, "op_other")
        # Notifications arrive in commit order: once the other replica's has been relayed,
        # ours was heard too, and is held back.
        await wait_until_async(other.is_set, 20, "the other replica's change")
        assert other.record is None  # from another process: read it
        assert not mine.is_set()
        record = new_operation(NOW)
        notifier.changed("op_mine", record)  # the writer's own relay, with what it committed
        await wait_until_async(mine.is_set, 5, "our own change")
        assert mine.record is record
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        ours.dispose()
        theirs.dispose()
        factory.release(url)


async def test_an_own_change_no_writer_relays_still_wakes_its_waiters(
    postgres_factory: PostgresFactory | None,
) -> None:
    factory = need_postgres(postgres_factory)
    url = factory.clone()
    ours = Database(url)
    notifier = Notifier(own_change_delay=0.05)
    notifier.bind(asyncio.get_running_loop())
    dsn = sa.make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    task = asyncio.get_running_loop().create_task(notifier.listen(dsn, ours.is_own_backend))
    try:
        # No writer relays it here: the listener does, after the delay (sent until heard,
        # since the listener may still be connecting at the first one).
        waiting = await _until_heard(ours, notifier, "op_1")
        assert waiting.record is None
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        ours.dispose()
        factory.release(url)


async def _until_heard(db: Database, notifier: Notifier, payload: str) -> asyncio.Event:
    """Notify ``payload`` from ``db`` until the listener relays it; the woken event."""
    waiting = notifier.subscribe(payload)
    for _ in range(40):
        await asyncio.to_thread(_notify, db, payload)
        try:
            await asyncio.wait_for(waiting.wait(), 0.5)
            return waiting
        except TimeoutError:
            continue
    raise AssertionError(f"the listener never relayed {payload}")
