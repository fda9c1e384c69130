"""The observing keys of real providers, step by step on a real database.

Static ``headers`` on every provider call (never over the credential or the trace
header), GitHub's 403 rate limit with ``x-ratelimit-reset`` and ``retry-after-ms``
as minimum waits, ``[webhook] types`` (an unlisted type is answered, stored and
changes nothing; a thin event is an ordinary hint), and JSONL results with failed
lines and a separate errors file.
"""

from __future__ import annotations

import copy
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from standardwebhooks import Webhook

from reconciler.app import create_app
from reconciler.providers.adapter import Subject
from reconciler.providers.http_adapter import HttpAdapter
from reconciler.storage.provider_stats import webhook_counts
from tests.support.provider_mock import BASE_URL, FakeProvider, error
from tests.support.stack import WEBHOOK_SECRET, sim_provider_table
from tests.support.steps import ENVIRON, StepRig, step_rig

pytestmark = pytest.mark.anyio

STATIC = {"anthropic-version": "2023-06-01", "X-GitHub-Api-Version": "2022-11-28"}


async def observing(rig: StepRig, request: Any = None) -> tuple[str, str]:
    op_id = rig.submit(request)
    op = await rig.step(op_id)
    assert op.state == "observing" and op.remote_job_id is not None, rig.causes(op_id)
    return op_id, op.remote_job_id


async def test_static_headers_go_with_every_provider_call(tmp_path: Path, db_url: str) -> None:
    table = sim_provider_table(BASE_URL)
    table["headers"] = STATIC
    async with step_rig(tmp_path, db_url, table=table) as rig:
        op_id, job = await observing(rig)
        rig.provider.finish(job)
        await rig.run(op_id, ["succeeded"])
        lost_id = rig.submit()
        rig.provider.script("create", rig.provider.made_then(httpx.ReadTimeout("lost")))
        await rig.step(lost_id)
        rig.advance_to_due(lost_id)
        await rig.step(lost_id)  # found by the lookup
        rig.cancel(lost_id)
        rig.advance_to_due(lost_id)
        await rig.step(lost_id)
        endpoints = {r.endpoint for r in rig.provider.requests}
        assert endpoints == {"create", "lookup", "status", "result", "cancel"}
        for seen in rig.provider.requests:
            assert seen.headers["anthropic-version"] == "2023-06-01", seen.endpoint
            assert seen.headers["x-github-api-version"] == "2022-11-28", seen.endpoint
            assert seen.headers["authorization"] == "Bearer sim-token-for-tests"


async def test_a_static_header_never_replaces_the_credential_or_the_trace_header(
    tmp_path: Path, db_url: str
) -> None:
    async with step_rig(tmp_path, db_url) as rig:
        # Built in code past the loader, which refuses such headers in a file.
        forged = (("authorization", "Bearer forged"), ("x-trace-id", "forged"), ("a", "b"))
        spec = rig.runtime.providers["sim"].model_copy(update={"headers": forged})
        fake = FakeProvider(rig.clock)
        adapter = HttpAdapter(spec, ENVIRON, httpx.MockTransport(fake.handle), clock=rig.clock)
        try:
            await adapter.create({"report": "q3"}, Subject("op_1", "tok-1", "trace-1"))
            await adapter.status(Subject("op_1", "tok-1", "trace-1", "job-1"))
        finally:
            await adapter.aclose()
        for seen in fake.requests:
            assert seen.headers["authorization"] == "Bearer sim-token-for-tests"
            assert seen.headers["x-trace-id"] == "trace-1" and seen.headers["a"] == "b"
            raw = [k for k in seen.headers if k.lower() in ("authorization", "x-trace-id")]
            assert len(raw) == 2  # one of each, not the forged one beside it


def github_like() -> dict[str, Any]:
    polling = {"rate_limit_reset": "header:x-ratelimit-reset", "max_rate_limited": 5}
    return {"polling": {**polling, "deadline_seconds": 3600}}


