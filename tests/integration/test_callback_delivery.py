"""Agent callback delivery against a real receiver (uvicorn on 127.0.0.1), plus its pure helpers.

Signatures are checked with the independent ``standardwebhooks`` package.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import random
import socket
import ssl
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from hypothesis import given
from hypothesis import strategies as st
from standardwebhooks import Webhook

from reconciler.core.backoff import BackoffPolicy
from reconciler.core.canonical import canonical_json
from reconciler.core.clock import Clock, ManualClock, SystemClock
from reconciler.core.completion_retry import next_attempt_delay
from reconciler.core.errors import InvalidRequest
from reconciler.core.signatures import decode_whsec
from reconciler.core.vocabulary import TransportError
from reconciler.outbound.callbacks import CallbackClient, DeliveryOutcome, status_verdict
from tests.support.waiting import wait_until

SECRET = "whsec_" + base64.b64encode(bytes(range(32))).decode()
EVENT = {"type": "operation.completed", "operation": {"id": "op_1", "state": "succeeded"}}
WEBHOOK_ID = "op_1.callback"
Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


# --- a recording receiver ----------------------------------------------------


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    peer: tuple[str, int] | None = None  # the sender's end of the connection


@dataclass
class Receiver:
    """An ASGI app whose behaviour is chosen by the request path."""

    requests: list[Received] = field(default_factory=list)
    released: threading.Event = field(default_factory=threading.Event)
    huge_total_chunks: int = 1024
    huge_chunks_sent: int = 0
    huge_disconnected: threading.Event = field(default_factory=threading.Event)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "http"
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        if scope["method"] != "POST":
            # Not a delivery: another test's probe of a server it had on this port before
            # the kernel handed the port to this receiver (bound to port 0).
            await respond(send, 404, [], b"not a callback delivery")
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        peer = tuple(scope["client"]) if scope.get("client") else None
        self.requests.append(Received(scope["method"], scope["path"], headers, body, peer))
        path = scope["path"]
        if path == "/hang":
            await self._wait_released()
        elif path == "/drip":
            await self._drip(send)
        elif path == "/huge":
            await self._huge(receive, send)
        elif path == "/cut":
            # Promises more body than it sends: the connection ends mid-body.
            headers = [(b"content-length", b"1000")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": b"partial"})
        else:
            status, extra, text = ROUTES[path]
            await respond(send, status, extra, text)

    async def _wait_released(self) -> None:
        for _ in range(400):
            if self.released.is_set():
                return
            await asyncio.sleep(0.05)

    async def _drip(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for _ in range(400):
            if self.released.is_set():
                break
            await send({"type": "http.response.body", "body": b".", "more_body": True})
            await asyncio.sleep(0.05)
        await send({"type": "http.response.body", "body": b""})

    async def _huge(self, receive: Receive, send: Send) -> None:
        async def watch() -> None:
            if (await receive())["type"] == "http.disconnect":
                self.huge_disconnected.set()

        watcher = asyncio.create_task(watch())
        await send({"type": "http.response.start", "status": 200, "headers": []})
        chunk = b"x" * 65536
        for _ in range(self.huge_total_chunks):
            if self.huge_disconnected.is_set():
                break
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            self.huge_chunks_sent += 1
            await asyncio.sleep(0)
        await send({"type": "http.response.body", "body": b""})
        watcher.cancel()


async def respond(send: Send, status: int, extra: list[tuple[bytes, bytes]], text: bytes) -> None:
    headers = [(b"content-type", b"text/plain"), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": text})


ROUTES: dict[str, tuple[int, list[tuple[bytes, bytes]], bytes]] = {
    "/ok": (200, [], b"thanks"),
    "/accepted": (202, [], b""),
    "/gone": (410, [], b"this hook was deleted"),
    "/busy": (429, [(b"retry-after", b"7")], b"slow down"),
    "/unavailable": (503, [], b"maintenance"),
    "/redirect": (302, [(b"location", b"http://169.254.169.254/latest/meta-data/")], b""),
}


@contextmanager
def serve(
    app: Receiver, certfile: Path | None = None, keyfile: Path | None = None
) -> Iterator[int]:
    """Run ``app`` on 127.0.0.1 with an ephemeral port; yield the port."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = int(sock.getsockname()[1])
    config = uvicorn.Config(
        app,
        lifespan="off",
        log_level="warning",
        access_log=False,
        ws="none",
        http="h11",
        loop="asyncio",
        timeout_graceful_shutdown=2,
        ssl_certfile=str(certfile) if certfile else None,
        ssl_keyfile=str(keyfile) if keyfile else None,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()

    def started() -> bool:
        assert thread.is_alive(), "the receiver stopped during start-up"
        return bool(server.started)

    wait_until(started, 10, "the receiver to start")
    try:
        yield port
    finally:
        app.released.set()
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@pytest.fixture
def receiver() -> Receiver:
    return Receiver()


@pytest.fixture
def port(receiver: Receiver) -> Iterator[int]:
    with serve(receiver) as bound:
        yield bound


# --- helpers ---------------------------------------------------------------------


def table_resolver(
    table: Mapping[str, Sequence[str]], calls: list[str] | None = None
) -> Callable[[str, int], Awaitable[list[str]]]:
    async def resolve(host: str, port: int) -> list[str]:
        if calls is not None:
            calls.append(host)
        if host not in table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return list(table[host])

    return resolve


class CountingTransport(httpx.AsyncBaseTransport):
    """A real transport that records every request it is asked to send."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self.urls: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.urls.append(str(request.url))
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def make_client(
    allow: Sequence[str] = ("127.0.0.1",),
    *,
    clock: Clock | None = None,
    timeout: float = 5.0,
    max_bytes: int = 65_536,
    resolver: Callable[[str, int], Awaitable[list[str]]] | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    verify: ssl.SSLContext | bool = True,
) -> CallbackClient:
    return CallbackClient(
        signing_key=decode_whsec(SECRET),
        allow_hosts=allow,
        clock=clock or SystemClock(),
        timeout_seconds=timeout,
        max_response_bytes=max_bytes,
        resolver=resolver or table_resolver({}),
        transport=transport,
        verify=verify,
    )


def deliver_each(url: str, webhook_ids: Sequence[str], **kwargs: Any) -> list[DeliveryOutcome]:
    """One delivery per webhook id, one after another through one client."""

    async def run() -> list[DeliveryOutcome]:
        async with make_client(**kwargs) as client:
            return [await client.deliver(url, webhook_id, EVENT) for webhook_id in webhook_ids]

    return asyncio.run(run())


def deliver(url: str, **kwargs: Any) -> DeliveryOutcome:
    [outcome] = deliver_each(url, [WEBHOOK_ID], **kwargs)
    return outcome


# --- outcomes against a real receiver ----------------------------------------------


def test_delivered_event_verifies_with_standard_webhooks(receiver: Receiver, port: int) -> None:
    outcome = deliver(f"http://127.0.0.1:{port}/ok?agent=a1")
    assert outcome.delivered is True
    assert outcome.http_status == 200
    assert outcome.permanent is False and outcome.retryable is False
    assert outcome.error is None and outcome.refused is None
    assert outcome.address == "127.0.0.1"
    assert outcome.response_bytes == len(b"thanks")
    [got] = receiver.requests
    assert (got.method, got.path) == ("POST", "/ok")
    assert got.headers["webhook-id"] == WEBHOOK_ID
    assert got.headers["content-type"] == "application/json"
    assert got.headers["host"] == f"127.0.0.1:{port}"
    assert json.loads(got.body) == EVENT
    assert Webhook(SECRET).verify(got.body, got.headers) == EVENT


def test_a_2xx_other_than_200_is_delivered(receiver: Receiver, port: int) -> None:
    assert deliver(f"http://127.0.0.1:{port}/accepted").delivered is True


def test_gone_is_permanent(receiver: Receiver, port: int) -> None:
    outcome = deliver(f"http://127.0.0.1:{port}/gone")
    assert (outcome.delivered, outcome.permanent, outcome.http_status) == (False, True, 410)
    assert outcome.error == "the receiver answered HTTP 410: this hook was deleted"


def test_too_many_requests_is_retryable_with_retry_after(receiver: Receiver, port: int) -> None:
    outcome = deliver(f"http://127.0.0.1:{port}/busy")
    assert (outcome.delivered, outcome.retryable, outcome.http_status) == (False, True, 429)
    assert outcome.retry_after == "7"


def test_unavailable_is_retryable(receiver: Receiver, port: int) -> None:
    outcome = deliver(f"http://127.0.0.1:{port}/unavailable")
    assert (outcome.delivered, outcome.retryable, outcome.http_status) == (False, True, 503)
    assert outcome.retry_after is None


def test_redirect_is_not_followed_and_the_target_never_contacted(
    receiver: Receiver, port: int
) -> None:
    calls: list[str] = []
    transport = CountingTransport(httpx.AsyncHTTPTransport(retries=0))
    outcome = deliver(
        f"http://127.0.0.1:{port}/redirect",
        transport=transport,
        resolver=table_resolver({}, calls),
    )
    assert (outcome.delivered, outcome.permanent, outcome.http_status) == (False, True, 302)
    assert outcome.error is not None and "redirects are not followed" in outcome.error
    assert [r.path for r in receiver.requests] == ["/redirect"]
    assert transport.urls == [f"http://127.0.0.1:{port}/redirect"]
    assert calls == []


def test_hanging_receiver_times_out_within_the_bound(receiver: Receiver, port: int) -> None:
    started = time.monotonic()
    outcome = deliver(f"http://127.0.0.1:{port}/hang", timeout=0.5)
    took = time.monotonic() - started
    assert outcome.transport_error is TransportError.TIMEOUT
    assert outcome.retryable is True and outcome.http_status is None
    assert 0.4 <= took < 2.0
    assert 400 <= outcome.elapsed_ms < 2000


def test_slow_drip_is_cut_by_the_attempt_deadline(receiver: Receiver, port: int) -> None:
    # Every byte arrives well within the read timeout; only the overall deadline stops it.
    started = time.monotonic()
    outcome = deliver(f"http://127.0.0.1:{port}/drip", timeout=0.5, max_bytes=10_000)
    took = time.monotonic() - started
    assert took < 2.0
    # The 200 arrived before the deadline, so the receiver has the event.
    assert outcome.delivered is True and outcome.http_status == 200
    assert 400 <= outcome.elapsed_ms < 2000


def test_huge_response_is_read_only_up_to_the_cap(receiver: Receiver, port: int) -> None:
    outcome = deliver(f"http://127.0.0.1:{port}/huge", max_bytes=100_000)
    assert outcome.delivered is True
    assert outcome.response_bytes == 100_000
    assert receiver.huge_disconnected.wait(timeout=10)
    assert receiver.huge_chunks_sent < receiver.huge_total_chunks


def test_status_decides_even_when_the_body_breaks_off(receiver: Receiver, port: int) -> None:
    outcome = deliver(f"http://127.0.0.1:{port}/cut")
    assert outcome.delivered is True and outcome.http_status == 200


def test_connection_refused_is_retryable() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free_port = probe.getsockname()[1]
    outcome = deliver(f"http://127.0.0.1:{free_port}/ok")
    assert outcome.transport_error is TransportError.CONNECTION_REFUSED
    assert outcome.retryable is True
    assert outcome.error == "the connection was refused"


# --- SSRF at delivery and pinning -------------------------------------------------------


class NeverConnect(httpx.AsyncBaseTransport):
    def __init__(self) -> None:
        self.asked: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.asked.append(str(request.url))
        raise AssertionError(f"a connection was attempted to {request.url}")


def test_name_resolving_to_private_address_is_refused_and_never_connected() -> None:
    transport = NeverConnect()
    outcome = deliver(
        "https://callbacks.example/hook",
        allow=(),
        resolver=table_resolver({"callbacks.example": ["10.0.0.1"]}),
        transport=transport,
    )
    assert outcome.delivered is False and outcome.permanent is True
    assert outcome.refused == (
        "callback_url host callbacks.example resolves to a private address (10.0.0.1); "
        "such addresses are refused unless listed in callbacks.allow_hosts"
    )
    assert outcome.address is None and outcome.http_status is None
    assert transport.asked == []


def test_literal_metadata_address_is_refused_and_never_connected() -> None:
    transport = NeverConnect()
    outcome = deliver("http://169.254.169.254/latest/meta-data/", allow=(), transport=transport)
    assert outcome.refused is not None and "cloud metadata" in outcome.refused
    assert transport.asked == []


def test_unresolvable_host_is_retryable() -> None:
    transport = NeverConnect()
    outcome = deliver("https://nowhere.example/hook", allow=(), transport=transport)
    assert outcome.transport_error is TransportError.DNS
    assert outcome.retryable is True and outcome.refused is None
    assert transport.asked == []


def test_allow_listed_name_is_pinned_to_the_checked_address(receiver: Receiver, port: int) -> None:
    # callbacks.example does not exist in real DNS: reaching the receiver proves the
    # connection went to the address the guard resolved and checked.
    calls: list[str] = []
    outcome = deliver(
        f"http://callbacks.example:{port}/ok",
        allow=("callbacks.example",),
        resolver=table_resolver({"callbacks.example": ["127.0.0.1"]}, calls),
    )
    assert outcome.delivered is True and outcome.address == "127.0.0.1"
    assert calls == ["callbacks.example"]
    [got] = receiver.requests
    assert got.headers["host"] == f"callbacks.example:{port}"
    assert Webhook(SECRET).verify(got.body, got.headers) == EVENT


def test_dns_rebinding_between_attempts_is_refused(receiver: Receiver, port: int) -> None:
    answers = iter([["127.0.0.1"], ["10.0.0.1"]])

    async def rebinding(host: str, port_: int) -> list[str]:
        return next(answers)

    async def run() -> list[DeliveryOutcome]:
        async with make_client(("127.0.0.1",), resolver=rebinding) as client:
            url = f"http://callbacks.example:{port}/ok"
            return [await client.deliver(url, WEBHOOK_ID, EVENT) for _ in range(2)]

    first, second = asyncio.run(run())
    assert first.delivered is True
    assert second.delivered is False and second.permanent is True
    assert second.refused is not None and "10.0.0.1" in second.refused
    assert len(receiver.requests) == 1


def test_next_checked_address_is_tried_when_a_connection_is_refused(
    receiver: Receiver, port: int
) -> None:
    # The receiver listens on 127.0.0.1 only, so 127.0.0.2 refuses the connection.
    resolver = table_resolver({"callbacks.example": ["127.0.0.2", "127.0.0.1"]})
    outcome = deliver(
        f"http://callbacks.example:{port}/ok", allow=("127.0.0.0/8",), resolver=resolver
    )
    assert outcome.delivered is True and outcome.address == "127.0.0.1"
    assert len(receiver.requests) == 1


# --- https: pinned connection, certificate checked for the original name --------------


def _name(text: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])


def make_tls_files(directory: Path, dns_name: str) -> tuple[Path, Path, Path]:
    """A throw-away CA and a server certificate for ``dns_name``: (ca, cert, key)."""
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(_name("test ca"))
        .issuer_name(_name("test ca"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(dns_name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(dns_name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    ca_path, cert_path, key_path = (directory / n for n in ("ca.pem", "cert.pem", "key.pem"))
    ca_path.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return ca_path, cert_path, key_path


def named(name: str, context: ssl.SSLContext) -> dict[str, Any]:
    """A client's settings for a receiver at ``name``, which resolves to loopback."""
    return {
        "allow": (name,),
        "resolver": table_resolver({name: ["127.0.0.1"]}),
        "verify": context,
    }


@pytest.fixture
def tls_receiver(tmp_path: Path, receiver: Receiver) -> Iterator[tuple[int, ssl.SSLContext]]:
    ca, cert, key = make_tls_files(tmp_path, "callbacks.example")
    with serve(receiver, certfile=cert, keyfile=key) as bound:
        yield bound, ssl.create_default_context(cafile=str(ca))


def test_https_is_pinned_and_verified_for_the_original_name(
    receiver: Receiver, tls_receiver: tuple[int, ssl.SSLContext]
) -> None:
    port, context = tls_receiver
    outcome = deliver(f"https://callbacks.example:{port}/ok", **named("callbacks.example", context))
    assert outcome.delivered is True and outcome.address == "127.0.0.1"
    [got] = receiver.requests
    assert got.headers["host"] == f"callbacks.example:{port}"
    assert Webhook(SECRET).verify(got.body, got.headers) == EVENT


def test_https_deliveries_each_open_a_connection_of_their_own(
    receiver: Receiver, tls_receiver: tuple[int, ssl.SSLContext]
) -> None:
    port, context = tls_receiver
    outcomes = deliver_each(
        f"https://callbacks.example:{port}/ok",
        [f"{WEBHOOK_ID}.{i}" for i in range(3)],
        **named("callbacks.example", context),
    )
    assert all(o.delivered for o in outcomes)
    # A kept TLS connection would carry the session verified for one name to the next.
    assert len({got.peer for got in receiver.requests}) == 3, receiver.requests


def test_plain_http_deliveries_to_one_address_share_a_kept_connection(
    receiver: Receiver, port: int
) -> None:
    names = {"a.example": ["127.0.0.1"], "b.example": ["127.0.0.1"]}
    allow = tuple(names)

    async def run() -> list[DeliveryOutcome]:
        async with make_client(allow, resolver=table_resolver(names)) as client:
            return [
                await client.deliver(f"http://{name}:{port}/ok", f"{WEBHOOK_ID}.{i}", EVENT)
                for i, name in enumerate(["a.example", "b.example", "a.example"])
            ]

    assert all(o.delivered for o in asyncio.run(run()))
    # One connection to the checked address; each request names its own host.
    assert len({got.peer for got in receiver.requests}) == 1, receiver.requests
    assert [got.headers["host"] for got in receiver.requests] == [
        f"{name}:{port}" for name in ["a.example", "b.example", "a.example"]
    ]


def test_https_certificate_for_another_name_is_refused(
    receiver: Receiver, tls_receiver: tuple[int, ssl.SSLContext]
) -> None:
    port, context = tls_receiver
    outcome = deliver(f"https://impostor.example:{port}/ok", **named("impostor.example", context))
    assert outcome.delivered is False and outcome.retryable is True
    assert outcome.transport_error is TransportError.TLS
    assert receiver.requests == []


# --- the request as built (no network) -------------------------------------------------


def test_request_is_rewritten_to_the_address_signed_with_the_injected_clock() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(204)

    clock = ManualClock()
    resolver = table_resolver({"hooks.example": ["93.184.216.34"]})

    async def run() -> list[DeliveryOutcome]:
        async with make_client(
            (), clock=clock, resolver=resolver, transport=httpx.MockTransport(handler)
        ) as client:
            first = await client.deliver("https://Hooks.Example/cb?x=1", WEBHOOK_ID, EVENT)
            clock.advance(30)
            second = await client.deliver("https://Hooks.Example/cb?x=1", WEBHOOK_ID, EVENT)
            return [first, second]

    outcomes = asyncio.run(run())
    assert all(o.delivered and o.http_status == 204 for o in outcomes)
    first, second = seen
    assert str(first.url) == "https://93.184.216.34/cb?x=1"
    assert first.headers["host"] == "hooks.example"
    assert first.extensions["sni_hostname"] == "hooks.example"
    body = canonical_json(EVENT).encode()
    assert first.content == body
    for request, when in ((first, clock.now() - dt.timedelta(seconds=30)), (second, clock.now())):
        assert request.headers["webhook-id"] == WEBHOOK_ID
        assert request.headers["webhook-timestamp"] == str(int(when.timestamp()))
        expected = Webhook(SECRET).sign(WEBHOOK_ID, when, body.decode())
        assert request.headers["webhook-signature"] == expected


def test_webhook_id_must_be_header_safe() -> None:
    async def run() -> None:
        async with make_client(transport=NeverConnect()) as client:
            await client.deliver("http://127.0.0.1/ok", "bad id\n", EVENT)

    with pytest.raises(InvalidRequest, match="webhook_id"):
        asyncio.run(run())


def test_repr_hides_the_key() -> None:
    client = make_client(transport=NeverConnect())
    assert str(decode_whsec(SECRET)) not in repr(client)
    assert "allow_hosts=..." in repr(client)
    asyncio.run(client.aclose())


# --- pure helpers ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "delivered", "permanent"),
    [
        (200, True, False),
        (204, True, False),
        (301, False, True),
        (302, False, True),
        (307, False, True),
        (400, False, True),
        (401, False, True),
        (404, False, True),
        (408, False, False),
        (410, False, True),
        (413, False, True),
        (425, False, False),
        (429, False, False),
        (500, False, False),
        (502, False, False),
        (503, False, False),
    ],
)
def test_status_verdict(status: int, delivered: bool, permanent: bool) -> None:
    assert status_verdict(status) == (delivered, permanent)


