"""A minimal HTTP/1.1 server and client on asyncio and httptools, for the bench's own peers.

The throughput bench needs a provider and a callback receiver that cost next to nothing
per request, so that the service, not they, sets the rate it measures. A Starlette app
on uvicorn spends most of its time per request in the ASGI layers; this server parses
with httptools (uvicorn's own parser), calls a plain synchronous handler and writes the
answer with one ``transport.write``: keep-alive, pipelined requests answered in order,
``Content-Length`` bodies only (chunked request bodies are parsed too; nothing the bench
sends needs more).

``Poster`` is the matching client for the provider's webhooks: kept-alive connections
to one origin, a request sent again on a fresh connection when a kept one turns out to
have been closed by the peer (the event's id makes a repeat harmless to the service).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import httptools

REASONS = {
    200: b"OK",
    202: b"Accepted",
    204: b"No Content",
    400: b"Bad Request",
    401: b"Unauthorized",
    404: b"Not Found",
    405: b"Method Not Allowed",
    409: b"Conflict",
    500: b"Internal Server Error",
}


@dataclass
class Request:
    method: str
    target: str  # path and query, as sent
    headers: dict[str, str]  # names in lower case
    body: bytes

    @property
    def path(self) -> str:
        return self.target.partition("?")[0]

    @property
    def query(self) -> str:
        return self.target.partition("?")[2]


@dataclass
class Answer:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: list[tuple[str, str]] = field(default_factory=list)

    def encode(self, keep_alive: bool) -> bytes:
        head = [b"HTTP/1.1 %d %s" % (self.status, REASONS.get(self.status, b"Unknown"))]
        if self.status != 204:
            head.append(b"content-length: %d" % len(self.body))
            head.append(b"content-type: " + self.content_type.encode("latin-1"))
        head.extend(f"{k}: {v}".encode("latin-1") for k, v in self.headers)
        if not keep_alive:
            head.append(b"connection: close")
        return b"\r\n".join(head) + b"\r\n\r\n" + (b"" if self.status == 204 else self.body)


Handler = Callable[[Request], Answer]


class _ServerConnection(asyncio.Protocol):
    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport is not None:
                self.transport.write(Answer(400, b'{"error":"bad request"}').encode(False))
                self.transport.close()

    # httptools callbacks
    def on_message_begin(self) -> None:
        self.url = b""
        self.headers = {}
        self.body = []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        request = Request(
            self.parser.get_method().decode("ascii"),
            self.url.decode("latin-1"),
            self.headers,
            b"".join(self.body),
        )
        try:
            answer = self.handler(request)
        except Exception:
            answer = Answer(500, b'{"error":"internal error"}')
        keep = self.parser.should_keep_alive()
        self.transport.write(answer.encode(keep))
        if not keep:
            self.transport.close()


async def start_server(handler: Handler, host: str, port: int) -> asyncio.Server:
    loop = asyncio.get_running_loop()
    return await loop.create_server(lambda: _ServerConnection(handler), host, port, backlog=1024)


def run(main: Callable[[], object]) -> None:
    """Run the coroutine function ``main`` on uvloop when it is installed (it is, with
    uvicorn[standard]), else on asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main())  # type: ignore[arg-type]
    else:
        uvloop.run(main())  # type: ignore[arg-type]


def run_on_starlette(handler: Handler, port: int) -> None:
    """The same handler as one Starlette route on uvicorn (httptools, uvloop), to compare."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request as StarletteRequest
    from starlette.responses import Response
    from starlette.routing import Route

    async def endpoint(request: StarletteRequest) -> Response:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        headers = {k.lower(): v for k, v in request.headers.items()}
        answer = handler(Request(request.method, target, headers, await request.body()))
        return Response(
            answer.body,
            status_code=answer.status,
            media_type=answer.content_type,
            headers=dict(answer.headers),
        )

    app = Starlette(routes=[Route("/{rest:path}", endpoint, methods=["GET", "POST"])])
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        http="httptools",
        loop="uvloop",
        log_level="warning",
        access_log=False,
    )


class _Reply:
    """httptools callbacks for one response: its status and whether the peer keeps the line."""

    def __init__(self) -> None:
        self.done = False
        self.close = False
        self.keep = False
        self.body = bytearray()
        self.parser: httptools.HttpResponseParser | None = None

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"connection" and value.lower() == b"close":
            self.close = True

    def on_message_complete(self) -> None:
        # Asked here: once this callback returns the parser is reset for the next
        # message, and then it no longer knows whether the line may be kept.
        self.keep = self.parser is not None and self.parser.should_keep_alive()
        self.done = True


@dataclass
class _Line:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    idle_since: float


class Poster:
    """Requests to one origin over kept-alive connections, at most ``connections`` at once."""

    def __init__(self, host: str, port: int, connections: int, keepalive: float = 4.0) -> None:
        self.host, self.port = host, port
        self.gate = asyncio.Semaphore(connections)
        self.keepalive = keepalive  # below the 5 s idle timeout of uvicorn's servers
        self.idle: list[_Line] = []

    async def post(self, target: str, headers: dict[str, str], body: bytes) -> int:
        status, _ = await self.request("POST", target, headers, body)
        return status

    async def request(
        self, method: str, target: str, headers: dict[str, str], body: bytes = b""
    ) -> tuple[int, bytes]:
        """One request; its status and body."""
        lines = [f"{method} {target} HTTP/1.1", f"host: {self.host}:{self.port}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        lines.append(f"content-length: {len(body)}")
        request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
        async with self.gate:
            for attempt in range(3):
                line = await self._line()
                try:
                    status, keep, answer = await self._exchange(line, request)
                except (OSError, asyncio.IncompleteReadError, httptools.HttpParserError):
                    line.writer.close()
                    if attempt < 2:
                        continue  # a kept line the peer had closed, or a refused one: again
                    raise
                if keep:
                    line.idle_since = time.monotonic()
                    self.idle.append(line)
                else:
                    line.writer.close()
                return status, answer
        raise ConnectionError(f"no answer from {self.host}:{self.port}")

    async def _line(self) -> _Line:
        now = time.monotonic()
        while self.idle:
            line = self.idle.pop()
            if now - line.idle_since < self.keepalive and not line.reader.at_eof():
                return line
            line.writer.close()
        reader, writer = await asyncio.open_connection(self.host, self.port)
        return _Line(reader, writer, now)

    async def _exchange(self, line: _Line, request: bytes) -> tuple[int, bool, bytes]:
        line.writer.write(request)
        reply = _Reply()
        parser = reply.parser = httptools.HttpResponseParser(reply)
        while not reply.done:
            data = await line.reader.read(65536)
            if not data:
                raise asyncio.IncompleteReadError(b"", None)
            parser.feed_data(data)
        keep = reply.keep and not reply.close
        return parser.get_status_code(), keep, bytes(reply.body)

    def close(self) -> None:
        for line in self.idle:
            with contextlib.suppress(Exception):
                line.writer.close()
        self.idle.clear()
