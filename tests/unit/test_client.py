"""``reconciler.client`` without a service: imports, error mapping, outcomes, retries, waits,
and callback verification against signatures made by the independent ``standardwebhooks``."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from standardwebhooks.webhooks import Webhook

from reconciler.client import (
    AsyncClient,
    Client,
    MemorySeenStore,
    Operation,
    OperationError,
    Outcome,
    Progress,
    ReplayGuard,
    outcome_of,
    verify_callback,
)
from reconciler.client.calls import error_for
from reconciler.core import errors
from tests.support.imports import modules_after, top_level

ROOT = Path(__file__).resolve().parents[2]
SECRET = "whsec_" + base64.b64encode(b"agent-callback-secret-123456789").decode()


def op_json(state: str = "observing", done: bool = False, **extra: Any) -> dict[str, Any]:
    return {
        "id": "op_0001",
        "provider": "sim",
        "state": state,
        "done": done,
        "remote_job_id": "job_1",
        "remote_state": "running",
        "message": "The job has STARTED and is NOT complete.",
        "poll_after_seconds": None if done else 2.0,
        "progress": None,
        "deadline_at": "2026-01-01T00:10:00Z",
        "budget": {"status_requests_used": 1, "max_status_requests": 12},
        "result": None,
        "error": None,
        "escalation": None,
        "created_at": "2026-01-01T00:00:00Z",
        "future_field": "ignored",
        **extra,
    }


def escalation(decided: bool = False) -> dict[str, Any]:
    return {
        "reason": "unknown_state",
        "message": "External job needs a decision",
        "options": [{"action": "abandon", "description": "stop waiting"}],
        "created_at": "2026-01-01T00:05:00Z",
        "decided": decided,
        "decision": None,
    }


def test_importing_the_client_loads_neither_the_web_stack_nor_the_database() -> None:
    heavy = {"starlette", "sqlalchemy", "sqlmodel", "uvicorn", "apscheduler", "alembic"}
    heavy |= {"cryptography", "mcp", "pydantic", "psycopg"}
    assert not top_level(modules_after("import reconciler.client")) & heavy


def test_the_operation_is_typed_and_keeps_what_it_does_not_know() -> None:
    op = Operation.from_json(op_json())
    assert op.deadline_at == datetime(2026, 1, 1, 0, 10, tzinfo=UTC)
    assert op.budget.max_status_requests == 12
    assert op.raw["future_field"] == "ignored"
    with pytest.raises(errors.ServiceError):
        Operation.from_json({"id": "op_1"})


@pytest.mark.parametrize(
    ("state", "done", "esc", "outcome"),
    [
        ("succeeded", True, None, Outcome.SUCCEEDED),
        ("completed_with_errors", True, None, Outcome.COMPLETED_WITH_ERRORS),
        ("failed", True, None, Outcome.FAILED),
        ("result_unavailable", True, None, Outcome.FAILED),
        ("result_validation_failed", True, None, Outcome.FAILED),
        ("cancelled", True, None, Outcome.CANCELLED),
        ("observing", False, None, Outcome.TIMED_OUT),
        ("cancel_requested", False, None, Outcome.TIMED_OUT),
        ("escalated", False, escalation(), Outcome.ESCALATED),
        ("result_timed_out", True, escalation(), Outcome.ESCALATED),
        ("result_timed_out", True, escalation(decided=True), Outcome.FAILED),
        ("cancellation_unconfirmed", True, escalation(), Outcome.ESCALATED),
        # A callback that could not be delivered does not undo a success.
        ("succeeded", True, escalation(), Outcome.SUCCEEDED),
    ],
)
def test_six_outcomes(state: str, done: bool, esc: Any, outcome: Outcome) -> None:
    # As an older service answers: done true on a reopenable end, no awaiting_decision key.
    assert outcome_of(Operation.from_json(op_json(state, done, escalation=esc))) is outcome


def test_an_operation_awaiting_a_decision_is_not_done_even_from_an_older_service() -> None:
    old = Operation.from_json(op_json("result_timed_out", True, escalation=escalation()))
    assert (old.done, old.awaiting_decision) == (False, True)
    new = Operation.from_json(
        op_json("result_timed_out", False, escalation=escalation(), awaiting_decision=True)
    )
    assert (new.done, new.awaiting_decision) == (False, True)
    assert outcome_of(new) is Outcome.ESCALATED


def test_a_refused_request_is_its_own_outcome_with_one_error_shape() -> None:
    error = {
        "code": "request_rejected",
        "message": "the provider refused the request (HTTP 422): bad scenario",
        "http_status": 422,
        "provider_message": "bad scenario",
        "detail": {"provider_error": {"detail": "bad scenario"}},
    }
    op = Operation.from_json(op_json("failed", True, error=error, replayed=True))
    assert outcome_of(op) is Outcome.REJECTED and op.replayed is True
    assert op.error == OperationError(
        "request_rejected",
        error["message"],
        422,
        "bad scenario",
        {"provider_error": {"detail": "bad scenario"}},
    )
    failed = Operation.from_json(op_json("failed", True, error={"code": "provider_failed"}))
    assert outcome_of(failed) is Outcome.FAILED and failed.error is not None
    assert failed.error.message == "provider_failed" and failed.error.http_status is None


def test_progress_is_typed_from_either_shape() -> None:
    typed = {"completed": 3, "total": 10, "detail": {"completed": 3, "total": 10}}
    assert Operation.from_json(op_json(progress=typed)).progress == Progress(3, 10, typed["detail"])
    older = Operation.from_json(op_json(progress={"completed": 3, "total": "ten"}))
    assert older.progress == Progress(3, None, {"completed": 3, "total": "ten"})
    assert Operation.from_json(op_json()).progress is None


def test_the_list_asks_for_the_operations_awaiting_a_decision() -> None:
    asked: list[httpx.QueryParams] = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.params)
        return httpx.Response(200, json={"operations": [], "next_cursor": None})

    with client_with(handler) as api:
        api.list(awaiting_decision=True)
        api.list(done=False, awaiting_decision=False)
    assert dict(asked[0]) == {"awaiting_decision": "true"}
    assert dict(asked[1]) == {"done": "false", "awaiting_decision": "false"}


@pytest.mark.parametrize(
    ("status", "code", "cls"),
    [
        (400, "invalid_request", errors.InvalidRequest),
        (400, "callback_url_forbidden", errors.InvalidRequest),
        (413, "payload_too_large", errors.PayloadTooLarge),
        (401, "unauthenticated", errors.AuthenticationFailed),
        (403, "forbidden", errors.PermissionDenied),
        (404, "not_found", errors.NotFound),
        (410, "operation_pruned", errors.Gone),
        (409, "idempotency_key_reused", errors.IdempotencyConflict),
        (409, "decision_not_allowed", errors.DecisionNotAllowed),
        (409, "conflict", errors.Conflict),
        (405, "method_not_allowed", errors.InvalidRequest),
        (500, "internal", errors.ServiceError),
        (503, "storage_unavailable", errors.ServiceError),
    ],
)
def test_error_codes_map_to_one_family(status: int, code: str, cls: type[Exception]) -> None:
    body = json.dumps({"error": {"code": code, "message": "what to fix"}}).encode()
    exc = error_for(status, body)
    assert type(exc) is cls
    assert "what to fix" in exc.message
    if cls is not errors.ServiceError:
        assert exc.code == code


def test_an_answer_that_is_not_json_is_a_service_error() -> None:
    exc = error_for(502, b"<html>bad gateway</html>")
    assert isinstance(exc, errors.ServiceError) and exc.status == 502


class Flaky:
    """A transport that fails to connect ``failures`` times, then answers."""

    def __init__(self, failures: int, answer: httpx.Response) -> None:
        self.failures, self.answer, self.calls = failures, answer, 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        if self.calls <= self.failures:
            raise httpx.ConnectError("refused", request=request)
        return self.answer


def client_with(handler: Any, retries: int = 2) -> Client:
    return Client(
        "http://svc.test",
        "tok",
        retries=retries,
        retry_delay=0,
        transport=httpx.MockTransport(handler),
    )


def test_reads_are_retried_after_connection_errors() -> None:
    flaky = Flaky(2, httpx.Response(200, json=op_json()))
    with client_with(flaky) as api:
        assert api.get("op_0001").id == "op_0001"
    assert flaky.calls == 3


def test_retries_are_bounded() -> None:
    flaky = Flaky(5, httpx.Response(200, json=op_json()))
    with client_with(flaky) as api, pytest.raises(errors.ServiceError, match="could not reach"):
        api.get("op_0001")
    assert flaky.calls == 3


def test_a_start_without_a_key_is_never_resent() -> None:
    flaky = Flaky(1, httpx.Response(202, json=op_json()))
    with client_with(flaky) as api, pytest.raises(errors.ServiceError, match="idempotency_key"):
        api.start("sim", {"x": 1})
    assert flaky.calls == 1


def test_a_start_with_a_key_is_resent() -> None:
    flaky = Flaky(1, httpx.Response(202, json=op_json()))
    with client_with(flaky) as api:
        api.start("sim", {"x": 1}, idempotency_key="k1")
    assert flaky.calls == 2


def test_an_error_answer_is_never_retried() -> None:
    calls: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(503, json={"error": {"code": "storage_unavailable", "message": "x"}})

    with client_with(handler) as api, pytest.raises(errors.ServiceError):
        api.get("op_0001")
    assert len(calls) == 1


def test_wait_asks_within_the_service_cap_and_stops_at_max_wait() -> None:
    asked: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/openapi.json":
            return httpx.Response(200, json=_document(cap=0.02))
        asked.append(float(request.url.params["timeout_seconds"]))
        return httpx.Response(200, json=op_json())

    with client_with(handler) as api:
        op = api.wait("op_0001", max_wait=0.1)
    assert not op.done
    assert len(asked) >= 2 and max(asked) <= 0.02


def _document(cap: float) -> dict[str, Any]:
    wait = {"parameters": [{"name": "timeout_seconds", "schema": {"maximum": cap}}]}
    return {"paths": {"/v1/operations/{op_id}/wait": {"get": wait}}}


def test_run_gives_the_operation_id_when_it_times_out() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/openapi.json":
            return httpx.Response(200, json=_document(cap=0.01))
        body = json.loads(request.content) if request.method == "POST" else None
        assert body is None or body["idempotency_key"].startswith("run-")
        return httpx.Response(202 if body else 200, json=op_json())

    with client_with(handler) as api:
        run = api.run("sim", {"x": 1}, max_wait=0.03)
    assert run.outcome is Outcome.TIMED_OUT and run.operation_id == "op_0001"


def test_the_async_client_maps_errors_the_same_way() -> None:
    import asyncio

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404, json={"error": {"code": "not_found", "message": "no op"}})

    async def main() -> None:
        async with AsyncClient(
            "http://svc.test", "tok", transport=httpx.MockTransport(handler)
        ) as api:
            with pytest.raises(errors.NotFound, match="no op"):
                await api.get("op_x")

    asyncio.run(main())


# --- verify_callback -------------------------------------------------------------------

NOW = 1_800_000_000


def signed(body: bytes, msg_id: str = "op_0001", ts: int = NOW) -> dict[str, str]:
    signature = Webhook(SECRET).sign(msg_id, datetime.fromtimestamp(ts, UTC), body.decode())
    return {"Webhook-Id": msg_id, "Webhook-Timestamp": str(ts), "Webhook-Signature": signature}


def event_body() -> bytes:
    event = {"type": "operation.completed", "operation": op_json("succeeded", True)}
    return json.dumps(event).encode()


def test_a_callback_verifies_and_parses() -> None:
    body = event_body()
    event = verify_callback(body, signed(body), SECRET, now=NOW, replay_guard=ReplayGuard())
    assert event.type == "operation.completed" and event.webhook_id == "op_0001"
    assert event.operation.state == "succeeded"


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (
            lambda h, b: ({**h, "Webhook-Signature": "v1,AAAA" + h["Webhook-Signature"][7:]}, b),
            errors.RejectReason.SIGNATURE_MISMATCH,
        ),
        (lambda h, b: (h, b + b" "), errors.RejectReason.SIGNATURE_MISMATCH),
        (
            lambda h, b: ({k: v for k, v in h.items() if k != "Webhook-Id"}, b),
            errors.RejectReason.MISSING_HEADER,
        ),
        (
            lambda h, b: ({**h, "Webhook-Timestamp": "1.5e9"}, b),
            errors.RejectReason.MALFORMED_HEADER,
        ),
    ],
)
def test_a_bad_signature_is_refused(mutate: Any, reason: errors.RejectReason) -> None:
    body = event_body()
    headers, body = mutate(signed(body), body)
    with pytest.raises(errors.SignatureRejected) as caught:
        verify_callback(body, headers, SECRET, now=NOW, replay_guard=ReplayGuard())
    assert caught.value.reason is reason


def test_another_secret_is_refused() -> None:
    body = event_body()
    other = "whsec_" + base64.b64encode(b"someone-else-entirely-000000000").decode()
    with pytest.raises(errors.SignatureRejected):
        verify_callback(body, signed(body), other, now=NOW, replay_guard=ReplayGuard())


@pytest.mark.parametrize("age", [301, -301])
def test_an_old_or_future_timestamp_is_refused(age: int) -> None:
    body = event_body()
    with pytest.raises(errors.SignatureRejected) as caught:
        verify_callback(body, signed(body, ts=NOW - age), SECRET, now=NOW)
    assert caught.value.reason is errors.RejectReason.TIMESTAMP_OUT_OF_TOLERANCE


def test_a_replay_is_refused_but_a_fresh_retry_passes() -> None:
    guard = ReplayGuard()
    body = event_body()
    headers = signed(body)
    verify_callback(body, headers, SECRET, now=NOW, replay_guard=guard)
    with pytest.raises(errors.SignatureRejected) as caught:
        verify_callback(body, headers, SECRET, now=NOW + 1, replay_guard=guard)
    assert caught.value.reason is errors.RejectReason.REPLAYED
    # The service's next attempt about the same operation is signed with a new timestamp.
    retry = signed(body, ts=NOW + 5)
    assert verify_callback(body, retry, SECRET, now=NOW + 5, replay_guard=guard).webhook_id


def test_the_default_guard_is_per_process() -> None:
    body = event_body()
    headers = signed(body, msg_id="op_default_guard")
    verify_callback(body, headers, SECRET, now=NOW)
    with pytest.raises(errors.SignatureRejected):
        verify_callback(body, headers, SECRET, now=NOW)


def test_a_forged_delivery_does_not_fill_the_guard() -> None:
    guard = ReplayGuard()
    body = event_body()
    forged = {**signed(body), "Webhook-Signature": "v1," + base64.b64encode(b"x" * 32).decode()}
    with pytest.raises(errors.SignatureRejected):
        verify_callback(body, forged, SECRET, now=NOW, replay_guard=guard)
    verify_callback(body, signed(body), SECRET, now=NOW, replay_guard=guard)


def test_a_signed_body_that_is_not_an_event_is_invalid() -> None:
    body = b"[1, 2]"
    with pytest.raises(errors.InvalidRequest):
        verify_callback(body, signed(body), SECRET, now=NOW, replay_guard=ReplayGuard())


def test_the_memory_store_forgets_expired_keys_and_stays_bounded() -> None:
    clock = [100.0]
    store = MemorySeenStore(limit=3, now=lambda: clock[0])
    assert store.remember("a", 150) and not store.remember("a", 150)
    store.remember("b", 110)
    store.remember("c", 200)
    clock[0] = 120.0  # b expired
    assert store.remember("d", 300)  # full: b is pruned, nothing live is lost
    assert not store.remember("a", 150) and not store.remember("c", 200)
    assert store.remember("e", 300)  # still full of live keys: the least recently seen goes
    assert store.remember("d", 300)


def test_history_follows_the_service_pages() -> None:
    def entry(seq: int) -> dict[str, Any]:
        return {
            "seq": seq,
            "at": "2026-01-01T00:00:00Z",
            "kind": "note",
            "actor": "a",
            "cause": "c",
        }

    pages = {None: ([1, 2], "c2"), "c2": ([3], "c3"), "c3": ([4], None)}
    asked: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        cursor = request.url.params.get("cursor")
        asked.append(cursor)
        seqs, following = pages[cursor]
        body = {"operation_id": "op_1", "entries": [entry(s) for s in seqs]}
        return httpx.Response(200, json={**body, "next_cursor": following})

    with client_with(handler) as api:
        entries = api.history("op_1")
    assert [e.seq for e in entries] == [1, 2, 3, 4]
    assert asked == [None, "c2", "c3"]
