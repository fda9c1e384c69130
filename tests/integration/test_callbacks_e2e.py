"""The agent's completion callback, end to end, and the SSRF guard on ``callback_url``.

Retries, Retry-After, permanent refusals, exhausted attempts and an extension that
redelivers are proven step by step in ``tests/steps/test_complete_step.py``; here a
callback crosses a real socket, and a real redirect is not followed.

A real receiver (Starlette on uvicorn, 127.0.0.1) records every request; the
stack allow-lists 127.0.0.1 so it may receive callbacks. Signatures are checked
with the independent ``standardwebhooks`` package and the service's callback
secret, never with the project's own code.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from standardwebhooks import Webhook

from tests.support import hooks
from tests.support.hooks import CallbackReceiver, Delivery, Reply, serve_receiver
from tests.support.stack import Stack, running_stack
from tests.support.waiting import wait_until

MAX_ATTEMPTS = 3
CALLBACKS = {
    "max_attempts": MAX_ATTEMPTS,
    "base_delay_seconds": 0.05,
    "max_delay_seconds": 0.2,
    "timeout_seconds": 0.5,
}
FAST_JOB = {"scenario": "success", "duration": 0.2}


@contextmanager
def callback_stack(tmp_path: Path, db_url: str) -> Iterator[tuple[Stack, CallbackReceiver, str]]:
    with (
        serve_receiver() as (receiver, cb_url),
        running_stack(tmp_path, db_url, callbacks=CALLBACKS) as stack,
    ):
        yield stack, receiver, cb_url


def start(stack: Stack, callback_url: str, request: dict[str, Any] | None = None) -> str:
    response = stack.create(request or FAST_JOB, callback_url=callback_url)
    assert response.status_code == 202, response.text
    op_id: str = response.json()["id"]
    return op_id


def verified(delivery: Delivery, stack: Stack) -> dict[str, Any]:
    """The event, after the independent library checked its signature with the agent's secret."""
    secret = stack.callback_secret()
    payload: dict[str, Any] = Webhook(secret).verify(delivery.body, delivery.headers)
    return payload


def deliveries(receiver: CallbackReceiver, name: str, count: int) -> list[Delivery]:
    found: list[Delivery] = wait_until(
        lambda: len(got := receiver.deliveries(name)) >= count and got,
        20,
        f"{count} callback request(s) at /cb/{name}",
    )
    return found


def escalation_of(stack: Stack, op_id: str) -> dict[str, Any]:
    found: dict[str, Any] = wait_until(
        lambda: stack.get(op_id, operator=True)["escalation"], 20, f"an escalation of {op_id}"
    )
    return found


def step_failures(stack: Stack, op_id: str) -> list[dict[str, Any]]:
    return [e["detail"] for e in stack.history(op_id) if e["cause"] == "step_failed:callback"]


def test_callback_is_signed_and_carries_the_finished_operation(tmp_path: Path, db_url: str):
    with callback_stack(tmp_path, db_url) as (stack, receiver, cb_url):
        op_id = start(stack, f"{cb_url}/cb/ok")
        (delivery,) = deliveries(receiver, "ok", 1)
        event = verified(delivery, stack)
        assert delivery.headers["content-type"] == "application/json"
        assert delivery.webhook_id == op_id  # stable per operation
        assert event["type"] == "operation.completed"
        operation = event["operation"]
        assert operation["id"] == op_id
        assert operation["done"] is True
        assert operation["state"] == "succeeded"
        assert operation["result"]["sha256"] == stack.get(op_id)["result"]["sha256"]
        wait_until(lambda: hooks.completion_finished(stack.runtime.db, op_id), 10, "closing")
        assert len(receiver.deliveries("ok")) == 1


def test_redirect_is_not_followed_and_escalates(tmp_path: Path, db_url: str):
    with (
        serve_receiver() as (canary, canary_url),
        callback_stack(tmp_path, db_url) as (
            stack,
            receiver,
            cb_url,
        ),
    ):
        # The redirect target is allow-listed and listening: only not following keeps it quiet.
        receiver.script("moved", [Reply(302, {"Location": f"{canary_url}/cb/canary"})])
        op_id = start(stack, f"{cb_url}/cb/moved")
        escalation = escalation_of(stack, op_id)
        assert escalation["reason"] == "callback_undeliverable"
        stack.settled([op_id])
        assert len(receiver.deliveries("moved")) == 1
        assert canary.deliveries() == []
        (failure,) = step_failures(stack, op_id)
        assert failure["http_status"] == 302 and failure["gave_up"] is True
        assert "redirects are not followed" in failure["error"]
        assert stack.get(op_id)["state"] == "succeeded"


# --- SSRF at the API -------------------------------------------------------------

OUTSIDE_ALLOW_LIST = ["http://10.0.0.1/", "http://169.254.169.254/", "http://[::1]/"]
# Loopback spelled differently: the allow-list of 127.0.0.1 legitimately covers these.
LOOPBACK_SPELLINGS = ["http://[::ffff:127.0.0.1]/", "http://2130706433/"]


def assert_refused(stack: Stack, url: str) -> None:
    response = stack.create(FAST_JOB, callback_url=url)
    assert response.status_code == 400, (url, response.text)
    error = response.json()["error"]
    assert error["code"] == "callback_url_forbidden" and "callback_url" in error["message"]


def nothing_stored(stack: Stack) -> bool:
    listed = stack.client.get("/v1/operations", headers=stack.headers(operator=True))
    return listed.json()["operations"] == [] and stack.sim.requests == []


def test_ssrf_targets_are_refused_at_submission(tmp_path: Path, db_url: str):
    with callback_stack(tmp_path, db_url) as (stack, _receiver, cb_url):
        for url in OUTSIDE_ALLOW_LIST:
            assert_refused(stack, url)
        assert nothing_stored(stack)
        # The allow-listed receiver itself is accepted.
        assert stack.create(FAST_JOB, callback_url=f"{cb_url}/cb/ok").status_code == 202


def test_without_the_allow_list_loopback_is_refused(tmp_path: Path, db_url: str):
    with (
        serve_receiver() as (receiver, cb_url),
        running_stack(tmp_path, db_url, callbacks={"allow_hosts": ()}) as stack,
    ):
        for url in [*OUTSIDE_ALLOW_LIST, *LOOPBACK_SPELLINGS, f"{cb_url}/cb/ok"]:
            assert_refused(stack, url)
        assert nothing_stored(stack)
        assert receiver.deliveries() == []


def test_redirect_to_the_metadata_address_is_not_followed(tmp_path: Path, db_url: str):
    with callback_stack(tmp_path, db_url) as (stack, receiver, cb_url):
        metadata = "http://169.254.169.254/latest/meta-data/iam/security-credentials/"
        receiver.script("meta", [Reply(301, {"Location": metadata})])
        op_id = start(stack, f"{cb_url}/cb/meta")
        escalation = escalation_of(stack, op_id)
        assert escalation["reason"] == "callback_undeliverable"
        (failure,) = step_failures(stack, op_id)
        # One request, to the receiver; the answer was the redirect, and nothing was sent on.
        assert failure["http_status"] == 301 and failure["gave_up"] is True
        assert "redirects are not followed" in failure["error"]
        assert len(receiver.deliveries("meta")) == 1
        for entry in stack.history(op_id):
            assert "169.254.169.254" not in str(entry["detail"] or "")
