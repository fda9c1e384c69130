"""How the read that confirms an end judges it: webhook-first, or waiting out the grace.

A completion is webhook-first when a verified webhook for the job reached us before the
confirming read was sent and no earlier read had answered it. The operation's hint is
not enough to tell: a hint coalesced while the read is in flight moves ``hinted_at``
past the read, and a webhook received before the read went out may commit its hint
while the read is in flight. Both cases cost a provider its trust in ``make demo``
(a false miss: 20 completions of full polling with the default ``trust_after``).

Each case runs the real create and poll steps on a ``ManualClock``; the provider is a
``FakeProvider`` behind ``httpx.MockTransport`` whose status answer stores the webhook
at the moment the case needs, as the intake's batch does (``write_batch``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from reconciler.core.trust import Health, TrustState
from reconciler.engine.trust import TrustKeeper
from reconciler.storage import trust as store
from reconciler.storage.tables import VERDICTS
from reconciler.storage.webhook_events import IncomingEvent, Outcome, write_batch
from tests.support.stack import QUICK_POLLING
from tests.support.statements import recording
from tests.support.steps import StepRig, step_rig

pytestmark = pytest.mark.anyio

GRACE = 3.0
PROVIDER = {"polling": {**QUICK_POLLING, "trust_after": 2, "webhook_grace_seconds": GRACE}}
MS = timedelta(milliseconds=1)


def store_webhook(rig: StepRig, event_id: str, job_id: str, received_at: datetime) -> Outcome:
    """A verified event written as the intake's batch writes it, at the clock's now."""
    body = f'{{"id":"{event_id}","data":{{"job_id":"{job_id}","state":"succeeded"}}}}'
    event = IncomingEvent(
        provider="sim",
        event_id=event_id,
        remote_job_id=job_id,
        body_sha256=hashlib.sha256(body.encode()).hexdigest(),
        body=body,
        received_at=received_at,
    )
    rt = rig.runtime
    with rt.db.write() as conn:
        [outcome] = write_batch(conn, rt.journal, [event], rig.clock.now())
    return outcome


def during_read(
    rig: StepRig, act: Callable[[datetime], None]
) -> Callable[[httpx.Request], httpx.Response]:
    """A status answer that first runs ``act(sent_at)``, while the read is in flight."""

    def answer(request: httpx.Request) -> httpx.Response:
        act(rig.clock.now())  # the adapter stamps the request with this clock's now
        return rig.provider.usual(request)

    return answer


async def observing(rig: StepRig) -> tuple[str, str]:
    op_id = rig.submit()
    op = await rig.step(op_id)
    assert op.state == "observing" and op.remote_job_id is not None
    return op_id, op.remote_job_id


def verdicts(rig: StepRig, op_id: str) -> list[dict[str, Any]]:
    with rig.runtime.db.read() as conn:
        rows = conn.execute(sa.select(VERDICTS).where(VERDICTS.c.operation_id == op_id))
        return [dict(r) for r in rows.mappings()]


async def settled_health(rig: StepRig) -> Health:
    """The provider's health once every grace is over and the keeper has judged."""
    rig.advance(GRACE + 1)
    await TrustKeeper(rig.ctx).sweep()
    with rig.runtime.db.read() as conn:
        return store.load_health(conn, "sim")


async def test_a_hint_coalesced_while_the_read_is_in_flight_leaves_it_webhook_first(
    tmp_path: Path, db_url: str
) -> None:
    # The demo's out-of-order provider: the terminal event, then a stale "running" one
    # that arrives as the read it caused goes out. Coalescing moves hinted_at past the
    # read (its answer may predate the event), the answer is applied on that row.
    async with step_rig(tmp_path, db_url, provider=PROVIDER) as rig:
        op_id, job_id = await observing(rig)
        rig.provider.finish(job_id)
        rig.advance(1)
        assert store_webhook(rig, "evt_done", job_id, rig.clock.now()) is Outcome.HINTED
        hinted_at = rig.row(op_id).hinted_at
        rig.advance(0.01)

        def stale_event(sent_at: datetime) -> None:
            rig.clock.set(sent_at + 2 * MS)
            assert store_webhook(rig, "evt_stale", job_id, sent_at) is Outcome.COALESCED
            assert rig.row(op_id).hinted_at == sent_at + 2 * MS

        rig.provider.script("status", during_read(rig, stale_event))
        op = await rig.step(op_id)

        assert op.state == "result_collecting"
        [verdict] = verdicts(rig, op_id)
        assert verdict["verdict"] == "webhook_first"
        assert verdict["hinted_at"] == hinted_at
        health = await settled_health(rig)
        assert (health.webhook_first, health.late, health.missed) == (1, 0, 0)


