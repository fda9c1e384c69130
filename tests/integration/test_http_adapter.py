"""The declarative HTTP adapter against real servers on 127.0.0.1.

What the service's transport (aiohttp under httpx, ``providers/aiohttp_transport.py``)
gives for broken peers (and how the adapter names it):

* refused port: ``ConnectError`` caused by ``ConnectionRefusedError`` -> ``connection_refused``;
* server silent past the timeout: ``ReadTimeout`` -> ``timeout``;
* uvicorn closing mid-body (the app fails after the first bytes):
  ``RemoteProtocolError("peer closed connection without sending complete message body")``
  -> ``connection_reset``;
* a TCP reset (SO_LINGER 0) after the request: ``ReadError`` caused by
  ``ConnectionResetError`` -> ``connection_reset``;
* bytes that are not HTTP: ``RemoteProtocolError`` about an illegal status line -> ``protocol``;
* ``nonexistent.invalid``: ``ConnectError`` caused by ``socket.gaierror`` -> ``dns``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import functools
import hashlib
import json
import socket
import struct
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.types import Message, Receive, Scope, Send

from reconciler.core.clock import ManualClock
from reconciler.core.errors import ConfigError, UnsafePathValue
from reconciler.core.provider_calls import CallResult
from reconciler.core.vocabulary import RemoteCategory, TransportError
from reconciler.outbound import ssrf
from reconciler.providers.adapter import (
    CreateOutcome,
    LookupOutcome,
    LookupVerdict,
    StatusOutcome,
    Subject,
)
from reconciler.providers.call_request import fill_path
from reconciler.providers.http_adapter import HttpAdapter, build_adapter
from reconciler.providers.loader import parse_provider
from reconciler.providers.result_check import check_result
from reconciler.providers.spec import ProviderSpec
from reconciler.providers.transport import classify_transport_error
from tests.support.servers import serve_asgi, serve_tcp, unused_port

T = TypeVar("T")


def subject(job_id: str | None, trace_id: str = "tr", *, key: str = "idem_1") -> Subject:
    """What a call is about, as the engine gives it (``Subject.of`` an operation)."""
    return Subject("op_1", key, trace_id, job_id)


TOKEN = "tok-very-secret-42"
ENV = {"ACME_TOKEN": TOKEN}
RESULT = {"rows": [{"id": 1}, {"id": 2}], "summary": {"processed": 2, "failed": 0}}
RESULT_BYTES = json.dumps(RESULT).encode()
# The callback guard with loopback allowed, as callbacks.allow_hosts = ["127.0.0.1"] makes it.
LOOPBACK_ALLOWED = functools.partial(
    ssrf.resolve_and_check, allow_hosts=["127.0.0.1"], what="the result URL"
)


@dataclass
class Seen:
    method: str
    raw_path: str
    headers: dict[str, str]
    body: bytes = b""


@dataclass
class Recorder:
    requests: list[Seen] = field(default_factory=list)

    def last(self) -> Seen:
        assert self.requests, "the server saw no request"
        return self.requests[-1]


def _recording(app: Any, recorder: Recorder) -> Any:
    """Wrap an ASGI app so every request's raw path, headers and body are kept."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        chunks: list[bytes] = []
        more = True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        raw = scope["raw_path"] + (b"?" + scope["query_string"] if scope["query_string"] else b"")
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        recorder.requests.append(Seen(scope["method"], raw.decode(), headers, b"".join(chunks)))
        body = b"".join(chunks)
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await app(scope, replay, send)

    return wrapped


async def _create(request: Request) -> Response:
    return JSONResponse(
        {"job_id": "job_1", "state": "queued"},
        status_code=202,
        headers={"Location": "/v1/jobs/job_1", "x-request-id": "req-create-1", "Retry-After": "7"},
    )


async def _lookup(request: Request) -> Response:
    key = request.query_params.get("idempotency_key") or request.headers.get("idempotency-key")
    data = [{"job_id": "job_1"}] if key == "idem known/1" else []
    return JSONResponse({"data": data})


async def _slow(request: Request) -> Response:
    for _ in range(100):  # bounded: 5 s at most, and it stops when the client gives up
        if await request.is_disconnected():
            return Response(status_code=499)
        await asyncio.sleep(0.05)
    return JSONResponse({"job_id": "slow", "state": "running"})