async def test_a_403_with_the_rate_limit_spent_waits_for_the_reset(
    tmp_path: Path, db_url: str
) -> None:
    async with step_rig(tmp_path, db_url, provider=github_like()) as rig:
        op_id, job = await observing(rig)
        rig.advance_to_due(op_id)
        reset = int(rig.clock.now().timestamp()) + 300
        limited = {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(reset)}
        rig.provider.script("status", error(403, limited))
        op = await rig.step(op_id)
        assert op.state == "observing" and op.escalation_id is None
        assert op.next_poll_at is not None and op.next_poll_at.timestamp() >= reset
        assert op.delay_source == "provider_retry_after" and op.rate_limited_count == 1
        # Nothing goes out before the reset; after it the job is followed as usual.
        rig.clock.set(op.next_poll_at - timedelta(seconds=1))
        assert await rig.tick() == 0
        rig.provider.finish(job)
        await rig.run(op_id, ["succeeded"])


async def test_a_plain_403_is_still_authorization_denied(tmp_path: Path, db_url: str) -> None:
    async with step_rig(tmp_path, db_url, provider=github_like()) as rig:
        op_id, _ = await observing(rig)
        rig.advance_to_due(op_id)
        rig.provider.script("status", error(403, {"x-ratelimit-remaining": "4999"}))
        op = await rig.step(op_id)
        assert op.state == "escalated"
        assert rig.view(op_id)["escalation"]["reason"] == "authorization_denied"


async def test_retry_after_ms_is_a_minimum_wait_for_the_next_read(
    tmp_path: Path, db_url: str
) -> None:
    async with step_rig(tmp_path, db_url) as rig:
        op_id, _ = await observing(rig)
        rig.advance_to_due(op_id)
        at = rig.clock.now()
        rig.provider.script("status", error(429, {"retry-after-ms": "8500"}))
        op = await rig.step(op_id)
        assert op.next_poll_at is not None and op.next_poll_at >= at + timedelta(seconds=8.5)
        assert op.delay_source == "provider_retry_after"


async def test_a_rate_limited_403_on_create_is_retried_not_rejected(
    tmp_path: Path, db_url: str
) -> None:
    async with step_rig(tmp_path, db_url, provider=github_like()) as rig:
        op_id = rig.submit()
        reset = int(rig.clock.now().timestamp()) + 20
        rig.provider.script(
            "create", error(403, {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(reset)})
        )
        op = await rig.step(op_id)
        assert op.state in ("create_pending", "create_unknown") and op.error is None
        assert op.next_poll_at is not None and op.next_poll_at.timestamp() >= reset


# --- webhook types ------------------------------------------------------------------------


def typed_webhooks(**webhook: Any) -> dict[str, Any]:
    table = copy.deepcopy(sim_provider_table(BASE_URL))
    table["webhook"].update(webhook)
    return table


async def deliver(rig: StepRig, event_id: str, payload: dict[str, Any]) -> httpx.Response:
    app = create_app(rig.runtime, background=False)
    body = json.dumps(payload)
    signed = Webhook(WEBHOOK_SECRET).sign(event_id, rig.clock.now(), body)
    headers = {
        "webhook-id": event_id,
        "webhook-timestamp": str(int(rig.clock.now().timestamp())),
        "webhook-signature": signed,
        "content-type": "application/json",
    }
    transport = httpx.ASGITransport(app)
    async with httpx.AsyncClient(transport=transport, base_url="http://service") as client:
        return await client.post("/webhooks/sim", content=body, headers=headers)


