"""The simulated provider: every scenario's lifecycle, driven in-process on a fake clock."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from datetime import datetime
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from reconciler.demo.sim import (
    ConnectionDropped,
    FaultConfigError,
    FaultRates,
    SimConfig,
    SimState,
    create_app,
)
from reconciler.demo.sim.__main__ import parse_fault_flags
from tests.support import loopback
from tests.support.waiting import wait_until

pytestmark = pytest.mark.anyio

SECRET = "whsec_" + base64.b64encode(b"provider-sim-test-secret-32bytes").decode()
HOOK_URL = "http://receiver.test/webhooks/sim"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class FakeTime:
    """Epoch seconds that move only when told (starting near real time, so signatures verify)."""

    def __init__(self) -> None:
        self.t = float(int(time.time()))

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


class Receiver:
    """The webhook endpoint, as an httpx MockTransport: records requests, answers by script."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []
        self.script: list[int] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return httpx.Response(self.script.pop(0) if self.script else 204)

    def events(self) -> list[dict[str, Any]]:
        return [Webhook(SECRET).verify(r.content, dict(r.headers)) for r in self.requests]


class Harness:
    def __init__(self, **config: Any) -> None:
        self.time = FakeTime()
        self.sleeps: list[float] = []
        self.receiver = Receiver()

        async def fake_sleep(seconds: float) -> None:
            self.sleeps.append(seconds)
            self.time.advance(seconds)

        settings: dict[str, Any] = {
            "now": self.time,
            "sleep": fake_sleep,
            "webhook_url": HOOK_URL,
            "webhook_secret": SECRET,
            "webhook_transport": httpx.MockTransport(self.receiver.handle),
        }
        settings.update(config)
        self.sim = SimState(SimConfig(**settings))
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(create_app(state=self.sim)), base_url="http://sim"
        )

    async def create(self, key: str = "key-1", **body: Any) -> httpx.Response:
        headers = {"Idempotency-Key": key, "X-Trace-ID": f"trace-{key}"}
        return await self.client.post("/v1/jobs", json=body, headers=headers)

    async def start(self, key: str = "key-1", **body: Any) -> str:
        response = await self.create(key, **body)
        assert response.status_code == 202, response.text
        return str(response.json()["job_id"])

    async def status(self, job_id: str) -> httpx.Response:
        return await self.client.get(f"/v1/jobs/{job_id}")

    async def state(self, job_id: str) -> str:
        response = await self.status(job_id)
        assert response.status_code == 200, response.text
        return str(response.json()["state"])

    async def later(self, seconds: float) -> None:
        self.time.advance(seconds)
        await self.sim.pump()

    async def __aenter__(self) -> Harness:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.aclose()
        await self.sim.aclose()


@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    async with Harness() as harness:
        yield harness


