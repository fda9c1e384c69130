"""Result collection (partial, invalid, unavailable, large, failed) and cancellation.

What the provider saw is read from the simulator (request counts per job and
endpoint), what the service decided from the API and the operation's history.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from fixtures.provider_sim import FaultRates, SimConfig, SimState
from fixtures.provider_sim import create_app as create_sim
from standardwebhooks import Webhook

from reconciler.api.app import create_app
from reconciler.config import CallbackSettings, SchedulerSettings, Settings
from reconciler.core.clock import SystemClock
from reconciler.core.collect import INLINE_RESULT_BYTES, MAX_FAILED_ITEMS
from reconciler.runtime import Runtime
from reconciler.storage.tokens import create_token
from tests.support import hooks
from tests.support.hooks import wait_until
from tests.support.servers import serve_asgi
from tests.support.stack import (
    CALLBACK_SECRET,
    SIM_TOKEN,
    WEBHOOK_SECRET,
    Stack,
    make_tokens,
    running_stack,
    sim_provider_table,
)

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


def test_partial_result_reports_counts_and_a_bounded_list_of_failed_items(
    tmp_path: Path, db_url: str
):
    with stack_for(tmp_path, db_url) as stack:
        request = {"scenario": "partial", "duration": 0.3, "total": 200, "failed_items": 60}
        op = finish(stack, request)
        assert op["state"] == "completed_with_errors"
        assert "FINISHED WITH ERRORS" in op["message"]
        result = op["result"]
        assert result["summary"] == {"processed": 200, "failed": 60}
        assert len(result["failed_items"]) == MAX_FAILED_ITEMS < 60
        assert result["failed_items_truncated"] is True
        provider_refs = result["data"]["errors"]
        assert result["failed_items"] == provider_refs[:MAX_FAILED_ITEMS]
        assert op["error"] is None


@pytest.mark.parametrize(
    ("fault", "problem"),
    [
        ("checksum_mismatch", "SHA-256 does not match"),
        ("size_mismatch", "the status says"),
        ("missing_rows", "required field /rows is missing"),
        ("wrong_content_type", "content type"),
    ],
)
def test_invalid_result_ends_result_validation_failed(
    tmp_path: Path, db_url: str, fault: str, problem: str
):
    with stack_for(tmp_path, db_url) as stack:
        request = {"scenario": "success", "duration": 0.2, "result_fault": fault, **NO_WEBHOOKS}
        op = finish(stack, request)
        assert op["state"] == "result_validation_failed"
        assert op["result"] is None
        assert op["error"]["code"] == "result_invalid"
        assert any(problem in p for p in op["error"]["problems"]), op["error"]
        assert sim_counts(stack, op)["result"] == 1


def test_result_fetch_failures_end_unavailable_after_the_retry_budget(tmp_path: Path, db_url: str):
    budget = 3
    faults = {"result": FaultRates(server_error=1.0)}
    with stack_for(
        tmp_path,
        db_url,
        provider={"polling": {**FAST_POLLING, "max_transport_failures": budget}},
        sim_config={"endpoint_faults": faults},
    ) as stack:
        op = finish(stack, {"scenario": "success", "duration": 0.2, **NO_WEBHOOKS})
        assert op["state"] == "result_unavailable"
        assert op["error"]["code"] == "result_unavailable"
        assert op["error"]["attempts"] == budget
        assert op["error"]["detail"]["http_status"] in (500, 502, 503)
        assert sim_counts(stack, op)["result"] == budget
        fetches = [e for e in stack.history(op["id"]) if e["cause"] == "result_fetch"]
        assert len(fetches) == budget


def test_missing_result_ends_result_unavailable(tmp_path: Path, db_url: str):
    """The provider answers 404 for the result: it ends unavailable, within the fetch budget."""
    budget = 3
    polling = {**FAST_POLLING, "max_transport_failures": budget}
    with stack_for(tmp_path, db_url, provider={"polling": polling}) as stack:
        request = {"scenario": "success", "duration": 0.2, "result_fault": "unavailable"}
        op = finish(stack, {**request, **NO_WEBHOOKS})
        assert op["state"] == "result_unavailable"
        assert op["error"]["detail"]["http_status"] == 404
        assert 1 <= sim_counts(stack, op)["result"] <= budget
        assert op["result"] is None


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


def test_large_result_is_kept_as_a_reference_with_sha256_and_size(tmp_path: Path, db_url: str):
    with stack_for(tmp_path, db_url) as stack:
        request = {"scenario": "partial", "duration": 0.2, "total": 10000, "failed_items": 5000}
        op = finish(stack, request)
        assert op["state"] == "completed_with_errors"
        result = op["result"]
        data = sim_result_bytes(stack, op["remote_job_id"])
        assert len(data) > INLINE_RESULT_BYTES
        assert "data" not in result  # not inline
        assert result["size"] == len(data)
        assert result["sha256"] == hashlib.sha256(data).hexdigest()
        assert result["ref"].endswith(f"/v1/jobs/{op['remote_job_id']}/result")
        assert len(result["failed_items"]) == MAX_FAILED_ITEMS


def test_small_result_is_inline(tmp_path: Path, db_url: str):
    with stack_for(tmp_path, db_url) as stack:
        op = finish(stack, {"scenario": "success", "duration": 0.2})
        assert op["state"] == "succeeded"
        data = sim_result_bytes(stack, op["remote_job_id"])
        assert op["result"]["size"] == len(data) <= INLINE_RESULT_BYTES
        assert op["result"]["data"] == httpx.Response(200, content=data).json()


def test_provider_failure_ends_failed_with_the_provider_error(tmp_path: Path, db_url: str):
    error = {"code": "quota_exceeded", "message": "Monthly quota used up at item 17."}
    with stack_for(tmp_path, db_url) as stack:
        op = finish(stack, {"scenario": "late_failure", "duration": 0.3, "error": error})
        assert op["state"] == "failed"
        assert op["error"]["code"] == "provider_failed"
        assert op["error"]["provider_error"] == error
        assert op["remote_state"] == "failed"
        assert op["result"] is None
        assert sim_counts(stack, op)["result"] == 0


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


def test_cancel_race_reports_the_jobs_own_outcome(tmp_path: Path, db_url: str):
    with stack_for(tmp_path, db_url) as stack:
        request = {"scenario": "success", "duration": 3.0, "cancel": "race", "cancel_delay": 10}
        op = observing(stack, request)
        assert cancel(stack, op["id"]).status_code == 202
        done = stack.wait(op["id"], timeout=20)
        # The job passed its commit point: it succeeded, and that is what is reported.
        assert done["state"] == "succeeded"
        assert done["cancel_requested"] is True
        assert done["result"]["sha256"]
        steps = transitions(stack, op["id"])
        assert ("observing", "cancel_requested") in steps
        assert ("cancel_requested", "cancelling") in steps
        assert steps[-2:] == [
            ("cancelling", "result_collecting"),
            ("result_collecting", "succeeded"),
        ]
        assert sim_counts(stack, done)["cancel"] == 1
        sim_states = [t["state"] for t in stack.sim_job(done["remote_job_id"])["timeline"]]
        assert sim_states[-2:] == ["cancelling", "succeeded"]


def test_cancel_never_confirmed_ends_cancellation_unconfirmed(tmp_path: Path, db_url: str):
    with stack_for(
        tmp_path, db_url, provider={"cancel": {"cancel_deadline_seconds": 1.0}}
    ) as stack:
        op = observing(stack, {"scenario": "never_finishes", "cancel": "never"})
        assert cancel(stack, op["id"]).status_code == 202
        done = stack.wait(op["id"], timeout=20)
        assert done["state"] == "cancellation_unconfirmed" and done["done"] is True
        escalation = stack.get(op["id"], operator=True)["escalation"]
        assert escalation["reason"] == "cancellation_unconfirmed"
        assert sim_counts(stack, done)["cancel"] == 1
        assert stack.sim_job(done["remote_job_id"])["state"] == "cancelling"


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


def test_cancel_while_the_create_is_in_flight_sends_one_create(tmp_path: Path, db_url: str):
    request = {"scenario": "slow_success", "duration": 30, "create_fault": "delay"}
    with stack_for(tmp_path, db_url) as stack:
        op = start(stack, {**request, "create_delay": 1.0, "cancel_delay": 0.3})
        wait_until(lambda: len(stack.sim.jobs) == 1, 10, "the create call to arrive")
        assert cancel(stack, op["id"]).status_code == 202
        assert stack.wait(op["id"], timeout=20)["state"] == "cancelled"
        assert [r.endpoint for r in stack.sim.requests].count("create") == 1


def test_cancel_before_the_create_was_sent_sends_nothing(
    tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch
):
    log = tmp_path / "hooks.log"
    monkeypatch.setenv(hooks.LOG_ENV, str(log))
    sim = SimState(SimConfig(token=SIM_TOKEN, webhook_secret=WEBHOOK_SECRET))
    environ = {
        "SIM_TOKEN": SIM_TOKEN,
        "SIM_WEBHOOK_SECRETS": WEBHOOK_SECRET,
        "RECONCILER_CALLBACK_SECRET": CALLBACK_SECRET,
    }
    (tmp_path / "providers").mkdir()
    with serve_asgi(create_sim(state=sim)) as sim_url:
        settings = Settings(
            database_url=db_url,
            providers_dir=str(tmp_path / "providers"),
            providers={"sim": sim_provider_table(sim_url)},
            hooks=(hooks.RECORD,),
            scheduler=SchedulerSettings(tick_seconds=0.2),
            callbacks=CallbackSettings(allow_hosts=("127.0.0.1",)),
        )
        api_only = Runtime.build(settings, environ=environ)
        agent, operator = make_tokens(api_only)
        with serve_asgi(create_app(api_only, background=False)) as url:
            stack = Stack(url, sim_url, sim, api_only, agent, operator)
            op = start(stack, {"scenario": "success", "duration": 0.2})
            assert op["state"] == "create_pending"
            response = cancel(stack, op["id"])
            assert response.status_code == 202
            assert response.json()["state"] == "cancelled"  # nothing exists remotely
            # Now a worker starts on the same database.
            with serve_asgi(create_app(Runtime.build(settings, environ=environ))):
                wait_until(
                    lambda: hooks.completion_finished(api_only.db, op["id"]), 10, "completion"
                )
            final = stack.get(op["id"])
            stack.client.close()
        assert final["state"] == "cancelled" and final["remote_job_id"] is None
        assert [r.endpoint for r in sim.requests] == []
        assert sim.jobs == {}
        # The worker did look at it: the completion hook ran once, on the cancelled operation.
        assert [(r.op_id, r.state) for r in hooks.read_runs(log)] == [(op["id"], "cancelled")]


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
