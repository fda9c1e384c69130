"""``reconciler.client`` against a live service and the simulated provider: every ``run``
outcome, the error families, and ``verify_callback`` on callbacks the service really sent."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.client import AsyncClient, Client, Outcome, ReplayGuard, RunResult, verify_callback
from reconciler.core import errors
from reconciler.storage.tokens import create_token
from tests.support.hooks import Reply, serve_receiver
from tests.support.stack import Stack, running_stack
from tests.support.waiting import wait_until

FAST_POLLING = {"base_delay_seconds": 0.1, "max_delay_seconds": 0.5}
# A retry at least a second later carries a new timestamp (one in the same second would be
# indistinguishable from a replay).
CALLBACKS = {"max_attempts": 3, "base_delay_seconds": 1.1, "max_delay_seconds": 1.5}


@pytest.fixture
def stack(tmp_path: Path, db_url: str) -> Iterator[Stack]:
    # A short long-poll cap, so run() notices an escalation within a couple of seconds.
    with running_stack(
        tmp_path,
        db_url,
        provider={"polling": FAST_POLLING},
        server={"wait_max_seconds": 2.0},
        callbacks=CALLBACKS,
    ) as running:
        yield running


@pytest.fixture
def api(stack: Stack) -> Iterator[Client]:
    with Client(stack.url, stack.agent_token) as client:
        yield client


def job(scenario: str, duration: float = 0.3, **knobs: Any) -> dict[str, Any]:
    return {"scenario": scenario, "duration": duration, **knobs}


@pytest.mark.parametrize(
    ("request_", "outcome", "state"),
    [
        (job("success"), Outcome.SUCCEEDED, "succeeded"),
        (job("partial", failed_items=2), Outcome.COMPLETED_WITH_ERRORS, "completed_with_errors"),
        (job("late_failure", 0.5), Outcome.FAILED, "failed"),
        (job("unknown_state", 0.2), Outcome.ESCALATED, "escalated"),
    ],
)
def test_run_names_each_outcome(
    api: Client, request_: dict[str, Any], outcome: Outcome, state: str
) -> None:
    result = api.run("sim", request_, max_wait=30)
    assert result.outcome is outcome
    assert result.operation.state == state
    assert result.operation_id == result.operation.id and result.operation_id.startswith("op_")
    if outcome is Outcome.SUCCEEDED:
        assert result.result is not None and result.error is None
    if outcome is Outcome.FAILED:
        assert result.error is not None
    if outcome is Outcome.ESCALATED:
        assert result.operation.escalation is not None
        assert result.operation.escalation.reason == "unknown_state"
        # Written to the agent: a person decides, it cannot, it tells its user.
        assert "A person, an operator of this service, must decide" in result.message
        assert "you cannot decide it" in result.message and "Tell your user" in result.message


def test_run_that_outlasts_max_wait_is_timed_out_with_the_id(api: Client) -> None:
    result = api.run("sim", job("never_finishes", 30), max_wait=1.0)
    assert result.outcome is Outcome.TIMED_OUT
    assert result.operation.done is False
    assert api.get(result.operation_id).state in {"accepted", "observing"}


def test_run_ends_cancelled_when_the_job_is_cancelled_meanwhile(api: Client, stack: Stack) -> None:
    request, key = job("success", 30), "cancel-me"
    found: list[RunResult] = []
    runner = threading.Thread(
        target=lambda: found.append(api.run("sim", request, idempotency_key=key, max_wait=30))
    )
    runner.start()
    try:
        # The same key and request give the same operation: this is the one run waits on.
        op = api.start("sim", request, idempotency_key=key)
        stack.wait_state(op.id, {"accepted", "observing"})
        assert api.cancel(op.id, reason="no longer needed").cancel_requested
    finally:
        runner.join(timeout=40)
    (result,) = found
    assert result.outcome is Outcome.CANCELLED and result.operation_id == op.id


def test_the_calls_return_typed_answers(api: Client, stack: Stack) -> None:
    first = api.start("sim", job("success", 0.2), idempotency_key="typed", metadata={"task": "t1"})
    again = api.start("sim", job("success", 0.2), idempotency_key="typed", metadata={"task": "t1"})
    assert again.id == first.id and first.metadata == {"task": "t1"}
    done = api.wait(first.id, max_wait=20)
    assert done.done and done.state == "succeeded" and done.done_at is not None
    page = api.list(done=True)
    assert [op.id for op in page.operations] == [first.id]
    assert api.list(done=False).operations == []
    entries = api.history(first.id)
    states = [e.to_state for e in entries if e.to_state]
    assert states[0] == "create_pending" and states[-1] == "succeeded"
    (provider,) = api.providers()
    assert provider.name == "sim" and provider.webhook is None and provider.can_cancel
    assert provider.preset is None and provider.set_by_service == ()


def test_the_error_families(api: Client, stack: Stack) -> None:
    with pytest.raises(errors.InvalidRequest, match="unknown provider 'nope'"):
        api.start("nope", {})
    api.start("sim", job("success", 5), idempotency_key="k")
    with pytest.raises(errors.IdempotencyConflict, match="already used"):
        api.start("sim", job("success", 6), idempotency_key="k")
    with pytest.raises(errors.NotFound):
        api.get("op_doesnotexist")
    with stack.runtime.db.write() as conn:
        other = create_token(conn, "agent-2", "agent", stack.runtime.clock.now())
    mine = api.list().operations[0].id
    with Client(stack.url, other) as theirs, pytest.raises(errors.NotFound):
        theirs.get(mine)
    with Client(stack.url, "rk_not-a-token") as bad, pytest.raises(errors.AuthenticationFailed):
        bad.providers()
    nowhere = Client("http://127.0.0.1:9", "x", retries=1, retry_delay=0)
    with nowhere, pytest.raises(errors.ServiceError, match="could not reach"):
        nowhere.get("op_x")


def test_the_async_client_runs_too(stack: Stack) -> None:
    async def main() -> RunResult:
        async with AsyncClient(stack.url, stack.agent_token) as api:
            assert await api.wait_cap() == 2.0
            return await api.run("sim", job("success", 0.2), max_wait=20)

    result = asyncio.run(main())
    assert result.outcome is Outcome.SUCCEEDED


def test_verify_callback_on_deliveries_the_service_sent(api: Client, stack: Stack) -> None:
    with serve_receiver() as (receiver, base):
        # The first attempt fails, so the service sends a second one: a real retry.
        receiver.script("agent", [Reply(500), Reply(204)])
        op = api.start("sim", job("success", 0.2), callback_url=f"{base}/cb/agent")
        got = wait_until(
            lambda: len(found := receiver.deliveries("agent")) >= 2 and found, 20, "2 deliveries"
        )
    secret = stack.callback_secret()  # this agent's own, as `tokens create` showed it
    guard = ReplayGuard()
    events = [verify_callback(d.body, d.headers, secret, replay_guard=guard) for d in got]
    assert [e.webhook_id for e in events] == [op.id, op.id]  # one id per operation
    assert events[0].timestamp <= events[1].timestamp
    assert all(e.type == "operation.completed" and e.operation.done for e in events)
    assert events[1].operation.state == "succeeded"
    # Presented again as it was, a delivery is a replay.
    with pytest.raises(errors.SignatureRejected) as caught:
        verify_callback(got[1].body, got[1].headers, secret, replay_guard=guard)
    assert caught.value.reason is errors.RejectReason.REPLAYED
    # Changed by one byte, it is a bad signature.
    with pytest.raises(errors.SignatureRejected) as caught:
        verify_callback(got[1].body + b" ", got[1].headers, secret)
    assert caught.value.reason is errors.RejectReason.SIGNATURE_MISMATCH