async def _big_stream() -> Any:
    for _ in range(64):
        yield b" " * 1024


def _status_body(job_id: str) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "state": "succeeded" if job_id == "done" else "running",
        "poll_after_seconds": 30,
        "progress": {"completed": 146, "total": 500},
        "result": {
            "url": "/v1/jobs/done/result",
            "sha256": hashlib.sha256(RESULT_BYTES).hexdigest(),
            "size": len(RESULT_BYTES),
        },
    }


async def _status(request: Request) -> Response:
    job_id = request.path_params["job_id"]
    if job_id == "slow":
        return await _slow(request)
    if job_id == "big":
        return JSONResponse({"pad": "x" * 4096})
    if job_id == "big-stream":
        return StreamingResponse(_big_stream(), media_type="application/json")
    if job_id == "html":
        return Response("<html>Bad gateway</html>", media_type="text/html")
    if job_id == "limited":
        return JSONResponse({"error": "slow down"}, status_code=429, headers={"Retry-After": "120"})
    return JSONResponse(_status_body(job_id), headers={"request-id": f"req-{job_id}"})


async def _cancel(request: Request) -> Response:
    return JSONResponse({"job_id": request.path_params["job_id"], "state": "cancelling"}, 202)


async def _result(request: Request) -> Response:
    return Response(RESULT_BYTES, media_type="application/json")


async def _to_elsewhere(request: Request) -> Response:
    return RedirectResponse(request.query_params["to"], status_code=302)


async def _half_body(scope: Scope, receive: Receive, send: Send) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json"), (b"content-length", b"1000")],
        }
    )
    await send({"type": "http.response.body", "body": b'{"state": "runn', "more_body": True})
    raise RuntimeError("the provider fell over mid-response")


def provider_app() -> Starlette:
    return Starlette(
        routes=[
            Route("/v1/jobs", _create, methods=["POST"]),
            Route("/v1/jobs", _lookup, methods=["GET"]),
            Route("/v1/jobs/{job_id}", _status, methods=["GET"]),
            Route("/v1/jobs/{job_id}/cancel", _cancel, methods=["POST"]),
            Route("/v1/jobs/{job_id}/result", _result, methods=["GET"]),
            Route("/redirect", _to_elsewhere, methods=["GET"]),
            Mount("/half", app=_half_body),
        ]
    )


async def _file(request: Request) -> Response:
    return Response(b"col\n1\n", media_type="text/csv")


@pytest.fixture
def provider() -> Iterator[tuple[str, Recorder]]:
    recorder = Recorder()
    with serve_asgi(_recording(provider_app(), recorder)) as url:
        yield url, recorder


@pytest.fixture
def storage() -> Iterator[tuple[str, Recorder]]:
    """A second origin, like a storage host serving pre-signed result URLs."""
    recorder = Recorder()
    app = Starlette(routes=[Route("/files/{name}", _file)])
    with serve_asgi(_recording(app, recorder)) as url:
        yield url, recorder


def _spec(base_url: str, **changes: Any) -> ProviderSpec:
    data: dict[str, Any] = {
        "base_url": base_url,
        "auth": {"type": "bearer", "token_env": "ACME_TOKEN"},
        "trace_header": "X-Trace-ID",
        "http": {"max_response_bytes": 2048},
        "create": {
            "path": "/v1/jobs",
            "idempotency_header": "Idempotency-Key",
            "job_id": "/job_id",
            "state": "/state",
            "timeout_seconds": 5,
        },
        "lookup": {
            "path": "/v1/jobs?idempotency_key={idempotency_key}",
            "job_id": "/data/0/job_id",
        },
        "status": {
            "path": "/v1/jobs/{job_id}",
            "state": "/state",
            "job_id": "/job_id",
            "poll_after_seconds": "/poll_after_seconds",
            "progress": "/progress",
            "result_ref": "/result/url",
            "timeout_seconds": 5,
        },
        "states": {"pending": ["queued", "running"], "success": ["succeeded"]},
        "cancel": {"path": "/v1/jobs/{job_id}/cancel"},
        "result": {
            "path": "/v1/jobs/{job_id}/result",
            "required": ["/rows"],
            "content_type": "application/json",
            "checksum": "/result/sha256",
            "size": "/result/size",
            "summary": {"processed": "/summary/processed"},
        },
    }
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        target = data
        for key in parents:
            target = target.setdefault(key, {})
        if value is None:
            target.pop(leaf, None)
        else:
            target[leaf] = value
    return parse_provider("acme", copy.deepcopy(data), "test")


