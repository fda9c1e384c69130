"""An httpx transport that sends over aiohttp: the httpx API, a cheaper connection layer.

Every outbound call (provider calls, agent callbacks) goes through httpx, and tests
swap the transport for ``httpx.MockTransport``. Under load httpcore's connection pool
and its anyio streams cost about three times the CPU of aiohttp's for the same calls
(``bench/throughput.py``'s bare client: 14.0 against 4.9 ms per operation), so the
service's own clients send through this one.

What the rest of the code relies on is kept: aiohttp's errors come back as httpx's
(``providers.transport.classify_transport_error`` reads them), with the OS error
in the chain; "nothing was sent" (a refused or timed-out connect, a full pool) stays
apart from "the peer went away after the request" (a reset or a close), because a create
that may have been delivered is never sent blind again. The URL goes out byte for byte
(a pre-signed URL's signature covers its encoding), the caller's Host header and the
``sni_hostname`` extension are honoured (the callback client's address pinning), and the
body is streamed, so a reader that stops at a size cap never buffers the rest.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

import aiohttp
import httpx
from yarl import URL

# Response head limits: aiohttp's defaults (8,190 bytes a line) are tighter than httpx's,
# and a provider's long header must not turn into a protocol error after the change.
MAX_LINE_BYTES = 65_536
MAX_HEADERS = 256


@functools.cache
def default_tls_context() -> ssl.SSLContext:
    """httpx's verifying context (certifi's roots), made once per process.

    Loading the roots takes about 45 ms of CPU, which every client paid again when it
    made its own; a context is safe to share between connections, threads and loops.
    """
    return httpx.create_ssl_context(trust_env=False)


def _mapped(exc: aiohttp.ClientError) -> httpx.TransportError:
    """httpx's exception for aiohttp's, worded so the classifier reads it the same way."""
    text = str(exc) or type(exc).__name__
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return httpx.ConnectTimeout(text)
    if isinstance(exc, aiohttp.ServerTimeoutError):
        return httpx.ReadTimeout(text)
    if isinstance(exc, aiohttp.ClientConnectorError):
        return httpx.ConnectError(text)
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return httpx.RemoteProtocolError(
            f"Server disconnected without a complete response ({text})"
        )
    if isinstance(exc, aiohttp.ClientPayloadError):
        if "not completed" in text:
            return httpx.RemoteProtocolError(
                f"peer closed connection without sending complete message body ({text})"
            )
        return httpx.RemoteProtocolError(text)
    if isinstance(exc, aiohttp.NonHttpUrlClientError):
        return httpx.UnsupportedProtocol(text)
    if isinstance(exc, aiohttp.ClientResponseError):
        return httpx.RemoteProtocolError(text)  # an answer that is not valid HTTP
    if isinstance(exc, aiohttp.ClientOSError):
        return httpx.ReadError(text)  # reset or broken pipe after connecting
    return httpx.NetworkError(text)


@contextmanager
def _translated() -> Iterator[None]:
    try:
        yield
    except aiohttp.InvalidURL as exc:
        raise httpx.InvalidURL(str(exc)) from exc
    except aiohttp.ClientError as exc:
        raise _mapped(exc) from exc


class _Body(httpx.AsyncByteStream):
    """The response body as it arrives; a body left unread closes its connection."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self._finished = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with _translated():
            async for chunk in self._response.content.iter_any():
                yield chunk
        self._finished = True

    async def aclose(self) -> None:
        if self._finished:
            self._response.release()  # back to the pool
        else:
            self._response.close()  # unread bytes: never reused


class AiohttpTransport(httpx.AsyncBaseTransport):
    """One aiohttp session per event loop, made on first use (aiohttp binds to its loop).

    ``limits``: ``max_connections`` bounds the open connections (None: unbounded),
    ``keepalive_expiry`` how long an idle one is kept, and ``max_keepalive_connections=0``
    closes each after its response (aiohttp has no other count of idle connections).
    """

    def __init__(self, *, limits: httpx.Limits, verify: ssl.SSLContext | bool = True) -> None:
        self._limits = limits
        if isinstance(verify, ssl.SSLContext):
            self._ssl: ssl.SSLContext | bool = verify
        elif verify:
            self._ssl = default_tls_context()
        else:
            self._ssl = False
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _current(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is not None and self._loop is not loop:
            # Made on a loop that is gone (a second ``asyncio.run``): its connections died
            # with it, and closing it would need that loop. Dropped without a warning.
            self._session.detach()
        if self._session is None or self._session.closed:
            limits = self._limits
            connector = aiohttp.TCPConnector(
                limit=limits.max_connections or 0,
                limit_per_host=0,
                force_close=limits.max_keepalive_connections == 0,
                keepalive_timeout=(
                    None if limits.max_keepalive_connections == 0 else limits.keepalive_expiry
                ),
                ssl=self._ssl,
                # getaddrinfo on each new connection, as httpx did: no cache of its own, and
                # never c-ares, whose errors carry no socket.gaierror to classify.
                use_dns_cache=False,
                resolver=aiohttp.ThreadedResolver(),
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                cookie_jar=aiohttp.DummyCookieJar(),  # httpx's client keeps the cookies
                auto_decompress=False,  # httpx decodes, as it does for its own transport
                trust_env=False,
                max_line_size=MAX_LINE_BYTES,
                max_field_size=MAX_LINE_BYTES,
                max_headers=MAX_HEADERS,
            )
            self._loop = loop
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        session = self._current()
        timeout = request.extensions.get("timeout", {})
        body = await request.aread()
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw]
        with _translated():
            response = await session.request(
                request.method,
                URL(str(request.url), encoded=True),
                headers=headers,
                data=body or None,
                allow_redirects=False,
                compress=None,
                timeout=aiohttp.ClientTimeout(
                    total=None,
                    connect=timeout.get("pool"),
                    sock_connect=timeout.get("connect"),
                    sock_read=timeout.get("read"),
                ),
                server_hostname=request.extensions.get("sni_hostname"),
            )
        version = response.version or aiohttp.HttpVersion11
        return httpx.Response(
            status_code=response.status,
            headers=response.raw_headers,
            stream=_Body(response),
            request=request,
            extensions={
                "http_version": f"HTTP/{version.major}.{version.minor}".encode(),
                "reason_phrase": (response.reason or "").encode("latin-1", "replace"),
            },
        )

    async def aclose(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None