async def test_an_event_of_an_unlisted_type_is_answered_and_changes_nothing(
    tmp_path: Path, db_url: str
) -> None:
    table = typed_webhooks(types=["batch.completed", "batch.failed"], job_id="/data/id")
    async with step_rig(tmp_path, db_url, table=table) as rig:
        op_id, job = await observing(rig)
        before = rig.row(op_id)
        response = await deliver(rig, "evt_1", {"type": "batch.in_progress", "data": {"id": job}})
        assert response.status_code == 200 and response.json()["status"] == "ignored"
        after = rig.row(op_id)
        assert after.hinted_at is None and after.next_poll_at == before.next_poll_at
        assert after.version == before.version
        assert not [e for e in rig.history(op_id) if e.kind == "hint"]
        with rig.runtime.db.read() as conn:
            counts = webhook_counts(conn)["sim"]
        assert counts.orphaned == 0  # stored as ignored: no job waits for it
        # Delivered again, it is the same stored event.
        again = await deliver(rig, "evt_1", {"type": "batch.in_progress", "data": {"id": job}})
        assert again.json()["status"] == "duplicate"


async def test_a_thin_event_of_a_listed_type_is_an_ordinary_hint(
    tmp_path: Path, db_url: str
) -> None:
    table = typed_webhooks(types=["batch.completed"], job_id="/data/id")
    async with step_rig(tmp_path, db_url, table=table) as rig:
        op_id, job = await observing(rig)
        # OpenAI's thin event: the type and data.id, nothing about the state.
        response = await deliver(rig, "evt_2", {"type": "batch.completed", "data": {"id": job}})
        assert response.status_code == 200 and response.json()["status"] == "hinted"
        op = rig.row(op_id)
        assert op.hinted_at == rig.clock.now() and op.next_poll_at == rig.clock.now()
        rig.provider.finish(job)
        await rig.run(op_id, ["succeeded"])


# --- JSONL results ------------------------------------------------------------------------


def jsonl_provider(errors_file: bool) -> dict[str, Any]:
    table = copy.deepcopy(sim_provider_table(BASE_URL))
    table["result"] = {
        "path": "/v1/jobs/{job_id}/result",
        "content_type": "application/jsonl",
        "failed_lines": [
            {"pointer": "/error", "present": True},
            {"pointer": "/response/status_code", "in": [400, 500]},
        ],
    }
    if errors_file:
        table["result"]["errors_path"] = "/v1/jobs/{job_id}/errors/{errors_ref}"
        table["status"]["errors_ref"] = "/error_file_id"
    return table


def lines(*values: Any) -> httpx.Response:
    data = b"".join(json.dumps(v).encode() + b"\n" for v in values)
    return httpx.Response(200, content=data, headers={"content-type": "application/octet-stream"})


OK_LINE = {"custom_id": "a", "response": {"status_code": 200}, "error": None}
BAD_LINE = {"custom_id": "b", "response": {"status_code": 400}, "error": None}


async def test_jsonl_failed_lines_and_the_errors_file_make_completed_with_errors(
    tmp_path: Path, db_url: str
) -> None:
    async with step_rig(tmp_path, db_url, table=jsonl_provider(errors_file=True)) as rig:
        op_id, job = await observing(rig)
        rig.provider.finish(job, extra={"error_file_id": "file-err-1"})
        rig.provider.script("result", lines(OK_LINE, BAD_LINE, OK_LINE))
        rig.provider.script("errors", lines({"custom_id": "c", "error": {"code": "invalid"}}))
        await rig.run(op_id, ["completed_with_errors"])
        result = rig.view(op_id)["result"]
        assert result["summary"] == {"total_lines": 4, "failed_lines": 2}
        assert [i.get("line") or i.get("errors_line") for i in result["failed_items"]] == [2, 1]
        [errors] = rig.provider.sent("errors")
        assert errors.path == f"/v1/jobs/{job}/errors/file-err-1"
        assert errors.headers["authorization"] == "Bearer sim-token-for-tests"