def _run(factory: Callable[[HttpAdapter], Awaitable[T]], spec: ProviderSpec, **kw: Any) -> T:
    async def main() -> T:
        adapter = HttpAdapter(spec, ENV, **kw)
        try:
            return await factory(adapter)
        finally:
            await adapter.aclose()

    return asyncio.run(main())


# --- what the adapter sends ---------------------------------------------------------------


def test_create_sends_idempotency_trace_and_bearer(provider: tuple[str, Recorder]) -> None:
    url, recorder = provider
    clock = ManualClock()
    outcome: CreateOutcome = _run(
        lambda a: a.create(
            {"report": "april", "rows": 3}, subject(None, "tr_0830d3", key="idem_5b5c76c7")
        ),
        _spec(url),
        clock=clock,
    )
    seen = recorder.last()
    assert (seen.method, seen.raw_path) == ("POST", "/v1/jobs")
    assert seen.headers["idempotency-key"] == "idem_5b5c76c7"
    assert seen.headers["x-trace-id"] == "tr_0830d3"
    assert seen.headers["authorization"] == f"Bearer {TOKEN}"
    assert seen.headers["content-type"] == "application/json"
    assert json.loads(seen.body) == {"report": "april", "rows": 3}
    call = outcome.call
    assert call.http_status == 202 and call.transport_error is None
    assert (call.location, call.retry_after, call.provider_request_id) == (
        "/v1/jobs/job_1",
        "7",
        "req-create-1",
    )
    assert call.sent_at == clock.now() and call.target == "/v1/jobs"
    assert (outcome.job_id, outcome.remote_state, outcome.category) == (
        "job_1",
        "queued",
        RemoteCategory.PENDING,
    )


def test_a_request_that_is_not_json_is_never_sent(provider: tuple[str, Recorder]) -> None:
    url, recorder = provider
    outcome: CreateOutcome = _run(
        lambda a: a.create({"n": float("nan")}, subject(None, "t")), _spec(url)
    )
    assert outcome.call.refused == "the request body is not JSON" and not recorder.requests
    assert not outcome.call.maybe_delivered and outcome.job_id is None


def test_every_call_carries_the_trace_header(provider: tuple[str, Recorder]) -> None:
    url, recorder = provider

    async def calls(adapter: HttpAdapter) -> None:
        await adapter.lookup(subject(None, "tr_1", key="idem known/1"))
        await adapter.status(subject("job_1", "tr_2"))
        await adapter.cancel(subject("job_1", "tr_3"))
        await adapter.fetch_result(subject("job_1", "tr_4"), None)

    _run(calls, _spec(url))
    assert [r.headers["x-trace-id"] for r in recorder.requests] == ["tr_1", "tr_2", "tr_3", "tr_4"]
    assert all(r.headers["authorization"] == f"Bearer {TOKEN}" for r in recorder.requests)
    # The idempotency header belongs to create (and to a lookup that has no path slot for it).
    assert all("idempotency-key" not in r.headers for r in recorder.requests)
    assert [r.method for r in recorder.requests] == ["GET", "GET", "POST", "GET"]


def test_lookup_puts_the_key_in_the_path(provider: tuple[str, Recorder]) -> None:
    url, recorder = provider
    found: LookupOutcome = _run(
        lambda a: a.lookup(subject(None, "tr", key="idem known/1")), _spec(url)
    )
    assert recorder.last().raw_path == "/v1/jobs?idempotency_key=idem%20known%2F1"
    assert (found.verdict, found.job_id) == (LookupVerdict.FOUND, "job_1")
    missing: LookupOutcome = _run(
        lambda a: a.lookup(subject(None, "tr", key="idem other")), _spec(url)
    )
    assert (missing.verdict, missing.job_id) == (LookupVerdict.NOT_FOUND, None)


def test_lookup_without_a_path_slot_sends_the_header(provider: tuple[str, Recorder]) -> None:
    url, recorder = provider
    spec = _spec(url, lookup__path="/v1/jobs")
    found: LookupOutcome = _run(lambda a: a.lookup(subject(None, "tr", key="idem known/1")), spec)
    assert recorder.last().headers["idempotency-key"] == "idem known/1"
    assert found.verdict is LookupVerdict.FOUND