def parsedate_rfc3339(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


# --- create, idempotency, lookup ------------------------------------------------------


async def test_create_answers_202_queued_with_location(h: Harness) -> None:
    response = await h.create(scenario="slow_success", duration=4)
    body = response.json()
    assert response.status_code == 202
    assert body["state"] == "queued" and body["job_id"].startswith("job_")
    assert body["status_url"] == response.headers["location"] == f"/v1/jobs/{body['job_id']}"
    assert h.sim.jobs[body["job_id"]].body == {"scenario": "slow_success", "duration": 4}


async def test_same_key_same_body_is_the_same_job(h: Harness) -> None:
    first = await h.start("k", scenario="success", input="a")
    replay = await h.create("k", scenario="success", input="a")
    assert replay.status_code == 202 and replay.json()["job_id"] == first
    assert len(h.sim.jobs) == 1
    keyed = (await h.client.get("/_sim/keys/k")).json()
    assert [j["job_id"] for j in keyed["jobs"]] == [first]
    assert [r["endpoint"] for r in keyed["requests"]] == ["create", "create"]


async def test_same_key_different_body_is_409(h: Harness) -> None:
    await h.start("k", input="a")
    conflict = await h.create("k", input="b")
    assert conflict.status_code == 409
    assert conflict.json()["error"]["code"] == "idempotency_key_reused"
    assert len(h.sim.jobs) == 1


async def test_missing_key_and_bad_scenario_are_refused(h: Harness) -> None:
    no_key = await h.client.post("/v1/jobs", json={})
    assert no_key.status_code == 400
    bad = await h.create(scenario="teleport")
    assert bad.status_code == 422 and "scenario" in bad.json()["error"]["message"]
    assert (await h.create(duration=-1)).status_code == 422
    assert h.sim.jobs == {}


async def test_a_provider_that_ignores_keys_makes_a_second_job() -> None:
    async with Harness(honor_idempotency=False) as harness:
        await harness.start("k")
        await harness.start("k")
        assert len(harness.sim.jobs_for_key("k")) == 2


async def test_lookup_by_idempotency_key(h: Harness) -> None:
    job_id = await h.start("k")
    found = (await h.client.get("/v1/jobs", params={"idempotency_key": "k"})).json()
    assert found["data"][0]["job_id"] == job_id
    missing = (await h.client.get("/v1/jobs", params={"idempotency_key": "other"})).json()
    assert missing == {"data": []}
    assert (await h.client.get("/v1/jobs")).status_code == 400


# --- lifecycles -----------------------------------------------------------------------


async def test_slow_success_progress_rises_then_result_matches_reference(h: Harness) -> None:
    job_id = await h.start(scenario="slow_success", duration=10, total=50)
    seen = []
    for _ in range(4):
        await h.later(2)
        body = (await h.status(job_id)).json()
        assert body["state"] == "running" and "result" not in body
        seen.append(body["progress"]["completed"])
    assert seen == sorted(seen) and seen[0] < seen[-1] < 50
    await h.later(2)
    body = (await h.status(job_id)).json()
    assert body["state"] == "succeeded"
    assert body["progress"] == {"completed": 50, "total": 50}
    result = await h.client.get(body["result"]["url"])
    assert result.headers["content-type"] == "application/json"
    assert hashlib.sha256(result.content).hexdigest() == body["result"]["sha256"]
    assert len(result.content) == body["result"]["size"]
    assert result.json()["summary"] == {"processed": 50, "failed": 0}
    assert len(result.json()["rows"]) == 50


async def test_result_before_the_end_is_409(h: Harness) -> None:
    job_id = await h.start(scenario="slow_success")
    response = await h.client.get(f"/v1/jobs/{job_id}/result")
    assert response.status_code == 409 and response.json()["error"]["code"] == "not_ready"


async def test_late_failure_keeps_running_then_fails_with_error_body(h: Harness) -> None:
    error = {"code": "codec_unsupported", "message": "HEVC 12-bit is not supported"}
    job_id = await h.start(scenario="late_failure", duration=6, error=error)
    for _ in range(3):
        await h.later(1.5)
        assert await h.state(job_id) == "running"
    await h.later(2)
    body = (await h.status(job_id)).json()
    assert body["state"] == "failed" and body["error"] == error and "result" not in body
    assert body["progress"]["completed"] < body["progress"]["total"]


async def test_partial_result_has_counts_and_failed_item_refs(h: Harness) -> None:
    job_id = await h.start(scenario="partial", total=20, failed_items=4)
    await h.later(3)
    body = (await h.status(job_id)).json()
    assert body["state"] == "completed_with_errors"
    assert body["summary"] == {"processed": 20, "failed": 4}
    doc = (await h.client.get(f"/v1/jobs/{job_id}/result")).json()
    assert doc["summary"] == {"processed": 20, "failed": 4}
    assert len(doc["errors"]) == 4 and len(doc["rows"]) == 16
    assert not set(doc["errors"]) & {row["item"] for row in doc["rows"]}


async def test_unknown_state(h: Harness) -> None:
    job_id = await h.start(scenario="unknown_state", weird_state="on_hold", duration=1)
    await h.later(1)
    assert await h.state(job_id) == "on_hold"


async def test_never_finishes_reports_full_progress_while_running(h: Harness) -> None:
    job_id = await h.start(scenario="never_finishes", duration=5)
    await h.later(3600)
    body = (await h.status(job_id)).json()
    assert body["state"] == "running"
    assert body["progress"]["completed"] == body["progress"]["total"]


async def test_running_past_expiry_shows_expires_at_in_the_past(h: Harness) -> None:
    job_id = await h.start(scenario="running_past_expiry")
    await h.later(1)
    body = (await h.status(job_id)).json()
    expires = parsedate_rfc3339(body["expires_at"])
    assert body["state"] == "running" and expires < h.time()


async def test_success_without_result_reference(h: Harness) -> None:
    job_id = await h.start(scenario="success_without_result")
    await h.later(2)
    body = (await h.status(job_id)).json()
    assert body["state"] == "succeeded" and "result" not in body
    assert (await h.client.get(f"/v1/jobs/{job_id}/result")).status_code == 404


async def test_result_faults(h: Harness) -> None:
    bad_sum = await h.start("a", result_fault="checksum_mismatch")
    bad_type = await h.start("b", result_fault="wrong_content_type")
    await h.later(2)
    reference = (await h.status(bad_sum)).json()["result"]
    fetched = await h.client.get(reference["url"])
    assert hashlib.sha256(fetched.content).hexdigest() != reference["sha256"]
    typed = await h.client.get(f"/v1/jobs/{bad_type}/result")
    assert typed.headers["content-type"].startswith("text/plain")


async def test_poll_hints_are_passed_through_verbatim(h: Harness) -> None:
    valid = await h.start("a", poll_after_seconds=3, next_check_in=10)
    negative = await h.start("b", poll_after_seconds=-5)
    garbage = await h.start("c", poll_after_seconds="soon", next_check_at="tomorrow-ish")
    body = (await h.status(valid)).json()
    assert body["poll_after_seconds"] == 3
    assert parsedate_rfc3339(body["next_check_at"]) == pytest.approx(h.time() + 10, abs=0.01)
    assert (await h.status(negative)).json()["poll_after_seconds"] == -5
    odd = (await h.status(garbage)).json()
    assert odd["poll_after_seconds"] == "soon" and odd["next_check_at"] == "tomorrow-ish"
    await h.later(2)
    assert "poll_after_seconds" not in (await h.status(valid)).json()


# --- faults on status reads, auth, visibility, create ---------------------------------


async def test_429_for_first_reads_with_retry_after_seconds(h: Harness) -> None:
    job_id = await h.start(status_fault=429, status_fault_count=2, retry_after=7)
    for _ in range(2):
        response = await h.status(job_id)
        assert response.status_code == 429 and response.headers["retry-after"] == "7"
    assert (await h.status(job_id)).status_code == 200
    snapshot = (await h.client.get(f"/_sim/jobs/{job_id}")).json()
    assert [r["status"] for r in snapshot["requests"]["status"]] == [429, 429, 200]
    assert snapshot["counts"]["status"] == 3


async def test_503_on_every_read_with_retry_after_http_date(h: Harness) -> None:
    job_id = await h.start(status_fault=503, retry_after=30, retry_after_form="http-date")
    for _ in range(3):
        await h.later(1)
        response = await h.status(job_id)
        assert response.status_code == 503
        when = parsedate_to_datetime(response.headers["retry-after"]).timestamp()
        assert h.time() + 30 <= when < h.time() + 31


async def test_bearer_token_required_when_configured() -> None:
    async with Harness(token="sim-token") as harness:
        missing = await harness.create()
        assert missing.status_code == 401 and harness.sim.jobs == {}
        wrong = await harness.client.post(
            "/v1/jobs", json={}, headers={"Idempotency-Key": "k", "Authorization": "Bearer x"}
        )
        assert wrong.status_code == 401
        ok = await harness.client.post(
            "/v1/jobs",
            json={},
            headers={"Idempotency-Key": "k", "Authorization": "Bearer sim-token"},
        )
        assert ok.status_code == 202


async def test_scenario_forces_403_after_some_reads(h: Harness) -> None:
    job_id = await h.start(auth_fault=403, auth_fault_after=1)
    assert (await h.status(job_id)).status_code == 200
    assert (await h.status(job_id)).status_code == 403
    assert (await h.client.post(f"/v1/jobs/{job_id}/cancel")).status_code == 403


async def test_404_before_the_job_becomes_visible(h: Harness) -> None:
    job_id = await h.start("k", invisible_for=5)
    assert (await h.status(job_id)).status_code == 404
    assert (await h.client.get("/v1/jobs", params={"idempotency_key": "k"})).json()["data"] == []
    await h.later(5)
    assert (await h.status(job_id)).status_code == 200
    assert (await h.status("job_nonexistent")).status_code == 404
    counts = (await h.client.get(f"/_sim/jobs/{job_id}")).json()["counts"]
    assert counts["status"] == 2 and counts["lookup"] == 0


async def test_dropped_create_still_made_the_job(h: Harness) -> None:
    with pytest.raises(httpx.RemoteProtocolError):
        await h.create("k", create_fault="drop")
    jobs = h.sim.jobs_for_key("k")
    assert len(jobs) == 1
    assert h.sim.requests[-1].status is None and h.sim.requests[-1].fault == "drop"
    found = (await h.client.get("/v1/jobs", params={"idempotency_key": "k"})).json()
    assert found["data"][0]["job_id"] == jobs[0].job_id
    replay = await h.create("k", create_fault="drop")
    assert replay.status_code == 202 and replay.json()["job_id"] == jobs[0].job_id


async def test_delayed_create_answers_late_and_500_after_create(h: Harness) -> None:
    late = await h.create("a", create_fault="delay", create_delay=12)
    assert late.status_code == 202 and h.sleeps == [12]
    failed = await h.create("b", create_fault="500_after_create")
    assert failed.status_code == 500 and len(h.sim.jobs_for_key("b")) == 1


async def test_create_refused_with_401_or_403_makes_nothing(h: Harness) -> None:
    assert (await h.create("a", create_fault="unauthorized")).status_code == 401
    assert (await h.create("b", create_fault="forbidden")).status_code == 403
    assert h.sim.jobs == {}
    assert [r.fault for r in h.sim.requests] == ["unauthorized", "forbidden"]


# --- cancel ---------------------------------------------------------------------------


async def test_cancel_goes_cancelling_then_cancelled(h: Harness) -> None:
    job_id = await h.start(scenario="slow_success", cancel_delay=2)
    await h.later(1)
    response = await h.client.post(f"/v1/jobs/{job_id}/cancel")
    assert response.status_code == 202 and response.json()["state"] == "cancelling"
    assert await h.state(job_id) == "cancelling"
    await h.later(2)
    assert await h.state(job_id) == "cancelled"
    again = await h.client.post(f"/v1/jobs/{job_id}/cancel")
    assert again.status_code == 409 and again.json()["error"]["state"] == "cancelled"


async def test_cancel_race_completes_anyway(h: Harness) -> None:
    job_id = await h.start(scenario="success", duration=3, cancel="race", cancel_delay=10)
    await h.later(2)
    assert (await h.client.post(f"/v1/jobs/{job_id}/cancel")).status_code == 202
    assert await h.state(job_id) == "cancelling"
    await h.later(1)
    assert await h.state(job_id) == "succeeded"


async def test_unconfirmed_cancel_stays_cancelling(h: Harness) -> None:
    job_id = await h.start(scenario="never_finishes", cancel="never")
    await h.client.post(f"/v1/jobs/{job_id}/cancel")
    await h.later(3600)
    assert await h.state(job_id) == "cancelling"


async def test_forced_completion_through_the_control_api(h: Harness) -> None:
    job_id = await h.start(scenario="never_finishes")
    forced = await h.client.post(f"/_sim/jobs/{job_id}/complete", json={"state": "failed"})
    assert forced.status_code == 200 and forced.json()["state"] == "failed"
    assert await h.state(job_id) == "failed"


# --- webhooks -------------------------------------------------------------------------


async def test_webhooks_are_signed_and_verify_with_standardwebhooks(h: Harness) -> None:
    job_id = await h.start(scenario="success", duration=2)
    await h.later(0.1)
    await h.later(2)
    events = h.receiver.events()
    assert [e["type"] for e in events] == ["job.running", "job.succeeded"]
    assert all(e["data"]["job_id"] == job_id for e in events)
    request = h.receiver.requests[-1]
    assert request.headers["webhook-id"] == events[-1]["id"]
    with pytest.raises(WebhookVerificationError):
        Webhook("whsec_" + base64.b64encode(b"x" * 32).decode()).verify(
            request.content, dict(request.headers)
        )
    attempts = (await h.client.get("/_sim/deliveries")).json()["attempts"]
    assert [a["status"] for a in attempts] == [204, 204]


async def test_duplicate_mode_repeats_one_event_id(h: Harness) -> None:
    await h.start(duplicates=3, webhooks="duplicate", webhook_on_running=False)
    await h.later(2)
    ids = [r.headers["webhook-id"] for r in h.receiver.requests]
    assert len(ids) == 3 and len(set(ids)) == 1
    assert {e["type"] for e in h.receiver.events()} == {"job.succeeded"}


async def test_early_lie_arrives_while_status_still_says_running(h: Harness) -> None:
    job_id = await h.start(
        duration=10, webhooks="early_lie", early_lie_lead=4, webhook_on_running=False
    )
    await h.later(6)
    assert [e["type"] for e in h.receiver.events()] == ["job.succeeded"]
    assert await h.state(job_id) == "running"
    await h.later(4)
    assert await h.state(job_id) == "succeeded"
    assert len(h.receiver.requests) == 1


async def test_early_lie_even_when_the_job_fails(h: Harness) -> None:
    job_id = await h.start(scenario="late_failure", duration=5, webhooks="early_lie")
    await h.later(5)
    assert "job.succeeded" in [e["type"] for e in h.receiver.events()]
    assert await h.state(job_id) == "failed"


async def test_out_of_order_sends_stale_running_after_the_terminal_event(h: Harness) -> None:
    await h.start(duration=5, webhooks="out_of_order")
    await h.later(5)
    events = h.receiver.events()
    assert [e["type"] for e in events] == ["job.succeeded", "job.running"]
    stamps = [int(r.headers["webhook-timestamp"]) for r in h.receiver.requests]
    assert stamps[1] < stamps[0]


async def test_delayed_webhooks_arrive_late(h: Harness) -> None:
    await h.start(duration=1, webhooks="delayed", webhook_delay=30, webhook_on_running=False)
    await h.later(1)
    await h.later(20)
    assert h.receiver.requests == []
    await h.later(10)
    assert [e["type"] for e in h.receiver.events()] == ["job.succeeded"]


async def test_never_mode_sends_nothing(h: Harness) -> None:
    job_id = await h.start(duration=1, webhooks="never")
    await h.later(5)
    assert h.receiver.requests == [] and await h.state(job_id) == "succeeded"


async def test_failed_deliveries_retry_three_times_at_most(h: Harness) -> None:
    h.receiver.script = [500, 503, 500, 500]
    await h.start(duration=1, webhook_on_running=False)
    for _ in range(6):
        await h.later(5)
    attempts = h.sim.outbox.attempts
    assert [a.status for a in attempts] == [500, 503, 500]
    assert [a.attempt for a in attempts] == [1, 2, 3]
    assert h.sim.outbox.pending == []


async def test_retry_succeeds_on_the_second_attempt(h: Harness) -> None:
    h.receiver.script = [502]
    await h.start(duration=1, webhook_on_running=False)
    await h.later(1)
    await h.later(1)
    assert [a.status for a in h.sim.outbox.attempts] == [502, 204]
    ids = {r.headers["webhook-id"] for r in h.receiver.requests}
    assert len(ids) == 1


# --- request log, control API, chaos --------------------------------------------------


async def test_request_log_records_times_and_trace_ids(h: Harness) -> None:
    job_id = await h.start("k")
    await h.later(0.5)
    await h.status(job_id)
    await h.later(1.5)
    await h.status(job_id)
    await h.client.get(f"/v1/jobs/{job_id}/result")
    job = (await h.client.get(f"/_sim/jobs/{job_id}")).json()
    reads = job["requests"]["status"]
    assert reads[1]["at"] - reads[0]["at"] == pytest.approx(1.5)
    assert job["counts"] == {"create": 1, "lookup": 0, "status": 2, "cancel": 0, "result": 1}
    assert job["requests"]["create"][0]["trace_id"] == "trace-k"
    assert [t["state"] for t in job["timeline"]] == ["queued", "running", "succeeded"]


async def test_config_and_reset_through_the_control_api(h: Harness) -> None:
    changed = await h.client.post(
        "/_sim/config", json={"faults": {"server_error": 1.0}, "webhook_secret": SECRET}
    )
    assert changed.status_code == 200
    public = changed.json()
    assert public["faults"]["server_error"] == 1.0 and public["webhook_secret_set"] is True
    assert SECRET not in changed.text
    assert (await h.create()).status_code in (500, 502, 503)
    assert h.sim.jobs == {}
    refused = await h.client.post("/_sim/config", json={"faults": {"drop": 2}})
    assert refused.status_code == 400
    await h.client.post("/_sim/config", json={"faults": {"server_error": 0}})
    await h.start()
    assert (await h.client.post("/_sim/reset")).status_code == 200
    assert h.sim.jobs == {} and h.sim.requests == []


async def chaos_statuses(seed: int) -> list[int | None]:
    rates = FaultRates(server_error=0.2, rate_limit=0.2, drop=0.1, delay=0.1)
    async with Harness(seed=seed, faults=rates) as harness:
        for i in range(30):
            with contextlib.suppress(ConnectionDropped):
                await harness.create(f"k{i}")
        return [r.status for r in harness.sim.requests]


async def test_chaos_is_reproducible_from_the_seed() -> None:
    first, again, other = await chaos_statuses(3), await chaos_statuses(3), await chaos_statuses(4)
    assert first == again != other
    assert {429, None, 202} <= set(first)


async def test_chaos_rate_limit_uses_both_retry_after_forms() -> None:
    rates = FaultRates(rate_limit=1.0, retry_after_seconds=3)
    async with Harness(seed=1, faults=rates) as harness:
        values = {(await harness.create(f"k{i}")).headers["retry-after"] for i in range(20)}
        assert "3" in values and any("GMT" in v for v in values)
        assert harness.sim.jobs == {}


async def test_endpoint_rates_replace_the_global_ones_there(h: Harness) -> None:
    override = {"endpoint_faults": {"status": {"server_error": 1.0}}}
    assert (await h.client.post("/_sim/config", json=override)).status_code == 200
    job_id = await h.start()
    assert (await h.status(job_id)).status_code in (500, 502, 503)
    assert (await h.client.get("/v1/jobs", params={"idempotency_key": "key-1"})).status_code == 200
    await h.client.post("/_sim/config", json={"endpoint_faults": {"status": None}})
    assert (await h.status(job_id)).status_code == 200
    bad = await h.client.post("/_sim/config", json={"endpoint_faults": {"nope": {}}})
    assert bad.status_code == 400


async def test_chaos_drop_and_delay_happen_after_the_effect(h: Harness) -> None:
    job_id = await h.start(scenario="never_finishes")
    h.sim.config.update({"endpoint_faults": {"cancel": {"drop": 1.0}}})
    with pytest.raises(httpx.RemoteProtocolError):
        await h.client.post(f"/v1/jobs/{job_id}/cancel")
    assert h.sim.jobs[job_id].cancel_requested_at is not None
    h.sim.config.update({"endpoint_faults": {"status": {"delay": 1.0, "delay_seconds": 4}}})
    assert (await h.status(job_id)).status_code == 200 and h.sleeps == [4]


async def test_stats_summarise_jobs_requests_and_deliveries(h: Harness) -> None:
    job_id = await h.start("k", duration=1)
    await h.later(1)
    await h.status(job_id)
    stats = (await h.client.get("/_sim/stats")).json()
    assert stats["jobs"] == 1 and stats["states"] == {"succeeded": 1}
    assert stats["requests"] == {"create": {"202": 1}, "status": {"200": 1}}
    assert stats["keys_with_several_jobs"] == []
    assert stats["deliveries"] == {"attempts": 2, "ok": 2, "pending": 0}


def test_cli_fault_flags() -> None:
    flags = ["drop=0.1", "status.rate_limit=0.5", "endpoints=status"]
    rates, per_endpoint = parse_fault_flags(flags)
    assert rates.drop == 0.1 and rates.endpoints == ("status",)
    assert per_endpoint["status"].rate_limit == 0.5 and per_endpoint["status"].drop == 0.0
    with pytest.raises(FaultConfigError):
        parse_fault_flags(["drop=1.5"])


# --- the real server ------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_runs_as_a_standalone_server() -> None:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIM_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "reconciler.demo.sim", "--port", str(port), "--seed", "1"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        with loopback.client(base_url=base, timeout=2.0, trust_env=False) as client:

            def answering() -> bool:
                assert proc.poll() is None, "the sim exited early"
                try:
                    return client.get("/_sim/jobs").status_code == 200
                except httpx.TransportError:
                    return False

            wait_until(answering, 15, "the sim to answer")
            created = client.post(
                "/v1/jobs", json={"duration": 0}, headers={"Idempotency-Key": "s"}
            )
            assert created.status_code == 202
            status = client.get(created.json()["status_url"])
            assert status.status_code == 200
            assert status.json()["job_id"] == created.json()["job_id"]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        if proc.stderr is not None:
            proc.stderr.close()
