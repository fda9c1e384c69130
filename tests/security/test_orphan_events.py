"""Webhook events no operation waits for are kept bounded, whatever size the provider sends.

A provider whose webhooks cover a whole account (OpenAI project webhooks, GitHub
organisation hooks) sends events for jobs this service never made, and types it does
not listen to, in normal operation. Each event keeps its id, type, job id, the digest
and size of its body and at most 4 KiB of the body: 300 signed orphans of 60 KB grow
the database by a few megabytes on either backend, not by their 18 MB. An orphan
cut to 4 KiB still settles a ``create_unknown`` when its job id is learned; an
ignored type keeps its job id but never attaches.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import random
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from standardwebhooks import Webhook

from reconciler.app import create_app
from reconciler.storage.tables import EVENTS
from reconciler.storage.webhook_events import MAX_KEPT_BODY_BYTES
from tests.support.provider_mock import BASE_URL
from tests.support.stack import WEBHOOK_SECRET, sim_provider_table
from tests.support.steps import StepRig, step_rig

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

MB = 1_000_000


def padded(event_type: str, job_id: str, size: int, seed: int) -> bytes:
    """A signed-looking event of ``size`` bytes, its padding random (no database compresses
    it away)."""
    pad = base64.b64encode(random.Random(seed).randbytes(size * 3 // 4 - 100)).decode()
    body = {"type": event_type, "data": {"job_id": job_id, "id": job_id}, "pad": pad}
    return json.dumps(body).encode()


async def deliver(client: httpx.AsyncClient, rig: StepRig, event_id: str, body: bytes) -> str:
    now = rig.clock.now()
    headers = {
        "webhook-id": event_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": Webhook(WEBHOOK_SECRET).sign(event_id, now, body.decode()),
        "content-type": "application/json",
    }
    response = await client.post("/webhooks/sim", content=body, headers=headers)
    assert response.status_code == 200, response.text
    status: str = response.json()["status"]
    return status


def intake(rig: StepRig) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(create_app(rig.runtime, background=False))
    return httpx.AsyncClient(transport=transport, base_url="http://service")


def stored(rig: StepRig, event_id: str) -> Any:
    with rig.runtime.db.read() as conn:
        return conn.execute(sa.select(EVENTS).where(EVENTS.c.event_id == event_id)).one()


def database_bytes(rig: StepRig) -> int:
    """What the events take on disk: the table with its indexes and TOAST (PostgreSQL), or
    the pages of the whole file (SQLite, which never gives them back)."""
    with rig.runtime.db.read() as conn:
        if conn.dialect.name == "postgresql":
            size = sa.text("SELECT pg_total_relation_size('webhook_events')")
            return int(conn.execute(size).scalar_one())
        pages = conn.execute(sa.text("PRAGMA page_count")).scalar_one()
        return int(pages) * int(conn.execute(sa.text("PRAGMA page_size")).scalar_one())


async def test_an_orphan_keeps_its_ids_type_digest_and_4_kib_of_its_body(
    tmp_path: Path, db_url: str
) -> None:
    body = padded("job.finished", "job-elsewhere", 60_000, seed=1)
    async with step_rig(tmp_path, db_url) as rig, intake(rig) as client:
        assert await deliver(client, rig, "evt_big", body) == "orphan"
        row = stored(rig, "evt_big")
    assert row.remote_job_id == "job-elsewhere" and row.operation_id is None
    assert row.event_type == "job.finished" and not row.ignored
    assert row.body_sha256 == hashlib.sha256(body).hexdigest() and row.body_size == len(body)
    assert row.body.encode() == body[:MAX_KEPT_BODY_BYTES]


async def test_three_hundred_orphans_of_60_kb_grow_the_database_by_a_few_megabytes(
    tmp_path: Path, db_url: str
) -> None:
    async with step_rig(tmp_path, db_url) as rig, intake(rig) as client:
        await deliver(client, rig, "evt_warm", padded("job.finished", "job-0", 1000, seed=0))
        before = database_bytes(rig)
        for n in range(300):
            body = padded("job.finished", f"job-{n}", 60_000, seed=n)
            assert await deliver(client, rig, f"evt_{n}", body) == "orphan"
        grown = database_bytes(rig) - before
    # Kept whole they took 18 MB and more; the bound is 4 KiB of body each.
    assert grown <= 6 * MB, f"the database grew by {grown} bytes"


def unlisted_types() -> dict[str, Any]:
    table = copy.deepcopy(sim_provider_table(BASE_URL))
    table["webhook"]["types"] = ["job.finished"]
    return table


async def test_an_ignored_type_keeps_its_job_id_and_never_attaches(
    tmp_path: Path, db_url: str
) -> None:
    async with step_rig(tmp_path, db_url, table=unlisted_types()) as rig, intake(rig) as client:
        op_id = rig.submit()
        rig.provider.script("create", rig.provider.made_then(httpx.ReadTimeout("lost")))
        assert (await rig.step(op_id)).state == "create_unknown"
        [job] = rig.provider.jobs
        body = padded("job.progress", job, 60_000, seed=3)
        assert await deliver(client, rig, "evt_progress", body) == "ignored"
        rig.advance_to_due(op_id)
        assert (await rig.step(op_id)).state == "observing"  # the lookup found the job
        row = stored(rig, "evt_progress")
        hints = [e for e in rig.history(op_id) if e.kind == "hint"]
    assert row.ignored and row.event_type == "job.progress" and row.remote_job_id == job
    assert row.operation_id is None and len(row.body.encode()) <= MAX_KEPT_BODY_BYTES
    assert hints == []


async def test_a_cut_orphan_still_settles_a_create_unknown_when_its_job_is_learned(
    tmp_path: Path, db_url: str
) -> None:
    async with step_rig(tmp_path, db_url) as rig, intake(rig) as client:
        op_id = rig.submit()
        rig.provider.script("create", rig.provider.made_then(httpx.ReadTimeout("lost")))
        assert (await rig.step(op_id)).state == "create_unknown"
        [job] = rig.provider.jobs
        rig.provider.finish(job)
        body = padded("job.finished", job, 60_000, seed=4)
        assert await deliver(client, rig, "evt_done", body) == "orphan"
        rig.advance_to_due(op_id)
        op = await rig.step(op_id)  # the lookup finds the job: the orphan attaches
        row = stored(rig, "evt_done")
        [hint] = [e for e in rig.history(op_id) if e.kind == "hint"]
        assert op.state == "observing" and op.next_poll_at == rig.clock.now()
        assert op.delay_source == "webhook_hint"
        assert row.operation_id == op_id and len(row.body.encode()) <= MAX_KEPT_BODY_BYTES
        assert hint.cause == "webhook:evt_done" and hint.detail == {
            "event_id": "evt_done",
            "orphan": True,
        }
        await rig.run(op_id, ["succeeded"])