def test_header_auth(provider: tuple[str, Recorder]) -> None:
    url, recorder = provider
    spec = _spec(url, auth={"type": "header", "name": "X-Api-Key", "value_env": "ACME_TOKEN"})
    _run(lambda a: a.status(subject("job_1", "tr")), spec)
    assert recorder.last().headers["x-api-key"] == TOKEN
    assert "authorization" not in recorder.last().headers


def test_status_view_and_response_metadata(provider: tuple[str, Recorder]) -> None:
    url, _ = provider
    outcome: StatusOutcome = _run(lambda a: a.status(subject("job_1", "tr")), _spec(url))
    assert outcome.call.http_status == 200 and outcome.call.provider_request_id == "req-job_1"
    view = outcome.view
    assert view is not None
    assert (view.remote_state, view.category) == ("running", RemoteCategory.PENDING)
    assert (view.poll_after, view.progress) == (30, {"completed": 146, "total": 500})
    assert view.job_id_matches is True


def test_job_ids_are_escaped_and_unsafe_ones_never_sent(provider: tuple[str, Recorder]) -> None:
    url, recorder = provider
    _run(lambda a: a.status(subject("a/b c?d", "tr")), _spec(url))
    assert recorder.last().raw_path == "/v1/jobs/a%2Fb%20c%3Fd"
    before = len(recorder.requests)
    outcome: StatusOutcome = _run(lambda a: a.status(subject("..", "tr")), _spec(url))
    assert outcome.call.refused is not None and not outcome.call.maybe_delivered
    assert outcome.view is None and len(recorder.requests) == before


def test_rate_limited_answer_keeps_retry_after(provider: tuple[str, Recorder]) -> None:
    url, _ = provider
    outcome: StatusOutcome = _run(lambda a: a.status(subject("limited", "tr")), _spec(url))
    assert (outcome.call.http_status, outcome.call.retry_after) == (429, "120")
    assert outcome.view is None


@pytest.mark.parametrize("job_id", ["big", "big-stream"])
def test_bodies_are_capped(provider: tuple[str, Recorder], job_id: str) -> None:
    url, _ = provider
    outcome: StatusOutcome = _run(lambda a: a.status(subject(job_id, "tr")), _spec(url))
    call = outcome.call
    assert call.http_status == 200 and call.too_large
    assert call.body is None and call.body_bytes is None and outcome.view is None


def test_a_non_json_answer_is_named(provider: tuple[str, Recorder]) -> None:
    url, _ = provider
    outcome: StatusOutcome = _run(lambda a: a.status(subject("html", "tr")), _spec(url))
    assert (
        outcome.call.parse_error
        == "the response is not JSON (content type 'text/html; charset=utf-8')"
    )
    assert outcome.view is None


# --- results ------------------------------------------------------------------------------


def test_result_by_path_passes_checks(provider: tuple[str, Recorder]) -> None:
    url, _ = provider
    spec = _spec(url)
    call: CallResult = _run(lambda a: a.fetch_result(subject("done", "tr"), None), spec)
    check = check_result(spec, call, _status_body("done"))
    assert check.ok, check.problems
    assert check.summary == {"processed": 2} and check.size == len(RESULT_BYTES)
    tampered = _status_body("done")
    tampered["result"]["sha256"] = "0" * 64
    assert check_result(spec, call, tampered).problems == (
        "the result's SHA-256 does not match the checksum in the status",
    )


def test_result_is_capped_at_max_bytes(provider: tuple[str, Recorder]) -> None:
    url, _ = provider
    spec = _spec(url, result__max_bytes=16)
    call: CallResult = _run(lambda a: a.fetch_result(subject("done", "tr"), None), spec)
    assert call.too_large and call.body_bytes is None
    assert check_result(spec, call, _status_body("done")).problems == (
        "the result is larger than 16 bytes",
    )


