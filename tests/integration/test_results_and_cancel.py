"""Result collection and cancellation through the service's routes and the simulated provider.

Every collect and cancel outcome (partial, invalid, unavailable, large, failed; a
cancel confirmed, lost to a success, never confirmed, held before the job id) is
proven step by step in ``tests/steps/``. These tests run the service and the sim in
one process (``tests/support/world.py``: both apps over ``httpx.ASGITransport``, one
manual clock): a result fetched over HTTP and kept inline, a webhook arriving while a
fetch is out, a cancel confirmed by the provider, a cancel held until a delayed create
answer, and the API's answers to cancels it must refuse or ignore. A provider answer
that must stay out while the test acts is held at a ``Gate`` rather than for a time.
What the provider saw is read from the simulator, what the service decided from the
API and the history.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
from standardwebhooks import Webhook

from reconciler.core.collect import INLINE_RESULT_BYTES
from reconciler.demo.sim import FaultRates
from reconciler.demo.sim.lifecycle import job_snapshot, result_document
from reconciler.storage.tokens import create_token
from tests.support.stack import WEBHOOK_SECRET
from tests.support.world import World, world

FAST_POLLING = {"base_delay_seconds": 1, "max_delay_seconds": 5}
# Where a test counts provider calls exactly, no webhook may arrive mid-collection: a
# webhook note then makes the collect step's write stale and the fetch is repeated (see
# test_webhook_during_result_collection_does_not_fetch_again).
NO_WEBHOOKS = {"webhooks": "never"}


def run(tmp_path: Path, db_url: str, body: Callable[[World], Awaitable[None]], **options: Any):
    async def main() -> None:
        async with world(tmp_path, db_url, polling=FAST_POLLING, **options) as w:
            await body(w)

    asyncio.run(main())


async def finish(w: World, **request: Any) -> dict[str, Any]:
    op_id = await w.create(**request)
    await w.run_until(w.finished(op_id))
    op = await w.get(op_id)
    assert op["done"] is True, op
    return op


async def transitions(w: World, op_id: str) -> list[tuple[str | None, str]]:
    return [(e["from"], e["to"]) for e in await w.history(op_id) if e["kind"] == "transition"]


def sim_job(w: World, job_id: str) -> dict[str, Any]:
    return job_snapshot(w.sim.jobs[job_id], w.sim.now())


def sim_counts(w: World, op: dict[str, Any]) -> dict[str, int]:
    counts: dict[str, int] = sim_job(w, op["remote_job_id"])["counts"]
    return counts


# --- results ---------------------------------------------------------------------


def sign_webhook(w: World, event_id: str, body: bytes) -> dict[str, str]:
    now = w.now
    signature = Webhook(WEBHOOK_SECRET).sign(event_id, now, body.decode())
    return {
        "content-type": "application/json",
        "webhook-id": event_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": signature,
    }


def test_webhook_during_result_collection_does_not_fetch_again(tmp_path: Path, db_url: str):
    held_result = {"result": FaultRates(delay=1.0)}

    async def body(w: World) -> None:
        op_id = await w.create(scenario="success", duration=2, **NO_WEBHOOKS)

        def fetches() -> list[Any]:
            return [r for r in w.sim.requests if r.endpoint == "result"]

        # Step until the worker's result fetch is out and held at the provider.
        await w.run_until(lambda: w.gate.holding)
        assert len(fetches()) == 1 and w.row(op_id)["state"] == "result_collecting"
        job_id = w.row(op_id)["remote_job_id"]
        event = json.dumps(
            {"type": "job.succeeded", "id": "evt_late", "data": {"job_id": job_id}}
        ).encode()
        hinted = await w.client.post(
            "/webhooks/sim", content=event, headers=sign_webhook(w, "evt_late", event)
        )
        assert hinted.status_code == 200, hinted.text
        w.gate.open()
        await w.run_until(w.finished(op_id))
        assert (await w.get(op_id))["state"] == "succeeded"
        assert len(fetches()) == 1

    run(
        tmp_path,
        db_url,
        body,
        sim_config={"endpoint_faults": held_result},
        hold_delays=True,
    )


def test_small_result_is_inline(tmp_path: Path, db_url: str):
    async def body(w: World) -> None:
        op = await finish(w, scenario="success", duration=2)
        assert op["state"] == "succeeded"
        data = result_document(w.sim.jobs[op["remote_job_id"]])  # what the sim serves
        assert op["result"]["size"] == len(data) <= INLINE_RESULT_BYTES
        assert op["result"]["data"] == httpx.Response(200, content=data).json()

    run(tmp_path, db_url, body)


# --- cancellation ----------------------------------------------------------------


async def observing(w: World, **request: Any) -> dict[str, Any]:
    op_id = await w.create(**request)
    await w.run_until(w.in_state(op_id, "observing"))
    return await w.get(op_id)


def test_cancel_is_confirmed_by_the_provider(tmp_path: Path, db_url: str):
    async def body(w: World) -> None:
        op = await observing(w, scenario="slow_success", duration=300, cancel_delay=3)
        response = await w.cancel(op["id"], reason="not needed any more")
        assert response.status_code == 202
        assert response.json()["state"] == "cancel_requested"
        assert response.json()["done"] is False
        await w.run_until(w.finished(op["id"]))
        done = await w.get(op["id"])
        assert done["state"] == "cancelled" and done["done"] is True
        steps = await transitions(w, op["id"])
        at = steps.index(("observing", "cancel_requested"))
        assert steps[at:] == [
            ("observing", "cancel_requested"),
            ("cancel_requested", "cancelling"),
            ("cancelling", "cancelled"),
        ]
        assert sim_counts(w, done)["cancel"] == 1
        assert sim_job(w, done["remote_job_id"])["state"] == "cancelled"

    run(tmp_path, db_url, body)


def test_cancel_before_the_job_id_is_known_is_held_then_applied(tmp_path: Path, db_url: str):
    request = {
        "scenario": "slow_success",
        "duration": 300,
        "create_fault": "delay",
        "cancel_delay": 3,
    }

    async def body(w: World) -> None:
        op_id = await w.create(**request)
        # The create call has reached the provider; its answer (the job id) is held.
        await w.run_until(lambda: w.gate.holding)
        assert len(w.sim.jobs) == 1
        response = await w.cancel(op_id, reason="not needed any more")
        assert response.status_code == 202
        assert response.json()["state"] == "create_pending"
        assert response.json()["cancel_requested"] is True
        w.clock.advance(2)
        answered_from = w.sim.now()
        w.gate.open()
        await w.run_until(w.finished(op_id))
        done = await w.get(op_id)
        assert done["state"] == "cancelled"
        history = await w.history(op_id)
        held = [e for e in history if e["kind"] == "note" and e["cause"].startswith("cancel_req")]
        assert len(held) == 1 and "held" in held[0]["detail"]["note"]
        applied = [e for e in history if e["cause"] == "held_cancel_applied"]
        assert [(e["from"], e["to"]) for e in applied] == [("accepted", "cancel_requested")]
        (job,) = w.sim.jobs.values()  # one job: no duplicate create
        assert job.job_id == done["remote_job_id"]
        cancels = job.requests["cancel"]
        assert len(cancels) == 1
        assert cancels[0].at >= answered_from  # sent after the id was known

    run(tmp_path, db_url, body, hold_delays=True)


def test_cancel_of_a_finished_operation_changes_nothing(tmp_path: Path, db_url: str):
    async def body(w: World) -> None:
        op = await finish(w, scenario="success", duration=2)
        before = await w.history(op["id"])
        response = await w.cancel(op["id"], reason="not needed any more")
        assert response.status_code in (200, 202)
        assert response.json()["state"] == "succeeded"
        assert response.json()["cancel_requested"] is False
        await w.advance(60)
        assert await w.history(op["id"]) == before
        assert sim_counts(w, op)["cancel"] == 0

    run(tmp_path, db_url, body)


def test_cancel_of_another_agents_operation_is_not_found(tmp_path: Path, db_url: str):
    async def body(w: World) -> None:
        op = await observing(w, scenario="slow_success", duration=300)
        with w.runtime.db.write() as conn:
            other = create_token(conn, "agent-2", "agent", w.now)
        response = await w.cancel(op["id"], headers={"Authorization": f"Bearer {other}"})
        assert response.status_code == 404
        assert op["id"] not in response.text or "does not exist" in response.text
        await w.advance(60)
        after = await w.get(op["id"])
        assert after["cancel_requested"] is False
        assert after["state"] == "observing"
        assert sim_counts(w, after)["cancel"] == 0

    run(tmp_path, db_url, body)