NOW = dt.datetime(2025, 4, 18, 10, 20, tzinfo=dt.UTC)
POLICY = BackoffPolicy(base_seconds=2.0, max_seconds=300.0, jitter_floor=0.5)


@given(attempt=st.integers(min_value=0, max_value=200), seed=st.integers())
def test_backoff_without_retry_after_stays_in_the_jitter_band(attempt: int, seed: int) -> None:
    delay = next_attempt_delay(attempt, None, NOW, POLICY, random.Random(seed)).total_seconds()
    raw = POLICY.raw(attempt)
    assert POLICY.jitter_floor * raw <= delay <= raw <= POLICY.max_seconds


@given(
    attempt=st.integers(min_value=0, max_value=30),
    asked=st.integers(min_value=0, max_value=10**6),
    seed=st.integers(),
)
def test_retry_after_is_a_minimum_up_to_the_ceiling(attempt: int, asked: int, seed: int) -> None:
    ceiling = dt.timedelta(hours=1)
    delay = next_attempt_delay(attempt, str(asked), NOW, POLICY, random.Random(seed), ceiling)
    floor = min(dt.timedelta(seconds=asked), ceiling)
    assert delay >= floor
    assert delay <= max(floor, dt.timedelta(seconds=POLICY.raw(attempt)))


@given(attempt=st.integers(min_value=0, max_value=3), seed=st.integers())
def test_a_retry_never_shares_the_second_of_the_attempt_before(attempt: int, seed: int) -> None:
    quick = BackoffPolicy(base_seconds=0.05, max_seconds=0.2, jitter_floor=0.0)
    delay = next_attempt_delay(attempt, None, NOW, quick, random.Random(seed))
    assert delay >= dt.timedelta(seconds=1)  # a new signed timestamp, not a replay


def test_retry_after_as_http_date_and_invalid_values() -> None:
    rng = random.Random(1)
    date = "Fri, 18 Apr 2025 10:30:00 GMT"  # ten minutes after NOW
    assert next_attempt_delay(0, date, NOW, POLICY, rng) == dt.timedelta(minutes=10)
    for junk in ["soon", "-5", "", "1.5"]:
        assert next_attempt_delay(0, junk, NOW, POLICY, rng) <= dt.timedelta(seconds=2)
    huge = next_attempt_delay(0, "99999999", NOW, POLICY, rng)
    assert huge == dt.timedelta(hours=6)