def test_result_url_on_another_origin_gets_no_credentials(
    provider: tuple[str, Recorder], storage: tuple[str, Recorder]
) -> None:
    url, recorder = provider
    storage_url, storage_seen = storage
    spec = _spec(url, result={"hosts": ["127.0.0.1"]})
    presigned = f"{storage_url}/files/out.csv?X-Amz-Signature=abc123"
    call: CallResult = _run(
        lambda a: a.fetch_result(subject("done", "t"), presigned), spec, guard=LOOPBACK_ALLOWED
    )
    assert call.http_status == 200 and call.body_bytes == b"col\n1\n" and call.body is None
    assert "authorization" not in storage_seen.last().headers
    assert storage_seen.last().headers["x-trace-id"] == "t"
    assert storage_seen.last().raw_path == "/files/out.csv?X-Amz-Signature=abc123"
    # A pre-signed query is a credential of its own: it stays out of the recorded target.
    assert call.target == f"{storage_url}/files/out.csv"
    same: CallResult = _run(
        lambda a: a.fetch_result(subject("done", "t"), "/v1/jobs/done/result"), spec
    )
    assert json.loads(same.body_bytes or b"") == RESULT
    assert recorder.last().headers["authorization"] == f"Bearer {TOKEN}"


def test_redirects_to_another_origin_drop_credentials(
    provider: tuple[str, Recorder], storage: tuple[str, Recorder]
) -> None:
    url, recorder = provider
    storage_url, storage_seen = storage
    spec = _spec(
        url,
        result={"hosts": ["127.0.0.1"]},
        auth={"type": "header", "name": "X-Api-Key", "value_env": "ACME_TOKEN"},
    )
    ref = f"{url}/redirect?to={storage_url}/files/out.csv"
    call: CallResult = _run(
        lambda a: a.fetch_result(subject("done", "t"), ref), spec, guard=LOOPBACK_ALLOWED
    )
    assert call.http_status == 200 and call.body_bytes == b"col\n1\n"
    assert recorder.last().headers["x-api-key"] == TOKEN
    assert "x-api-key" not in storage_seen.last().headers


NO_ALLOW_LIST = functools.partial(ssrf.resolve_and_check, allow_hosts=[], what="the result URL")


@pytest.mark.parametrize(
    ("listed", "refusal"),
    [((), "neither the provider's origin nor listed"), (("127.0.0.1",), "a loopback address")],
)
def test_a_result_url_on_another_loopback_port_is_never_requested(
    provider: tuple[str, Recorder],
    storage: tuple[str, Recorder],
    listed: tuple[str, ...],
    refusal: str,
) -> None:
    """The provider runs on loopback and passes (it is the configured origin); another port
    there (the service's own API, its metrics) does not, directly or by a redirect."""
    url, recorder = provider
    storage_url, storage_seen = storage
    spec = _spec(url, result={"hosts": list(listed)})
    for ref in (f"{storage_url}/files/out.csv", f"{url}/redirect?to={storage_url}/files/x"):
        call: CallResult = _run(
            lambda a, ref=ref: a.fetch_result(subject("done", "t"), ref), spec, guard=NO_ALLOW_LIST
        )
        assert call.refused is not None and refusal in call.refused, call
    assert storage_seen.requests == []
    assert [r.raw_path.split("?")[0] for r in recorder.requests] == ["/redirect"]


@pytest.mark.parametrize("ref", ["file:///etc/passwd", "ftp://example.com/x", "out-file-1", None])
def test_unusable_result_refs_are_refused(provider: tuple[str, Recorder], ref: str | None) -> None:
    url, recorder = provider
    call: CallResult = _run(
        lambda a: a.fetch_result(subject("done", "t"), ref), _spec(url, result=None)
    )
    assert call.refused is not None and call.http_status is None and not recorder.requests


def test_result_path_with_result_ref(provider: tuple[str, Recorder]) -> None:
    url, recorder = provider
    spec = _spec(url, result__path="/v1/jobs/{result_ref}/result")
    call: CallResult = _run(lambda a: a.fetch_result(subject("job_1", "t"), "done"), spec)
    assert json.loads(call.body_bytes or b"") == RESULT
    assert recorder.last().raw_path == "/v1/jobs/done/result"


def test_result_from_status_rereads_the_status(provider: tuple[str, Recorder]) -> None:
    url, recorder = provider
    spec = _spec(
        url, result={"from_status": "/progress", "required": ["/total"], "summary": {"t": "/total"}}
    )
    call: CallResult = _run(lambda a: a.fetch_result(subject("job_1", "t"), None), spec)
    assert recorder.last().raw_path == "/v1/jobs/job_1"
    check = check_result(spec, call, call.body)
    assert check.ok and check.document == {"completed": 146, "total": 500}
    assert check.summary == {"t": 500}


