"""Attacks with text that is not text, and with clients that hang up.

A lone surrogate (``"\\ud800"``, legal as a JSON escape) anywhere in an agent body is a
400 naming the field, and the keep-alive connection survives; a signed webhook whose
ids cannot be stored is a 400 (never a 503 the provider retries forever), counted as
``unstorable``; a sender that disconnects mid-body is counted and logged at info.
"""

from __future__ import annotations

import logging
import socket
from datetime import UTC, datetime
from urllib.parse import urlsplit

import pytest

from tests.integration.test_webhook_endpoint import signed_headers
from tests.support.stack import WEBHOOK_SECRET, Stack

SURROGATE = "\\ud800"
BODIES = {
    "request": f'{{"provider":"sim","request":{{"name":"{SURROGATE}"}}}}',
    "metadata": f'{{"provider":"sim","request":{{}},"metadata":{{"k":"{SURROGATE}"}}}}',
    "idempotency_key": f'{{"provider":"sim","request":{{}},"idempotency_key":"{SURROGATE}"}}',
    "provider": f'{{"provider":"{SURROGATE}","request":{{}}}}',
    "callback_url": f'{{"provider":"sim","request":{{}},"callback_url":"http://a/{SURROGATE}"}}',
    "member name": f'{{"provider":"sim","request":{{"{SURROGATE}":1}}}}',
}


def _metric(stack: Stack, name: str, **labels: str) -> float:
    value = stack.runtime.metrics.registry.get_sample_value(name, labels)
    return value or 0.0


@pytest.mark.parametrize("field", list(BODIES))
def test_a_lone_surrogate_in_a_create_is_400_naming_the_field(stack: Stack, field: str) -> None:
    headers = {**stack.headers(), "Content-Type": "application/json"}
    response = stack.client.post("/v1/operations", content=BODIES[field], headers=headers)
    assert response.status_code == 400, response.text
    named = "request" if field == "member name" else field
    assert f"'{named}'" in response.json()["error"]["message"]
    # The same keep-alive connection still answers.
    assert stack.client.get("/v1/operations", headers=stack.headers()).status_code == 200


def test_a_lone_surrogate_in_a_cancel_or_decision_is_400(stack: Stack) -> None:
    op_id = stack.create({"scenario": "never_finishes", "webhooks": "never"}).json()["id"]
    headers = {**stack.headers(), "Content-Type": "application/json"}
    cancel = stack.client.post(
        f"/v1/operations/{op_id}/cancel", content=f'{{"reason":"{SURROGATE}"}}', headers=headers
    )
    assert cancel.status_code == 400 and "'reason'" in cancel.text
    ops = {**stack.headers(operator=True), "Content-Type": "application/json"}
    decision = stack.client.post(
        f"/v1/operations/{op_id}/decisions", content=f'{{"action":"{SURROGATE}"}}', headers=ops
    )
    assert decision.status_code == 400 and "'action'" in decision.text


def test_an_out_of_range_number_is_400_not_500(stack: Stack) -> None:
    headers = {**stack.headers(), "Content-Type": "application/json"}
    for body in (
        '{"provider":"sim","request":{"x":1e400}}',
        '{"provider":"sim","request":{},"deadline_seconds":1e400}',
    ):
        response = stack.client.post("/v1/operations", content=body, headers=headers)
        assert response.status_code == 400, response.text


@pytest.mark.parametrize("job", [SURROGATE, "\\u0000"])
def test_a_signed_webhook_with_unstorable_ids_is_400_and_counted(stack: Stack, job: str) -> None:
    body = f'{{"type":"job.running","data":{{"job_id":"{job}"}}}}'.encode()
    headers = signed_headers(WEBHOOK_SECRET, "evt_bad_text", datetime.now(UTC), body)
    response = stack.client.post("/webhooks/sim", content=body, headers=headers)
    assert response.status_code == 400, response.text
    assert "retry-after" not in response.headers
    assert response.json()["error"]["code"] == "content_unstorable"
    assert _metric(stack, "reconciler_webhooks_total", provider="sim", result="unstorable") == 1


def test_a_sender_that_hangs_up_mid_body_is_counted_at_info(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    where = urlsplit(stack.url)
    with socket.create_connection((where.hostname, where.port)) as sock:
        sock.sendall(
            b"POST /webhooks/sim HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 5000\r\n\r\n" + b'{"type":' + b" " * 100
        )
    deadline = datetime.now(UTC).timestamp() + 10
    name, labels = "reconciler_webhooks_total", {"provider": "sim", "result": "client_disconnected"}
    while _metric(stack, name, **labels) < 1 and datetime.now(UTC).timestamp() < deadline:
        __import__("time").sleep(0.05)
    assert _metric(stack, name, **labels) == 1
    assert _metric(stack, name, provider="sim", result="store_failed") == 0
    lines = [r for r in caplog.records if "client disconnected" in r.getMessage()]
    assert lines and all(r.levelno == logging.INFO and r.exc_info is None for r in lines)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
