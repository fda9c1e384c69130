"""Retention on both backends, in the in-process world on the manual clock.

The sweep removes finished operations with every row they own, and nothing else: an
operation in flight, one awaiting a decision and one whose completion step is still
retrying stay whole. A pruned operation answers 410 while its tombstone lasts, a retry
of its key and request starts nothing, and ``audit verify`` passes and says what went;
an edit of a kept entry or of the retention log still fails it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from reconciler.storage import audit
from reconciler.storage.database import Database
from reconciler.storage.tables import (
    EVENTS,
    HISTORY,
    OPS,
    PAYLOAD_TABLE,
    RETENTION_LOG,
    STEPS,
    TOMBSTONES,
)
from tests.support import hooks
from tests.support.console import csrf_of
from tests.support.world import World, world

pytestmark = pytest.mark.both_backends

DAY = 86_400.0
QUICK = {"scenario": "success", "duration": 2.0, "webhooks": "normal"}
RETENTION = {"operations_days": 30, "events_days": 7, "tombstones_days": 90}


def run(tmp_path: Path, db_url: str, body: Callable[[World], Any], **options: Any) -> None:
    async def main() -> None:
        async with world(
            tmp_path,
            db_url,
            hooks=(hooks.FAILS_WHEN_ASKED,),
            retention=RETENTION,
            **options,
        ) as w:
            await body(w)

    asyncio.run(main())


def counts(db: Database, op_id: str) -> dict[str, int]:
    """Rows an operation owns, by table."""
    out = {}
    with db.read() as conn:
        for name, table, column in (
            ("operations", OPS, OPS.c.id),
            ("history", HISTORY, HISTORY.c.operation_id),
            ("payloads", PAYLOAD_TABLE, PAYLOAD_TABLE.c.operation_id),
            ("steps", STEPS, STEPS.c.operation_id),
            ("events", EVENTS, EVENTS.c.operation_id),
        ):
            query = sa.select(sa.func.count()).select_from(table).where(column == op_id)
            out[name] = int(conn.execute(query).scalar_one())
    return out


async def start(w: World, request: dict[str, Any], **fields: Any) -> str:
    response = await w.submit(request, **fields)
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def test_sweep_prunes_only_the_finished_and_leaves_a_tombstone(tmp_path: Path, db_url: str) -> None:
    async def body(w: World) -> None:
        db = w.runtime.db
        done = await start(w, QUICK, idempotency_key="k-done")
        retrying = await start(w, QUICK, metadata={"hook": "fail"})
        in_flight = await start(w, {"scenario": "never_finishes", "webhooks": "never"})
        escalated = await start(
            w, {"scenario": "never_finishes", "webhooks": "never"}, deadline_seconds=10
        )
        await w.run_until(
            lambda: (
                w.finished(done)()
                and w.row(escalated)["escalation_open"]
                and w.row(retrying)["done_at"] is not None
            )
        )
        before = counts(db, done)
        assert before["history"] > 3 and before["payloads"] >= 1 and before["steps"] == 1
        assert before["events"] >= 1  # its webhook, attached
        kept = {op: counts(db, op) for op in (retrying, in_flight, escalated)}

        # 29 days on: nothing is old enough yet.
        w.clock.advance(29 * DAY)
        assert not (await w.background.retention.sweep()).tables
        assert counts(db, done) == counts(db, done) and counts(db, done)["operations"] == 1

        # Past 30 days: only the finished one goes, with every row it owned.
        w.clock.advance(2 * DAY)
        removed = await w.background.retention.sweep()
        assert removed.operations == 1
        assert removed.tables["history"] == before["history"]
        assert counts(db, done) == dict.fromkeys(before, 0)
        # The one still retrying its hook, the one in flight and the one whose deadline
        # passed (result_timed_out, its decision pending) stay.
        assert w.row(retrying)["completion_pending"] or w.row(retrying)["next_poll_at"]
        for op, rows in kept.items():
            now = counts(db, op)
            assert now["operations"] == 1 and now["history"] >= rows["history"], op

        # A read of the pruned id: 410, naming retention.
        got = await w.client.get(f"/v1/operations/{done}", headers=w.headers())
        assert got.status_code == 410, got.text
        error = got.json()["error"]
        assert error["code"] == "operation_pruned"
        assert "removed by retention" in error["message"] and done in error["message"]
        # A late retry of its key and request: 410 naming it, and no second job.
        jobs = len(w.sim.jobs)
        again = await w.submit(QUICK, idempotency_key="k-done")
        assert again.status_code == 410, again.text
        assert done in again.json()["error"]["message"]
        assert "no new job was started" in again.json()["error"]["message"]
        assert len(w.sim.jobs) == jobs
        # The same key for another request is still a conflict.
        other = await w.submit({**QUICK, "duration": 3.0}, idempotency_key="k-done")
        assert other.status_code == 409 and done in other.text
        # Another agent does not learn of it.
        hidden = await w.client.get(f"/v1/operations/{done}", headers=w.headers(operator=True))
        assert hidden.status_code == 410

        report = audit.verify(db, w.runtime.journal.key)
        assert report.ok, report.fault
        assert report.retention is not None and report.retention.operations == 1
        assert "retention removed 1 operations" in report.retention.describe()

        # Operators see it on the console's providers page, with the database's size.
        form = await w.client.get("/console/sign-in")
        signed = await w.client.post(
            "/console/sign-in",
            data={"csrf": csrf_of(form.text), "token": w.operator_token, "next": "/console"},
        )
        assert signed.status_code == 303, signed.text
        page = (await w.client.get("/console/providers")).text
        storage = page.split('id="storage"')[1].split("</section>")[0]
        assert "1 operations in 1 batches" in storage and " MiB" in storage
        assert "finished operations 30 days" in storage and "tombstones 90 days" in storage
        assert "Tombstones</dt><dd>1<" in storage

        # Past the tombstone window the tombstone goes too: the id is unknown, and the key
        # starts a new job (the README says so).
        w.clock.advance(91 * DAY)
        removed = await w.background.retention.sweep()
        assert removed.tables.get("tombstones") == 1
        gone = await w.client.get(f"/v1/operations/{done}", headers=w.headers())
        assert gone.status_code == 404
        fresh = await w.submit(QUICK, idempotency_key="k-done")
        assert fresh.status_code == 202 and fresh.json()["id"] != done

    run(tmp_path, db_url, body)


def test_orphan_events_expire_after_their_window(tmp_path: Path, db_url: str) -> None:
    async def body(w: World) -> None:
        db = w.runtime.db
        old = _orphan(db, w, "evt-old", "job-nobody-made", days_ago=8)
        recent = _orphan(db, w, "evt-recent", "job-nobody-made", days_ago=1)
        removed = await w.background.retention.sweep()
        assert removed.tables.get("webhook_events") == 1
        with db.read() as conn:
            left = {row[0] for row in conn.execute(sa.select(EVENTS.c.id))}
        assert old not in left and recent in left

    run(tmp_path, db_url, body)


def _orphan(db: Database, w: World, event_id: str, job: str, days_ago: float) -> int:
    with db.write() as conn:
        return int(
            conn.execute(
                EVENTS.insert()
                .values(
                    provider="sim",
                    event_id=event_id,
                    received_at=w.now - timedelta(days=days_ago),
                    remote_job_id=job,
                    body_sha256="0" * 64,
                    body="{}",
                    duplicates=0,
                    conflicts=0,
                    ignored=False,
                )
                .returning(EVENTS.c.id)
            ).scalar_one()
        )


def test_audit_fails_after_tampering_with_the_retention_log_or_a_kept_entry(
    tmp_path: Path, db_url: str
) -> None:
    async def body(w: World) -> None:
        db = w.runtime.db
        first = await start(w, QUICK)
        second = await start(w, QUICK)
        await w.run_until(w.finished(first, second))
        w.clock.advance(31 * DAY)
        kept = await start(w, QUICK)
        # The world sweeps at every moment it acts on: the two old ones went meanwhile.
        await w.run_until(w.finished(kept))
        assert not w.rows(id=first) and not w.rows(id=second)
        key = w.runtime.journal.key
        assert audit.verify(db, key).ok

        with db.write() as conn:
            conn.execute(sa.update(RETENTION_LOG).values(operations=1))
        report = audit.verify(db, key)
        assert not report.ok and "retention record 1" in report.fault.describe()  # type: ignore[union-attr]
        with db.write() as conn:
            conn.execute(sa.update(RETENTION_LOG).values(operations=2))
        assert audit.verify(db, key).ok

        with db.write() as conn:
            conn.execute(
                sa.update(HISTORY)
                .where(HISTORY.c.operation_id == kept, HISTORY.c.seq == 1)
                .values(cause="edited")
            )
        report = audit.verify(db, key)
        assert not report.ok and kept in report.fault.describe()  # type: ignore[union-attr]

        with db.read() as conn:
            stones = conn.execute(sa.select(TOMBSTONES.c.operation_id)).scalars().all()
        assert sorted(stones) == sorted([first, second])

    run(tmp_path, db_url, body, environ={"RECONCILER_AUDIT_KEY": "k" * 32})