def test_cancel_without_a_cancel_table_is_refused(provider: tuple[str, Recorder]) -> None:
    url, recorder = provider
    call: CallResult = _run(lambda a: a.cancel(subject("job_1", "t")), _spec(url, cancel=None))
    assert call.refused == "the provider file has no [cancel] table" and not recorder.requests


# --- transport failures -------------------------------------------------------------------


def _status_call(base_url: str, timeout: float = 5) -> StatusOutcome:
    return _run(
        lambda a: a.status(subject("job_1", "tr")), _spec(base_url, status__timeout_seconds=timeout)
    )


def test_refused_port() -> None:
    outcome = _status_call(f"http://127.0.0.1:{unused_port()}")
    call = outcome.call
    assert call.transport_error is TransportError.CONNECTION_REFUSED
    assert call.http_status is None and not call.maybe_delivered
    assert call.transport_detail is not None and TOKEN not in call.transport_detail


def test_server_silent_past_the_timeout(provider: tuple[str, Recorder]) -> None:
    url, _ = provider
    outcome: StatusOutcome = _run(
        lambda a: a.status(subject("slow", "tr")), _spec(url, status__timeout_seconds=0.3)
    )
    assert outcome.call.transport_error is TransportError.TIMEOUT
    assert outcome.call.maybe_delivered  # the request went out; only the answer is missing
    assert outcome.call.elapsed_ms < 3000


def test_connection_closed_mid_response(provider: tuple[str, Recorder]) -> None:
    url, _ = provider
    spec = _spec(url, status__path="/half/{job_id}")
    outcome: StatusOutcome = _run(lambda a: a.status(subject("job_1", "tr")), spec)
    assert outcome.call.transport_error is TransportError.CONNECTION_RESET
    assert outcome.call.transport_detail is not None
    assert outcome.call.transport_detail.startswith("RemoteProtocolError: peer closed connection")


def _read_request(conn: socket.socket) -> None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            return
        data += chunk


def _reset(conn: socket.socket) -> None:
    _read_request(conn)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()


def _garbage(conn: socket.socket) -> None:
    _read_request(conn)
    conn.sendall(b"SMTP READY\r\n\r\n")
    conn.close()


def test_tcp_reset() -> None:
    with serve_tcp(_reset) as port:
        outcome = _status_call(f"http://127.0.0.1:{port}")
    assert outcome.call.transport_error is TransportError.CONNECTION_RESET
    assert outcome.call.maybe_delivered


def test_an_answer_that_is_not_http() -> None:
    with serve_tcp(_garbage) as port:
        outcome = _status_call(f"http://127.0.0.1:{port}")
    assert outcome.call.transport_error is TransportError.PROTOCOL