async def test_a_webhook_received_before_the_read_whose_hint_commits_during_it_is_first(
    tmp_path: Path, db_url: str
) -> None:
    # The demo's slow job: a scheduled read goes out 12 ms after the terminal webhook
    # was received, and the webhook's batch commits the hint while the read is in flight.
    async with step_rig(tmp_path, db_url, provider=PROVIDER) as rig:
        op_id, job_id = await observing(rig)
        rig.provider.finish(job_id)
        rig.advance_to_due(op_id)

        def crossing(sent_at: datetime) -> None:
            rig.clock.set(sent_at + 3 * MS)
            assert store_webhook(rig, "evt_done", job_id, sent_at - 12 * MS) is Outcome.HINTED

        rig.provider.script("status", during_read(rig, crossing))
        op = await rig.step(op_id)

        assert op.state == "result_collecting"
        [verdict] = verdicts(rig, op_id)
        assert verdict["verdict"] == "webhook_first"
        assert verdict["hinted_at"] == verdict["asked_at"] - 12 * MS
        health = await settled_health(rig)
        assert (health.webhook_first, health.late, health.missed) == (1, 0, 0)


async def test_a_webhook_received_before_the_read_whose_hint_commits_after_it_is_first(
    tmp_path: Path, db_url: str
) -> None:
    # The same crossing, with the webhook's batch committing only after the read was
    # judged: the read saw no webhook (pending), the grace finds one received before it.
    async with step_rig(tmp_path, db_url, provider=PROVIDER) as rig:
        op_id, job_id = await observing(rig)
        rig.provider.finish(job_id)
        rig.advance_to_due(op_id)
        sent: list[datetime] = []
        rig.provider.script("status", during_read(rig, sent.append))
        op = await rig.step(op_id)
        assert op.state == "result_collecting"
        [verdict] = verdicts(rig, op_id)
        assert verdict["verdict"] == "pending"

        rig.advance(0.05)
        store_webhook(rig, "evt_done", job_id, sent[0] - 5 * MS)
        health = await settled_health(rig)

        [verdict] = verdicts(rig, op_id)
        assert verdict["verdict"] == "webhook_first"
        assert verdict["hinted_at"] == sent[0] - 5 * MS
        assert (health.webhook_first, health.late, health.missed) == (1, 0, 0)


async def test_a_webhook_an_earlier_read_answered_does_not_make_the_end_webhook_first(
    tmp_path: Path, db_url: str
) -> None:
    # The demo's lying provider: "succeeded" while the job still runs; the read it causes
    # answers it (running), the job ends later with no webhook: a miss, as before.
    async with step_rig(tmp_path, db_url, provider=PROVIDER) as rig:
        op_id, job_id = await observing(rig)
        rig.advance(1)
        assert store_webhook(rig, "evt_lie", job_id, rig.clock.now()) is Outcome.HINTED
        rig.provider.jobs[job_id].state = "running"
        op = await rig.step(op_id)
        assert op.state == "observing" and op.hinted_at is None
        rig.provider.finish(job_id)
        rig.advance_to_due(op_id)
        op = await rig.step(op_id)

        assert op.state == "result_collecting"
        [verdict] = verdicts(rig, op_id)
        assert verdict["verdict"] == "pending"
        health = await settled_health(rig)
        assert (health.webhook_first, health.late, health.missed) == (0, 0, 1)


@pytest.mark.both_backends
async def test_a_trusted_providers_webhook_first_end_is_counted_by_the_move_itself(
    tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once a provider is trusted, a webhook-first end cannot change its state: the count
    rides with the move that records the end (PostgreSQL: in its statement), and nothing
    reads the health row. Before that, the health's own rules count it (and trust it)."""
    async with step_rig(tmp_path, db_url, provider=PROVIDER) as rig:
        for n in range(3):
            op_id, job_id = await observing(rig)
            rig.provider.finish(job_id)
            rig.advance(1)
            assert store_webhook(rig, f"evt_{n}", job_id, rig.clock.now()) is Outcome.HINTED
            rig.advance(0.01)
            with recording(monkeypatch) as ran:
                op = await rig.step(op_id)
            assert op.state == "result_collecting"
            health_sql = [sql for sql, _ in ran if "provider_health" in sql]
            with rig.runtime.db.read() as conn:
                health = store.load_health(conn, "sim")
            assert health.webhook_first == n + 1
            stored = [sql for sql in health_sql if "SET state = " in sql]
            if n < 2:  # learning: the row is read, locked and stored by the health's rules
                assert stored
                continue
            assert health.state is TrustState.TRUSTED
            assert not stored
            if rig.runtime.db.sqlite:
                assert len(health_sql) == 1
            else:
                [move] = health_sql
                assert "INSERT INTO webhook_verdicts" in move
