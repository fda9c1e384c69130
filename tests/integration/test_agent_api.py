"""The agent API over real HTTP: idempotent create, bad input, the Operation shape, listing.

The service and the simulated provider run on uvicorn on loopback; the database is
SQLite or PostgreSQL (``db_url``).
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from reconciler.storage.tokens import create_token
from reconciler.wire import Operation as OperationView
from tests.support import loopback
from tests.support.stack import SIM_TOML, Stack, running_stack
from tests.support.waiting import wait_until

FAST_POLLING = {"base_delay_seconds": 0.1, "max_delay_seconds": 0.5}
# The key set is the wire model's: stated there once.
VIEW_KEYS = frozenset(OperationView.model_fields)
END_STATES = {
    "succeeded",
    "completed_with_errors",
    "failed",
    "cancelled",
    "result_timed_out",
    "result_unavailable",
    "result_validation_failed",
    "cancellation_unconfirmed",
}


@pytest.fixture
def stack(tmp_path: Path, db_url: str) -> Iterator[Stack]:
    with running_stack(tmp_path, db_url, provider={"polling": FAST_POLLING}) as running:
        yield running


def second_agent(stack: Stack, name: str = "agent-2") -> dict[str, str]:
    with stack.runtime.db.write() as conn:
        token = create_token(conn, name, "agent", stack.runtime.clock.now())
    return {"Authorization": f"Bearer {token}"}


def count_rows(stack: Stack) -> tuple[int, int]:
    with stack.runtime.db.read() as conn:
        ops = conn.execute(sa.text("SELECT count(*) FROM operations")).scalar_one()
        entries = conn.execute(sa.text("SELECT count(*) FROM history")).scalar_one()
    return int(ops), int(entries)


def provider_jobs(stack: Stack) -> list[dict[str, Any]]:
    response = loopback.get(f"{stack.sim_url}/_sim/jobs", timeout=10)
    response.raise_for_status()
    jobs: list[dict[str, Any]] = response.json()["jobs"]
    return jobs


def settle(stack: Stack, op_id: str, timeout: float = 40.0) -> None:
    """Wait until the worker has nothing left to write for this operation (done, and its
    completion steps closed), so that a row count afterwards sees only what the API adds."""

    def settled() -> bool:
        with stack.runtime.db.read() as conn:
            row = conn.execute(
                sa.text("SELECT state, completion_pending FROM operations WHERE id = :id"),
                {"id": op_id},
            ).one()
        return row.state in END_STATES and not row.completion_pending

    wait_until(settled, timeout, f"{op_id} to settle")


def token_of(stack: Stack, op_id: str) -> str:
    with stack.runtime.db.read() as conn:
        token = conn.execute(
            sa.text("SELECT idempotency_token FROM operations WHERE id = :id"), {"id": op_id}
        ).scalar_one()
    return str(token)


# --- idempotency --------------------------------------------------------------------------


def test_same_key_and_request_return_the_same_operation_and_one_job(stack: Stack) -> None:
    request = {"duration": 0.2, "account": "acct_218"}
    first = stack.create(request, idempotency_key="report-feb")
    second = stack.create(request, idempotency_key="report-feb")
    assert first.status_code == 202, first.text
    assert second.status_code == 200, second.text
    op_id = first.json()["id"]
    assert second.json()["id"] == op_id
    # The answer says it is the earlier job, in the message and in a flag.
    assert first.json()["replayed"] is False and second.json()["replayed"] is True
    assert second.json()["message"].startswith("This is the job started earlier")
    final = stack.wait(op_id, timeout=40)
    third = stack.create(request, idempotency_key="report-feb")
    assert third.status_code == 200 and third.json()["id"] == op_id
    assert third.json()["replayed"] is True and third.json()["done"] is True
    assert stack.get(op_id)["replayed"] is False  # a read is not a replay
    assert final["state"] == "succeeded"
    assert count_rows(stack)[0] == 1
    jobs = stack.sim_key(token_of(stack, op_id))
    assert [j["job_id"] for j in jobs] == [final["remote_job_id"]]
    assert len(provider_jobs(stack)) == 1


def test_same_key_with_another_request_is_a_conflict(stack: Stack) -> None:
    first = stack.create({"duration": 0.2, "account": "acct_218"}, idempotency_key="k-1")
    assert first.status_code == 202
    settle(stack, first.json()["id"])
    before = count_rows(stack)
    other = stack.create({"duration": 0.2, "account": "acct_999"}, idempotency_key="k-1")
    assert other.status_code == 409, other.text
    error = other.json()["error"]
    assert error["code"] == "idempotency_key_reused"
    assert "'k-1' was already used for a different request" in error["message"]
    assert first.json()["id"] in error["message"]
    assert "use a new key" in error["message"]
    assert count_rows(stack) == before
    assert len(provider_jobs(stack)) == 1


def test_the_same_key_from_two_agents_makes_two_operations(stack: Stack) -> None:
    request = {"duration": 0.2}
    mine = stack.create(request, idempotency_key="shared-key")
    body = {"provider": "sim", "request": request, "idempotency_key": "shared-key"}
    theirs = stack.client.post("/v1/operations", json=body, headers=second_agent(stack))
    assert mine.status_code == 202 and theirs.status_code == 202, theirs.text
    assert mine.json()["id"] != theirs.json()["id"]
    a = stack.wait_state(mine.json()["id"], END_STATES, timeout=40)
    b = stack.wait_state(theirs.json()["id"], END_STATES, timeout=40)
    assert a["state"] == b["state"] == "succeeded"
    assert a["remote_job_id"] != b["remote_job_id"]
    assert len(provider_jobs(stack)) == 2


def test_concurrent_identical_creates_make_one_operation_and_one_job(stack: Stack) -> None:
    threads_count = 10
    barrier = threading.Barrier(threads_count)
    answers: list[httpx.Response] = []
    lock = threading.Lock()
    body = {"provider": "sim", "request": {"duration": 0.2}, "idempotency_key": "burst"}

    def post() -> None:
        with loopback.client(base_url=stack.url, timeout=30) as client:
            barrier.wait(timeout=10)
            response = client.post("/v1/operations", json=body, headers=stack.headers())
        with lock:
            answers.append(response)

    threads = [threading.Thread(target=post) for _ in range(threads_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(answers) == threads_count
    assert sorted(r.status_code for r in answers) == [200] * 9 + [202], [
        (r.status_code, r.text) for r in answers
    ]
    assert len({r.json()["id"] for r in answers}) == 1
    op_id = answers[0].json()["id"]
    final = stack.wait(op_id, timeout=40)
    assert final["state"] == "succeeded"
    assert count_rows(stack)[0] == 1
    creations = [e for e in stack.history(op_id) if e["to"] == "create_pending"]
    assert len(creations) == 1
    assert [j["job_id"] for j in provider_jobs(stack)] == [final["remote_job_id"]]


# --- bad input: a 4xx JSON error that says what to fix, nothing stored, never a 500 --------

LIMIT = 1_048_576  # server.max_body_bytes (default)


def _json(body: Any) -> dict[str, Any]:
    return {"content": json.dumps(body).encode(), "headers": {"Content-Type": "application/json"}}


def _raw(data: bytes) -> dict[str, Any]:
    return {"content": data, "headers": {"Content-Type": "application/json"}}


def _create(**fields: Any) -> dict[str, Any]:
    return _json({"provider": "sim", "request": {"duration": 1}, **fields})


BAD_CREATES: list[tuple[str, dict[str, Any], int, str]] = [
    ("missing provider", _json({"request": {}}), 400, "'provider' is required"),
    (
        "provider not a string",
        _json({"provider": 5, "request": {}}),
        400,
        "'provider' must be a string, got a number",
    ),
    (
        "unknown provider",
        _json({"provider": "acme", "request": {}}),
        400,
        "unknown provider 'acme'; known providers: sim",
    ),
    (
        "missing request",
        _json({"provider": "sim"}),
        400,
        "'request' is required: the JSON body of the provider's create call",
    ),
    (
        "request not an object",
        _json({"provider": "sim", "request": [1, 2]}),
        400,
        "'request' must be a JSON object, got an array",
    ),
    (
        "key not a string",
        _create(idempotency_key=7),
        400,
        "'idempotency_key' must be a string, got a number",
    ),
    ("key empty", _create(idempotency_key=""), 400, "'idempotency_key' must not be empty"),
    (
        "key too long",
        _create(idempotency_key="k" * 201),
        400,
        "'idempotency_key' must be at most 200 characters",
    ),
    (
        "deadline negative",
        _create(deadline_seconds=-5),
        400,
        "'deadline_seconds' must be greater than 0",
    ),
    (
        "deadline a string",
        _create(deadline_seconds="60"),
        400,
        "'deadline_seconds' must be a number, got a string",
    ),
    (
        "deadline above the provider limit",
        _create(deadline_seconds=121),
        400,
        "'deadline_seconds' may be at most 120 for provider 'sim'",
    ),
    (
        "budget zero",
        _create(max_status_requests=0),
        400,
        "'max_status_requests' must be greater than 0",
    ),
    (
        "budget a float",
        _create(max_status_requests=2.5),
        400,
        "'max_status_requests' must be a whole number",
    ),
    (
        "budget above the provider limit",
        _create(max_status_requests=61),
        400,
        "'max_status_requests' may be at most 60 for provider 'sim'",
    ),
    (
        "metadata not an object",
        _create(metadata="x"),
        400,
        "'metadata' must be a JSON object, got a string",
    ),
    (
        "metadata too big",
        _create(metadata={"blob": "x" * 17_000}),
        400,
        "'metadata' must be at most 16384 bytes as JSON",
    ),
    ("unknown field", _create(priority="high"), 400, "unknown field(s): priority; allowed:"),
    ("body not JSON", _raw(b"{provider: sim}"), 400, "body is not valid JSON"),
    ("body not UTF-8", _raw(b'{"provider": "\xff\xfe"}'), 400, "body is not valid UTF-8"),
    ("empty body", _raw(b""), 400, "body is empty; send a JSON object"),
    (
        "body an array",
        _json([{"provider": "sim"}]),
        400,
        "the request body must be a JSON object, got an array",
    ),
    (
        "oversized body",
        _raw(b'{"a": "' + b"x" * LIMIT + b'"}'),
        413,
        f"body is larger than the limit of {LIMIT} bytes",
    ),
    (
        "absurd nesting",
        _raw(b'{"provider": "sim", "request": ' + b"[" * 5000 + b"]" * 5000 + b"}"),
        400,
        "body nests deeper than 64 levels",
    ),
    (
        "huge integer",
        _raw(b'{"provider": "sim", "request": {"n": 1' + b"0" * 5000 + b"}}"),
        400,
        "integer with more than 40 digits",
    ),
    (
        "callback to a private address",
        _create(callback_url="http://10.0.0.1/hook"),
        400,
        "callback_url points to a private",
    ),
    (
        "callback to the metadata address",
        _create(callback_url="http://169.254.169.254/latest/meta-data"),
        400,
        "refused unless listed in callbacks.allow_hosts",
    ),
]


def assert_error(response: httpx.Response, status: int, fragment: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error: dict[str, Any] = response.json()["error"]
    assert set(error) == {"code", "message"}
    assert isinstance(error["code"], str) and error["code"]
    assert fragment in error["message"], error["message"]
    return error


def test_each_bad_create_is_refused_with_a_message_and_nothing_stored(stack: Stack) -> None:
    """One stack for all cases (start-up dominates); every failing case is reported."""
    failures: list[str] = []
    for case, send, status, fragment in BAD_CREATES:
        before = count_rows(stack)
        response = stack.client.post(
            "/v1/operations",
            content=send["content"],
            headers={**send["headers"], **stack.headers()},
        )
        try:
            assert_error(response, status, fragment)
            assert count_rows(stack) == before, "rows were stored"
        except AssertionError as exc:
            failures.append(f"{case}: {exc}")
    assert failures == []
    assert count_rows(stack) == (0, 0)
    assert provider_jobs(stack) == []


def raw_post(
    stack: Stack, headers: dict[str, str], body: bytes, then: bytes = b""
) -> tuple[int, dict[str, Any]]:
    """POST bytes over a plain socket, headers exactly as given (httpx would fix a lying
    Content-Length); returns the status and the JSON body of the first answer.

    ``then`` is sent after the answer has been read: a server that answers and closes
    while a client still sends makes the kernel reset the connection, which can discard
    the answer before the client reads it."""
    url = httpx.URL(stack.url)
    assert url.host and url.port
    head = [
        "POST /v1/operations HTTP/1.1",
        f"Host: {url.host}:{url.port}",
        "Connection: close",
        "Content-Type: application/json",
        f"Authorization: Bearer {stack.agent_token}",
        *(f"{name}: {value}" for name, value in headers.items()),
    ]
    with socket.create_connection((url.host, url.port), timeout=10) as sock:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        data = b""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if b"\r\n\r\n" in data:
                top, _, rest = data.partition(b"\r\n\r\n")
                length = re.search(rb"(?i)\r\ncontent-length: *(\d+)", top)
                if length and len(rest) >= int(length.group(1)):
                    break
            try:
                chunk = sock.recv(65_536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            data += chunk
        if then:
            # The server stopped reading at the declared length, as it should.
            with contextlib.suppress(OSError):
                sock.sendall(then)
    top, _, rest = data.partition(b"\r\n\r\n")
    status = int(top.split(b" ", 2)[1])
    answer: dict[str, Any] = json.loads(rest)
    return status, answer


def test_bodies_that_lie_about_their_length_are_refused(stack: Stack) -> None:
    before = count_rows(stack)
    small = b'{"provider": "sim", "request": {"duration": 1}}'
    # Declares more than the limit but sends a small body: refused on the header alone.
    status, answer = raw_post(stack, {"Content-Length": str(LIMIT + 1)}, small)
    assert status == 413, answer
    assert "larger than the limit" in answer["error"]["message"]

    # Declares fewer bytes than it sends (the rest is over the limit): only the declared
    # bytes are read, and they are not a JSON document.
    big = b'{"provider": "sim", "request": {"a": "' + b"x" * (LIMIT + 10) + b'"}}'
    status, answer = raw_post(stack, {"Content-Length": "10"}, big[:10], then=big[10:])
    assert status == 400, answer
    assert "body is not valid JSON" in answer["error"]["message"]

    # No Content-Length at all (chunked) and more than the limit: cut off while streaming.
    def chunks() -> Iterator[bytes]:
        yield b'{"provider": "sim", "request": {"a": "'
        for _ in range(20):
            yield b"x" * 65_536
        yield b'"}}'

    json_type = {**stack.headers(), "Content-Type": "application/json"}
    streamed = stack.client.post("/v1/operations", content=chunks(), headers=json_type)
    assert_error(streamed, 413, "larger than the limit")
    assert count_rows(stack) == before


def test_missing_or_invalid_bearer_token_is_401(stack: Stack) -> None:
    before = count_rows(stack)
    body = {"provider": "sim", "request": {"duration": 1}}
    missing = stack.client.post("/v1/operations", json=body)
    assert_error(missing, 401, "missing Authorization header")
    assert missing.headers["www-authenticate"] == "Bearer"
    wrong = stack.client.post(
        "/v1/operations", json=body, headers={"Authorization": "Bearer rk_not-a-real-token"}
    )
    assert_error(wrong, 401, "the bearer token is not valid")
    scheme = stack.client.get("/v1/operations", headers={"Authorization": "Basic abc"})
    assert_error(scheme, 401, "Authorization must be 'Bearer <token>'")
    assert count_rows(stack) == before


def test_another_agents_operation_is_not_found(stack: Stack) -> None:
    op_id = stack.create({"duration": 0.2}).json()["id"]
    settle(stack, op_id)
    other = second_agent(stack)
    for path in (f"/v1/operations/{op_id}", f"/v1/operations/{op_id}/history"):
        response = stack.client.get(path, headers=other)
        assert_error(response, 404, f"operation {op_id} does not exist")
    before = count_rows(stack)
    cancel = stack.client.post(f"/v1/operations/{op_id}/cancel", headers=other)
    assert_error(cancel, 404, f"operation {op_id} does not exist")
    assert count_rows(stack) == before
    # The owner and an operator do see it.
    assert stack.get(op_id)["id"] == op_id
    assert stack.get(op_id, operator=True)["id"] == op_id


BAD_LISTS = [
    ({"state": "finished"}, "'state' must be one of: create_pending"),
    ({"limit": "0"}, "'limit' must be a whole number from 1 to 200"),
    ({"limit": "abc"}, "'limit' must be a whole number from 1 to 200"),
    ({"limit": "201"}, "'limit' must be a whole number from 1 to 200"),
    ({"limit": "-1"}, "'limit' must be a whole number from 1 to 200"),
    ({"cursor": "!!!"}, "cursor is not valid"),
    ({"cursor": "eHl6"}, "cursor is not valid"),  # base64 of "xyz": not an operation id
    ({"page": "2"}, "unknown query parameter(s): page"),
    ({"awaiting_decision": "yes"}, "'awaiting_decision' must be true or false"),
    # A filter that names nothing would answer an empty page, which reads as "none".
    ({"provider": "nope"}, "unknown provider 'nope' in the filter; known providers: sim"),
]


def test_each_bad_list_query_is_400(stack: Stack) -> None:
    failures: list[str] = []
    for params, fragment in BAD_LISTS:
        response = stack.client.get("/v1/operations", params=params, headers=stack.headers())
        try:
            assert_error(response, 400, fragment)
        except AssertionError as exc:
            failures.append(f"{params}: {exc}")
    assert failures == []


def test_unknown_routes_and_wrong_methods_answer_json(stack: Stack) -> None:
    before = count_rows(stack)
    unknown = stack.client.post("/v1/nothing-here", json={}, headers=stack.headers())
    error = assert_error(unknown, 404, "no route for POST /v1/nothing-here")
    assert error["code"] == "not_found"
    wrong = stack.client.delete("/v1/operations", headers=stack.headers())
    error = assert_error(wrong, 405, "DELETE is not allowed on /v1/operations")
    assert error["code"] == "method_not_allowed"
    put = stack.client.put("/v1/operations/op_x/cancel", headers=stack.headers())
    assert_error(put, 405, "PUT is not allowed")
    assert count_rows(stack) == before


# --- behaviour -------------------------------------------------------------------------------


def test_the_operation_has_the_spec_shape_and_done_only_at_the_end(stack: Stack) -> None:
    running = stack.create({"scenario": "never_finishes", "duration": 5, "total": 500})
    op_id = running.json()["id"]
    op = stack.wait_state(op_id, {"observing"}, timeout=20)
    op = wait_until(
        lambda: (seen := stack.get(op_id))["progress"] is not None and seen,
        10,
        "the first progress report",
    )
    assert set(op) >= VIEW_KEYS
    assert op["id"] == op_id and op["id"].startswith("op_")
    assert op["provider"] == "sim"
    assert op["state"] == "observing"
    assert op["done"] is False
    assert isinstance(op["remote_job_id"], str) and op["remote_job_id"].startswith("job_")
    assert op["remote_state"] in ("queued", "running")
    assert "NOT complete" in op["message"] and "Do not report success" in op["message"]
    assert f"/v1/operations/{op_id}/wait" in op["message"]
    assert isinstance(op["poll_after_seconds"], int | float) and op["poll_after_seconds"] >= 1
    assert op["progress"]["total"] == 500
    assert isinstance(op["deadline_at"], str) and op["deadline_at"].endswith("Z")
    assert set(op["budget"]) == {"status_requests_used", "max_status_requests"}
    assert op["budget"]["max_status_requests"] == 60
    assert op["budget"]["status_requests_used"] >= 1
    assert op["result"] is None and op["error"] is None and op["escalation"] is None

    ok = stack.wait(stack.create({"duration": 0.2}).json()["id"], timeout=40)
    failed = stack.wait(
        stack.create({"scenario": "late_failure", "duration": 0.2}).json()["id"], timeout=40
    )
    for end, state in ((ok, "succeeded"), (failed, "failed")):
        assert set(end) >= VIEW_KEYS
        assert end["state"] == state and end["state"] in END_STATES
        assert end["done"] is True
        assert end["poll_after_seconds"] is None
    assert ok["result"] is not None and ok["error"] is None
    assert failed["error"] is not None and failed["result"] is None
    assert ok["message"] != failed["message"]
    assert "SUCCEEDED" in ok["message"] and "FAILED" in failed["message"]


def test_create_answers_quickly_while_the_provider_create_hangs(stack: Stack) -> None:
    started = time.monotonic()
    response = stack.create({"duration": 0.2, "create_fault": "delay", "create_delay": 3})
    elapsed = time.monotonic() - started
    assert response.status_code == 202, response.text
    op = response.json()
    assert elapsed < 2.0, elapsed
    assert op["state"] == "create_pending"
    assert op["done"] is False and op["remote_job_id"] is None
    assert "NOT started" in op["message"]
    final = stack.wait(op["id"], timeout=40)
    assert final["state"] == "succeeded", final
    jobs = stack.sim_key(token_of(stack, op["id"]))
    assert [j["job_id"] for j in jobs] == [final["remote_job_id"]]
    creates = [r for r in stack.sim.requests if r.endpoint == "create"]
    assert len(creates) == 1 and creates[0].fault == "delay"


@pytest.fixture
def two_provider_stack(tmp_path: Path, db_url: str) -> Iterator[Stack]:
    """The sim plus ``other``, a provider nobody answers for (its creates stay pending)."""
    files = tmp_path / "no-provider-files"
    files.mkdir()
    text = SIM_TOML.read_text().replace("[providers.sim", "[providers.other")
    text = text.replace("http://127.0.0.1:9000", "http://127.0.0.1:9")
    (files / "other.toml").write_text(text)
    with running_stack(tmp_path, db_url, provider={"polling": FAST_POLLING}) as running:
        yield running


def _list(stack: Stack, headers: dict[str, str], **params: Any) -> dict[str, Any]:
    response = stack.client.get("/v1/operations", params=params, headers=headers)
    assert response.status_code == 200, response.text
    page: dict[str, Any] = response.json()
    return page


def _ids(stack: Stack, headers: dict[str, str], **params: Any) -> list[str]:
    return [op["id"] for op in _list(stack, headers, **params)["operations"]]


def test_listing_filters_pages_and_scopes(two_provider_stack: Stack) -> None:
    stack = two_provider_stack
    agent = stack.headers()
    done = [stack.create({"duration": 0.2}).json()["id"] for _ in range(4)]
    running = [
        stack.create({"scenario": "never_finishes", "duration": 30}).json()["id"] for _ in range(3)
    ]
    body = {"provider": "other", "request": {"duration": 1}}
    pending = stack.client.post("/v1/operations", json=body, headers=agent).json()["id"]
    theirs = stack.client.post(
        "/v1/operations", json={"provider": "sim", "request": {}}, headers=second_agent(stack)
    ).json()["id"]
    for op_id in done:
        assert stack.wait(op_id, timeout=40)["state"] == "succeeded"
    for op_id in running:
        assert stack.wait_state(op_id, {"observing"}, timeout=20)["state"] == "observing"
    mine = [*done, *running, pending]

    # Paging: newest first, three pages of at most 3, then no cursor.
    pages: list[list[str]] = []
    cursor: str | None = None
    for _ in range(5):
        params: dict[str, Any] = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        page = _list(stack, agent, **params)
        pages.append([op["id"] for op in page["operations"]])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert [len(p) for p in pages] == [3, 3, 2]
    flat = [op_id for p in pages for op_id in p]
    assert flat == sorted(mine, reverse=True)

    # Filters.
    assert sorted(_ids(stack, agent, state="succeeded")) == sorted(done)
    assert sorted(_ids(stack, agent, state="observing")) == sorted(running)
    assert _ids(stack, agent, state="create_pending") == [pending]
    assert _ids(stack, agent, provider="other") == [pending]
    assert sorted(_ids(stack, agent, provider="sim")) == sorted([*done, *running])
    assert _ids(stack, agent, provider="sim", state="failed") == []
    every = _list(stack, agent)["operations"]
    assert all(set(op) >= VIEW_KEYS for op in every)

    # Scopes: an agent sees its own only; an operator sees everyone's.
    assert theirs not in _ids(stack, agent)
    operator = stack.headers(operator=True)
    assert sorted(_ids(stack, operator)) == sorted([*mine, theirs])
    assert theirs in _ids(stack, operator, provider="sim")


def test_a_non_ascii_digit_limit_is_a_400_not_a_500(tmp_path: Path, db_url: str) -> None:
    # str.isdigit() accepts '²'; int() does not.
    with running_stack(tmp_path, db_url) as stack:
        answer = stack.client.get("/v1/operations", params={"limit": "²"}, headers=stack.headers())
    assert answer.status_code == 400
    assert "limit" in answer.json()["error"]["message"]
