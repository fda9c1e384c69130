"""The service's transport under httpx, against raw servers on 127.0.0.1 in the test's loop.

What the callers rely on: the request line and the Host header go out as httpx built
them; the pool's limits hold (a full pool is "nothing sent", a kept connection is reused,
``max_keepalive_connections=0`` opens one per request, and a body left unread never
returns its connection to the pool); a read timeout is "maybe delivered".
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import httpx
import pytest

from reconciler.core.vocabulary import TransportError
from reconciler.providers.aiohttp_transport import AiohttpTransport
from reconciler.providers.transport import classify_transport_error

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"


@dataclass
class Seen:
    heads: list[bytes] = field(default_factory=list)
    connections: int = 0
    arrived: asyncio.Event = field(default_factory=asyncio.Event)  # a held request is in
    release: asyncio.Event = field(default_factory=asyncio.Event)


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, Seen], Awaitable[None]]


async def _answer_each(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen: Seen
) -> None:
    """Answer every request on the connection with ``OK``, as a kept-alive server does."""
    while True:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        seen.heads.append(head)
        writer.write(OK)
        await writer.drain()


async def _hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen: Seen) -> None:
    """Read the request, then answer only when the test releases it."""
    seen.heads.append(await reader.readuntil(b"\r\n\r\n"))
    seen.arrived.set()
    await seen.release.wait()
    writer.write(OK)
    await writer.drain()


async def _big_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen: Seen) -> None:
    """A long body per request: a reader that stops early leaves bytes on the connection."""
    while True:
        try:
            seen.heads.append(await reader.readuntil(b"\r\n\r\n"))
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        body = b"x" * 1_000_000
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        await writer.drain()


@asynccontextmanager
async def server(handler: Handler) -> AsyncIterator[tuple[str, Seen]]:
    seen = Seen()

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.connections += 1
        try:
            await handler(reader, writer, seen)
        finally:
            writer.close()

    listener = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        seen.release.set()
        listener.close()


def _client(limits: httpx.Limits, timeout: float = 5.0) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=AiohttpTransport(limits=limits), timeout=timeout)


def test_the_request_line_and_host_go_out_as_built() -> None:
    async def scenario() -> bytes:
        async with server(_answer_each) as (url, seen), _client(httpx.Limits()) as client:
            # A pre-signed URL: its signature covers these exact escapes.
            target = url + "/r/a%2Fb%20c?sig=x%2By%3D&e=1"
            answer = await client.get(target, headers={"Host": "receiver.example:8443"})
            assert answer.status_code == 200 and answer.text == "ok"
            return seen.heads[0]

    head = asyncio.run(scenario())
    assert head.startswith(b"GET /r/a%2Fb%20c?sig=x%2By%3D&e=1 HTTP/1.1\r\n")
    assert b"\r\nHost: receiver.example:8443\r\n" in head


def test_a_kept_connection_is_reused_and_keepalive_zero_opens_one_per_request() -> None:
    async def connections(limits: httpx.Limits) -> int:
        async with server(_answer_each) as (url, seen), _client(limits) as client:
            for _ in range(3):
                assert (await client.get(url + "/")).status_code == 200
            return seen.connections

    assert asyncio.run(connections(httpx.Limits(max_connections=4))) == 1
    assert asyncio.run(connections(httpx.Limits(max_keepalive_connections=0))) == 3


def test_a_body_left_unread_never_returns_its_connection() -> None:
    async def scenario() -> int:
        async with server(_big_body) as (url, seen), _client(httpx.Limits()) as client:
            for _ in range(2):
                async with client.stream("GET", url + "/") as answer:
                    async for _chunk in answer.aiter_raw():
                        break  # a size cap reached: the rest is never read
            return seen.connections

    assert asyncio.run(scenario()) == 2


def test_a_full_pool_is_a_connect_timeout_and_nothing_was_sent() -> None:
    async def scenario() -> tuple[BaseException, int]:
        async with server(_hold) as (url, seen), _client(httpx.Limits(max_connections=1)) as client:
            first = asyncio.ensure_future(client.get(url + "/first"))
            await asyncio.wait_for(seen.arrived.wait(), 5)  # it holds the only connection
            with pytest.raises(httpx.TimeoutException) as caught:
                await client.get(url + "/second", timeout=httpx.Timeout(5.0, pool=0.2))
            seen.release.set()
            assert (await first).status_code == 200
            return caught.value, len(seen.heads)

    error, sent = asyncio.run(scenario())
    assert isinstance(error, httpx.ConnectTimeout)
    assert classify_transport_error(error) == (TransportError.TIMEOUT, False)
    assert sent == 1


def test_a_silent_server_is_a_read_timeout_that_may_have_been_delivered() -> None:
    async def scenario() -> BaseException:
        async with server(_hold) as (url, _seen), _client(httpx.Limits()) as client:
            with pytest.raises(httpx.TimeoutException) as caught:
                await client.post(
                    url + "/jobs", content=b"{}", timeout=httpx.Timeout(5.0, read=0.2)
                )
            return caught.value

    error = asyncio.run(scenario())
    assert isinstance(error, httpx.ReadTimeout)
    assert classify_transport_error(error) == (TransportError.TIMEOUT, True)


def test_one_transport_serves_one_event_loop_after_another() -> None:
    transport = AiohttpTransport(limits=httpx.Limits())

    async def one_call() -> int:
        async with server(_answer_each) as (url, _seen):
            client = httpx.AsyncClient(transport=transport)
            return (await client.get(url + "/")).status_code

    assert asyncio.run(one_call()) == 200
    assert asyncio.run(one_call()) == 200
    asyncio.run(transport.aclose())