def _resolves_quickly_to_nothing(host: str, seconds: float) -> str | None:
    """None when ``host`` fails to resolve within ``seconds``; else why the case can't run."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    future = pool.submit(socket.getaddrinfo, host, 80)
    try:
        future.result(timeout=seconds)
    except socket.gaierror:
        return None
    except concurrent.futures.TimeoutError:
        return f"resolving {host} did not finish within {seconds} s in this environment"
    finally:
        pool.shutdown(wait=False)
    return f"{host} resolved here (a resolver that answers every name)"


def test_unresolvable_host() -> None:
    reason = _resolves_quickly_to_nothing("nonexistent.invalid", 3.0)
    if reason is not None:
        pytest.skip(reason)
    outcome = _status_call("http://nonexistent.invalid", timeout=3)
    assert outcome.call.transport_error is TransportError.DNS
    assert not outcome.call.maybe_delivered


# --- pure helpers -------------------------------------------------------------------------


def test_classify_transport_error_for_plain_exceptions() -> None:
    assert classify_transport_error(TimeoutError()) == (TransportError.TIMEOUT, True)
    refused = OSError("All connection attempts failed")
    refused.__cause__ = ConnectionRefusedError(111, "refused")
    assert classify_transport_error(refused)[0] is TransportError.CONNECTION_REFUSED
    grouped = OSError("x")
    grouped.__cause__ = ExceptionGroup("attempts", [socket.gaierror(-2, "unknown name")])
    assert classify_transport_error(grouped) == (TransportError.DNS, False)
    assert classify_transport_error(RuntimeError("?")) == (TransportError.OTHER, True)


def test_fill_path() -> None:
    ops = {"job_id": "operations/1"}
    assert fill_path("/v3/{job_id}:cancel", ops, keep_slashes=True) == "/v3/operations/1:cancel"
    assert fill_path("/v3/{job_id}", ops) == "/v3/operations%2F1"
    for bad in ("operations/../admin", "a//b", "."):
        with pytest.raises(UnsafePathValue):
            fill_path("/v3/{job_id}", {"job_id": bad}, keep_slashes=True)
    with pytest.raises(UnsafePathValue):
        fill_path("/files/{result_ref}", {"job_id": "j"})


# --- credentials and custom adapters ------------------------------------------------------


def test_credentials_stay_out_of_reprs_and_results(provider: tuple[str, Recorder]) -> None:
    url, _ = provider
    spec = _spec(url)
    outcome: StatusOutcome = _run(lambda a: a.status(subject("job_1", "tr")), spec)
    assert TOKEN not in repr(outcome) and TOKEN not in repr(spec)
    assert TOKEN not in repr(HttpAdapter(spec, ENV))


def test_missing_credential_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="environment variable ACME_TOKEN is not set"):
        HttpAdapter(_spec("http://127.0.0.1:9"), {})


class FakeAdapter:
    """A custom adapter, as ``adapter = "pkg.module:Class"`` names it."""

    def __init__(self, spec: ProviderSpec, environ: Any) -> None:
        self.spec = spec

    async def create(self, request: Any, subject: Subject) -> Any: ...
    async def lookup(self, subject: Subject) -> Any: ...
    async def status(self, subject: Subject) -> Any: ...
    async def cancel(self, subject: Subject) -> Any: ...
    async def fetch_result(self, subject: Subject, result_ref: str | None) -> Any: ...
    async def aclose(self) -> None: ...


class HalfAdapter:
    def __init__(self, spec: ProviderSpec, environ: Any) -> None: ...

    async def status(self, subject: Subject) -> Any: ...

    def aclose(self) -> None: ...


def test_build_adapter_loads_a_custom_class() -> None:
    spec = _spec("http://127.0.0.1:9", adapter="tests.integration.test_http_adapter:FakeAdapter")
    adapter = build_adapter(spec, ENV)
    assert isinstance(adapter, FakeAdapter) and adapter.spec is spec
    assert isinstance(build_adapter(_spec("http://127.0.0.1:9"), ENV), HttpAdapter)


@pytest.mark.parametrize(
    ("ref", "fragment"),
    [
        ("tests.integration.no_such_module:X", "cannot import tests.integration.no_such_module"),
        ("tests.integration.test_http_adapter:Nope", "has no class Nope"),
        ("tests.integration.test_http_adapter:TOKEN", "has no class TOKEN"),
        (
            "tests.integration.test_http_adapter:HalfAdapter",
            "does not implement the adapter protocol (missing async methods: "
            "create, lookup, cancel, fetch_result, aclose)",
        ),
    ],
)
def test_build_adapter_errors(ref: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        build_adapter(_spec("http://127.0.0.1:9", adapter=ref), ENV)
    assert caught.value.message.startswith("test: providers.acme.adapter: ")
    assert fragment in caught.value.message


@pytest.mark.parametrize("handed", ["result_ref", "redirect"])
def test_a_url_with_user_info_is_refused_not_raised(
    provider: tuple[str, Recorder], storage: tuple[str, Recorder], handed: str
) -> None:
    # Before: the client combined the URL's user info with a header of its own and raised
    # before sending; the step failed and was claimed again at once, for ever.
    url, _ = provider
    storage_url, storage_seen = storage
    with_password = storage_url.replace("http://", "http://user:pw-secret@") + "/files/out.csv"
    ref = with_password if handed == "result_ref" else f"{url}/redirect?to={with_password}"
    call: CallResult = _run(
        lambda a: a.fetch_result(subject("done", "t"), ref), _spec(url, result=None)
    )
    assert call.refused == "the URL carries user info" and call.http_status is None
    assert "pw-secret" not in call.target
    assert not storage_seen.requests
