"""Result collection and cancellation through the real service and the simulated provider.

Every collect and cancel outcome (partial, invalid, unavailable, large, failed; a
cancel confirmed, lost to a success, never confirmed, held before the job id) is
proven step by step in ``tests/steps/``. These tests keep the real thing: a result
fetched over HTTP and kept inline, a webhook arriving while a slow fetch is out, a
cancel confirmed by the provider, a cancel held until a delayed create answer, and
the API's answers to cancels it must refuse or ignore. What the provider saw is read
from the simulator, what the service decided from the API and the history.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from fixtures.provider_sim import FaultRates
from standardwebhooks import Webhook

from reconciler.core.clock import SystemClock
from reconciler.core.collect import INLINE_RESULT_BYTES
from reconciler.storage.tokens import create_token
from tests.support import hooks
from tests.support.stack import (
    SIM_TOKEN,
    WEBHOOK_SECRET,
    Stack,
    running_stack,
)
from tests.support.waiting import wait_until

FAST_POLLING = {"base_delay_seconds": 0.05, "max_delay_seconds": 0.2}
# Where a test counts provider calls exactly, no webhook may arrive mid-collection: a
# webhook note then makes the collect step's write stale and the fetch is repeated (see
# test_webhook_during_result_collection_does_not_fetch_again).
NO_WEBHOOKS = {"webhooks": "never"}


@contextmanager
def stack_for(tmp_path: Path, db_url: str, **kwargs: Any) -> Iterator[Stack]:
    provider = {"polling": FAST_POLLING, **kwargs.pop("provider", {})}
    with running_stack(tmp_path, db_url, provider=provider, **kwargs) as stack:
        yield stack


def start(stack: Stack, request: dict[str, Any]) -> dict[str, Any]:
    response = stack.create(request)
    assert response.status_code == 202, response.text
    op: dict[str, Any] = response.json()
    return op


def finish(stack: Stack, request: dict[str, Any]) -> dict[str, Any]:
    op = stack.wait(start(stack, request)["id"], timeout=20)
    assert op["done"] is True, op
    return op


def transitions(stack: Stack, op_id: str) -> list[tuple[str | None, str]]:
    return [(e["from"], e["to"]) for e in stack.history(op_id) if e["kind"] == "transition"]


def sim_counts(stack: Stack, op: dict[str, Any]) -> dict[str, int]:
    counts: dict[str, int] = stack.sim_job(op["remote_job_id"])["counts"]
    return counts


def sim_result_bytes(stack: Stack, job_id: str) -> bytes:
    response = httpx.get(
        f"{stack.sim_url}/v1/jobs/{job_id}/result",
        headers={"Authorization": f"Bearer {SIM_TOKEN}"},
        timeout=10,
    )
    response.raise_for_status()
    return response.content


# --- results ---------------------------------------------------------------------


def sign_webhook(event_id: str, body: bytes) -> dict[str, str]:
    now = datetime.now(UTC)
    signature = Webhook(WEBHOOK_SECRET).sign(event_id, now, body.decode())
    return {
        "content-type": "application/json",
        "webhook-id": event_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": signature,
    }


def test_webhook_during_result_collection_does_not_fetch_again(tmp_path: Path, db_url: str):
    slow_result = {"result": FaultRates(delay=1.0, delay_seconds=1.0)}
    with stack_for(tmp_path, db_url, sim_config={"endpoint_faults": slow_result}) as stack:
        op = start(stack, {"scenario": "success", "duration": 0.2, **NO_WEBHOOKS})

        def fetches() -> list[Any]:
            return [r for r in stack.sim.requests if r.endpoint == "result"]

        wait_until(lambda: len(fetches()) == 1, 10, "the result fetch to be in flight")
        job_id = stack.get(op["id"])["remote_job_id"]
        body = json.dumps(
            {"type": "job.succeeded", "id": "evt_late", "data": {"job_id": job_id}}
        ).encode()
        hinted = stack.client.post(
            "/webhooks/sim", content=body, headers=sign_webhook("evt_late", body)
        )
        assert hinted.status_code == 200, hinted.text
        done = stack.wait(op["id"], timeout=20)
        assert done["state"] == "succeeded"
        assert len(fetches()) == 1


def test_small_result_is_inline(tmp_path: Path, db_url: str):
    with stack_for(tmp_path, db_url) as stack:
        op = finish(stack, {"scenario": "success", "duration": 0.2})
        assert op["state"] == "succeeded"
        data = sim_result_bytes(stack, op["remote_job_id"])
        assert op["result"]["size"] == len(data) <= INLINE_RESULT_BYTES
        assert op["result"]["data"] == httpx.Response(200, content=data).json()


# --- cancellation ----------------------------------------------------------------


def cancel(stack: Stack, op_id: str, headers: dict[str, str] | None = None) -> httpx.Response:
    return stack.client.post(
        f"/v1/operations/{op_id}/cancel",
        json={"reason": "not needed any more"},
        headers=headers or stack.headers(),
    )


def observing(stack: Stack, request: dict[str, Any]) -> dict[str, Any]:
    op = start(stack, request)
    op = stack.wait_state(op["id"], {"observing"}, timeout=10)
    assert op["state"] == "observing", op
    return op


def test_cancel_is_confirmed_by_the_provider(tmp_path: Path, db_url: str):
    with stack_for(tmp_path, db_url) as stack:
        op = observing(stack, {"scenario": "slow_success", "duration": 30, "cancel_delay": 0.3})
        response = cancel(stack, op["id"])
        assert response.status_code == 202
        assert response.json()["state"] == "cancel_requested"
        assert response.json()["done"] is False
        done = stack.wait(op["id"], timeout=20)
        assert done["state"] == "cancelled" and done["done"] is True
        steps = transitions(stack, op["id"])
        at = steps.index(("observing", "cancel_requested"))
        assert steps[at:] == [
            ("observing", "cancel_requested"),
            ("cancel_requested", "cancelling"),
            ("cancelling", "cancelled"),
        ]
        assert sim_counts(stack, done)["cancel"] == 1
        assert stack.sim_job(done["remote_job_id"])["state"] == "cancelled"


def test_cancel_before_the_job_id_is_known_is_held_then_applied(tmp_path: Path, db_url: str):
    create_delay = 1.5
    request = {
        "scenario": "slow_success",
        "duration": 30,
        "create_fault": "delay",
        "create_delay": create_delay,
        "cancel_delay": 0.3,
    }
    with stack_for(tmp_path, db_url) as stack:
        op = start(stack, request)
        # The create call has reached the provider; its answer (the job id) has not come back.
        wait_until(lambda: len(stack.sim.jobs) == 1, 10, "the create call to arrive")
        response = cancel(stack, op["id"])
        assert response.status_code == 202
        assert response.json()["state"] == "create_pending"
        assert response.json()["cancel_requested"] is True
        done = stack.wait(op["id"], timeout=20)
        assert done["state"] == "cancelled"
        history = stack.history(op["id"])
        held = [e for e in history if e["kind"] == "note" and e["cause"].startswith("cancel_req")]
        assert len(held) == 1 and "held" in held[0]["detail"]["note"]
        applied = [e for e in history if e["cause"] == "held_cancel_applied"]
        assert [(e["from"], e["to"]) for e in applied] == [("accepted", "cancel_requested")]
        (job,) = stack.sim.jobs.values()  # one job: no duplicate create
        assert job.job_id == done["remote_job_id"]
        cancels = job.requests["cancel"]
        assert len(cancels) == 1
        assert cancels[0].at >= job.created_at + create_delay - 0.01  # after the id was known


def test_cancel_of_a_finished_operation_changes_nothing(tmp_path: Path, db_url: str):
    with stack_for(tmp_path, db_url) as stack:
        op = finish(stack, {"scenario": "success", "duration": 0.2})
        wait_until(lambda: hooks.completion_finished(stack.runtime.db, op["id"]), 10, "completion")
        before = stack.history(op["id"])
        response = cancel(stack, op["id"])
        assert response.status_code in (200, 202)
        assert response.json()["state"] == "succeeded"
        assert response.json()["cancel_requested"] is False
        assert stack.history(op["id"]) == before
        assert sim_counts(stack, op)["cancel"] == 0


def test_cancel_of_another_agents_operation_is_not_found(tmp_path: Path, db_url: str):
    with stack_for(tmp_path, db_url) as stack:
        op = observing(stack, {"scenario": "slow_success", "duration": 30})
        with stack.runtime.db.write() as conn:
            other = create_token(conn, "agent-2", "agent", SystemClock().now())
        response = cancel(stack, op["id"], headers={"Authorization": f"Bearer {other}"})
        assert response.status_code == 404
        assert op["id"] not in response.text or "does not exist" in response.text
        after = stack.get(op["id"])
        assert after["cancel_requested"] is False
        assert after["state"] == "observing"
        assert sim_counts(stack, after)["cancel"] == 0