async def test_jsonl_without_failed_lines_succeeds(tmp_path: Path, db_url: str) -> None:
    async with step_rig(tmp_path, db_url, table=jsonl_provider(errors_file=True)) as rig:
        op_id, job = await observing(rig)
        rig.provider.finish(job)  # no error_file_id: no errors file to fetch
        rig.provider.script("result", lines(OK_LINE, OK_LINE))
        await rig.run(op_id, ["succeeded"])
        assert rig.view(op_id)["result"]["summary"] == {"total_lines": 2, "failed_lines": 0}
        assert rig.provider.sent("errors") == []


async def test_a_malformed_jsonl_line_fails_validation_naming_the_line(
    tmp_path: Path, db_url: str
) -> None:
    async with step_rig(tmp_path, db_url, table=jsonl_provider(errors_file=False)) as rig:
        op_id, job = await observing(rig)
        rig.provider.finish(job)
        broken = httpx.Response(200, content=b'{"custom_id":"a"}\n{"custom_id": \n')
        rig.provider.script("result", broken)
        await rig.run(op_id, ["result_validation_failed"])
        problems = rig.view(op_id)["error"]["detail"]["problems"]
        assert any("line 2" in p for p in problems)


async def test_a_result_fetch_answered_with_retry_after_ms_waits_for_it(
    tmp_path: Path, db_url: str
) -> None:
    async with step_rig(tmp_path, db_url, table=jsonl_provider(errors_file=False)) as rig:
        op_id, job = await observing(rig)
        rig.provider.finish(job)
        rig.provider.script("result", error(503, {"retry-after-ms": "30000"}), lines(OK_LINE))
        for _ in range(10):  # the status read, then the first fetch
            if rig.provider.sent("result"):
                break
            rig.advance_to_due(op_id)
            await rig.tick()
        [first] = rig.provider.sent("result")
        op = rig.row(op_id)
        assert op.next_poll_at is not None and op.next_poll_at >= first.at + timedelta(seconds=30)
        await rig.run(op_id, ["succeeded"])


# --- agent callbacks ----------------------------------------------------------------------


async def test_an_agent_answering_retry_after_ms_gets_its_next_callback_no_sooner(
    tmp_path: Path, db_url: str
) -> None:
    answers = [httpx.Response(429, headers={"retry-after-ms": "6500"}), httpx.Response(204)]
    sent: list[httpx.Request] = []

    def agent(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return answers.pop(0)

    callbacks = {"max_attempts": 3, "base_delay_seconds": 1.0, "max_delay_seconds": 2.0}
    async with step_rig(
        tmp_path, db_url, callbacks=callbacks, callback_transport=httpx.MockTransport(agent)
    ) as rig:
        op_id_cb = rig.submit(callback_url="http://127.0.0.1:9/cb/agent")
        op = await rig.step(op_id_cb)
        assert op.remote_job_id is not None
        rig.provider.finish(op.remote_job_id)
        while not sent:
            rig.advance_to_due(op_id_cb)
            await rig.step(op_id_cb)
        asked_at = rig.clock.now()
        retry_at = rig.row(op_id_cb).next_poll_at
        assert retry_at is not None and retry_at >= asked_at + timedelta(seconds=7)
        await rig.run(op_id_cb, ["succeeded"])
        assert len(sent) == 2


async def test_a_cancel_answer_asking_for_a_pause_holds_back_the_confirming_read(
    tmp_path: Path, db_url: str
) -> None:
    async with step_rig(tmp_path, db_url) as rig:
        op_id, job = await observing(rig)
        rig.cancel(op_id)
        rig.advance_to_due(op_id)
        at = rig.clock.now()
        rig.provider.script(
            "cancel",
            httpx.Response(
                202,
                json={"job_id": job, "state": "cancelling"},
                headers={"retry-after-ms": "20000"},
            ),
        )
        op = await rig.step(op_id)
        assert op.state == "cancelling" and len(rig.provider.sent("cancel")) == 1
        assert op.next_poll_at == at + timedelta(seconds=20)
        assert op.delay_source == "provider_retry_after"
