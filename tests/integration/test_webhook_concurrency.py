"""Many deliveries at once against the real service on uvicorn: nothing doubled, nothing lost.

The same harness as test_webhook_endpoint (no background worker, so only webhooks write),
on the system clock because the deliveries are signed with the current time. Each test runs
against one instance, and against two instances on the same database taking turns, so that
two group-commit writers race in the database and not only in one process.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from reconciler.app import create_app
from reconciler.core.clock import SystemClock
from reconciler.core.states import State
from reconciler.runtime import Runtime
from reconciler.storage import audit
from reconciler.storage.tables import EVENTS, HISTORY, OPS
from tests.integration.test_webhook_endpoint import (
    HARNESS_ENV,
    SECRET_OLD,
    Endpoint,
    event_body,
    open_endpoint,
    signed_headers,
)
from tests.support import loopback
from tests.support.factories import insert_operation
from tests.support.servers import serve_asgi

pytestmark = pytest.mark.both_backends


@pytest.fixture
def live(tmp_path: Path, db_url: str) -> Iterator[Endpoint]:
    with open_endpoint(tmp_path, db_url, SystemClock()) as endpoint:
        yield endpoint


@pytest.fixture(params=[1, 2], ids=["one_instance", "two_instances"])
def urls(request: pytest.FixtureRequest, live: Endpoint) -> Iterator[list[str]]:
    """The instances' base URLs: the harness, and maybe a second one on the same database."""
    with ExitStack() as stack:
        found = [live.url]
        for _ in range(int(request.param) - 1):
            other = Runtime.build(live.runtime.settings, clock=SystemClock(), environ=HARNESS_ENV)
            found.append(stack.enter_context(serve_asgi(create_app(other, background=False))))
        yield found


Delivery = tuple[bytes, dict[str, str]]


async def _send_all(urls: list[str], deliveries: list[Delivery]) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=len(deliveries), max_keepalive_connections=0)
    async with loopback.async_client(timeout=60.0, limits=limits) as client:
        start = asyncio.Event()

        async def one(url: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
            await start.wait()
            return await client.post(f"{url}/webhooks/sim", content=body, headers=headers)

        tasks = [
            asyncio.create_task(one(urls[i % len(urls)], body, headers))
            for i, (body, headers) in enumerate(deliveries)
        ]
        await asyncio.sleep(0)  # every task is parked at the start line
        start.set()
        return list(await asyncio.gather(*tasks))


def send_concurrently(urls: list[str], deliveries: list[Delivery]) -> list[httpx.Response]:
    """All at once, spread over the instances in turn."""
    return asyncio.run(_send_all(urls, deliveries))


def hint_counts(ep: Endpoint) -> Counter[str]:
    with ep.runtime.db.read() as conn:
        rows = conn.execute(sa.select(HISTORY.c.operation_id).where(HISTORY.c.kind == "hint"))
        return Counter(r.operation_id for r in rows)


def test_one_event_delivered_fifty_times_at_once_is_stored_once(
    live: Endpoint, urls: list[str]
) -> None:
    body = event_body("evt_storm")
    headers = signed_headers(SECRET_OLD, "evt_storm", datetime.now(UTC), body)
    before = live.snapshot()
    responses = send_concurrently(urls, [(body, headers)] * 50)

    assert [r.status_code for r in responses] == [200] * 50, [r.text for r in responses]
    outcomes = Counter(r.json()["status"] for r in responses)
    assert outcomes == {"hinted": 1, "duplicate": 49}
    after = live.snapshot()
    assert after.events == before.events + 1
    row = live.event_row("evt_storm")
    assert row is not None
    assert (row["operation_id"], row["duplicates"], row["conflicts"]) == (live.op_id, 49, 0)
    new = live.history()[before.history :]
    assert [(h["kind"], h["cause"]) for h in new] == [("hint", "webhook:evt_storm")]
    assert after.operation["version"] == before.operation["version"] + 1
    assert audit.verify(live.runtime.db, None).ok


def test_two_hundred_distinct_events_for_twenty_operations_are_all_kept(
    live: Endpoint, urls: list[str]
) -> None:
    rt = live.runtime
    now = rt.clock.now()
    ops = {
        f"job_many_{n:02d}": insert_operation(
            rt.db,
            rt.journal,
            now,
            state=State.OBSERVING.value,
            remote_job_id=f"job_many_{n:02d}",
            accepted_at=now,
            next_poll_at=now + timedelta(hours=1),
        ).id
        for n in range(20)
    }
    deliveries: list[Delivery] = []
    signed_at = datetime.now(UTC)
    for k in range(10):
        for job in ops:
            event_id = f"evt_{job}_{k}"
            body = event_body(event_id, job_id=job)
            deliveries.append((body, signed_headers(SECRET_OLD, event_id, signed_at, body)))

    responses = send_concurrently(urls, deliveries)

    assert [r.status_code for r in responses] == [200] * 200, [r.text for r in responses]
    # The first event of each job hints it; the rest arrive while that hint is pending.
    statuses = [r.json()["status"] for r in responses]
    assert set(statuses) <= {"hinted", "coalesced"} and statuses.count("hinted") >= len(ops)
    with rt.db.read() as conn:
        rows = conn.execute(
            sa.select(EVENTS.c.event_id, EVENTS.c.remote_job_id, EVENTS.c.operation_id)
        ).all()
        states = {
            r.id: r for r in conn.execute(sa.select(OPS).where(OPS.c.id.in_(list(ops.values()))))
        }
    assert len(rows) == 200
    assert {r.event_id for r in rows} == {f"evt_{job}_{k}" for job in ops for k in range(10)}
    assert all(r.operation_id == ops[r.remote_job_id] for r in rows)
    hints = hint_counts(live)
    for op_id in ops.values():
        assert 1 <= hints[op_id] <= 10, f"{op_id}: {hints[op_id]} hint entries"
        op = states[op_id]
        assert op.hinted_at is not None and op.delay_source == "webhook_hint"
        assert op.next_poll_at is not None and op.next_poll_at <= datetime.now(UTC)
    assert hints[live.op_id] == 0
    assert audit.verify(rt.db, None).ok
