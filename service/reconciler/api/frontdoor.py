"""The front door: limits the server enforces on every connection before the app sees a request.

Guarantee: a slow or oversized client holds nothing for long. uvicorn's
httptools protocol has no limit on header size or count and no deadline for
a request that is still arriving (``timeout_keep_alive`` covers only idle
kept-alive connections; ``limit_concurrency`` answers 503 only after the
headers are in, and ``h11_max_incomplete_event_size`` applies to the slower h11
protocol alone). This subclass adds, per ``[server]``:

* ``max_connections``: a connection over the cap is answered 503 and closed on
  accept, before anything is read;
* ``max_header_bytes`` and ``max_headers``: 431 and close, counting bytes as
  they arrive, so a 20 MB header costs at most the cap plus one read;
* ``header_timeout_seconds``: from the connection (or the request's first
  byte) to the end of its headers; 408 and close;
* ``body_timeout_seconds``: from the end of the headers to the end of the
  body; the connection is closed (the app sees a disconnect).

Every refusal is counted in ``reconciler_front_door_refusals_total{reason}``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from reconciler.config import ServerSettings


class Refusal(StrEnum):
    TOO_MANY_CONNECTIONS = "too_many_connections"
    HEADERS_TOO_LARGE = "headers_too_large"
    TOO_MANY_HEADERS = "too_many_headers"
    HEADER_TIMEOUT = "header_timeout"
    BODY_TIMEOUT = "body_timeout"


@dataclass(frozen=True)
class DoorLimits:
    max_connections: int
    max_header_bytes: int
    max_headers: int
    header_timeout_seconds: float
    body_timeout_seconds: float

    @classmethod
    def of(cls, server: ServerSettings) -> DoorLimits:
        return cls(
            max_connections=server.max_connections,
            max_header_bytes=server.max_header_bytes,
            max_headers=server.max_headers,
            header_timeout_seconds=server.header_timeout_seconds,
            body_timeout_seconds=server.body_timeout_seconds,
        )


_ANSWERS = {
    Refusal.TOO_MANY_CONNECTIONS: (503, b"Service Unavailable", b"too many connections"),
    Refusal.HEADERS_TOO_LARGE: (431, b"Request Header Fields Too Large", b"headers too large"),
    Refusal.TOO_MANY_HEADERS: (431, b"Request Header Fields Too Large", b"too many headers"),
    Refusal.HEADER_TIMEOUT: (408, b"Request Timeout", b"headers not received in time"),
}


def _answer(refusal: Refusal) -> bytes:
    status, phrase, text = _ANSWERS[refusal]
    retry = b"retry-after: 1\r\n" if status == 503 else b""
    return b"".join(
        [
            b"HTTP/1.1 %d %s\r\n" % (status, phrase),
            b"content-type: text/plain; charset=utf-8\r\n",
            b"content-length: %d\r\n" % len(text),
            retry,
            b"connection: close\r\n\r\n",
            text,
        ]
    )


@dataclass(frozen=True)
class _Counter:
    count: Callable[[Refusal], None]


class _Refuse(Exception):
    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.value)
        self.refusal = refusal


# Where a connection's current request is: its head (request line and headers) is
# arriving, its body is arriving, or neither (idle, or the app has it all).
_HEAD, _BODY, _OTHER = "head", "body", "other"


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the front door's limits; see ``protocol_class``."""

    limits: ClassVar[DoorLimits]
    counter: ClassVar[_Counter]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._refused = False
        self._phase = _OTHER
        self._head_bytes = 0
        self._header_count = 0
        self._timer: asyncio.TimerHandle | None = None

    # -- connection ------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.limits.max_connections:
            self._refused = True
            self.transport = transport
            self.counter.count(Refusal.TOO_MANY_CONNECTIONS)
            transport.write(_answer(Refusal.TOO_MANY_CONNECTIONS))
            transport.close()
            return
        super().connection_made(transport)
        self._start_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        if self._refused and self.flow is None:
            return  # never counted as a connection
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            if isinstance(exc.__context__, _Refuse):
                self._refuse(exc.__context__.refusal)
                return
            self._bad_request()
            return
        except httptools.HttpParserError:
            self._bad_request()
            return
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        if self._phase == _HEAD:
            # Bytes of a head still incomplete after this read: counted as they come,
            # so one enormous header is refused before it is held in memory.
            self._head_bytes += len(data)
            if self._head_bytes > self.limits.max_header_bytes:
                self._refuse(Refusal.HEADERS_TOO_LARGE)

    # -- parser callbacks ------------------------------------------------------
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = 0
        self._header_count = 0
        if self._phase != _HEAD:
            self._start_head()

    def on_url(self, url: bytes) -> None:
        self._grow(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._header_count > self.limits.max_headers:
            raise _Refuse(Refusal.TOO_MANY_HEADERS)
        self._grow(len(name) + len(value) + 4)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._cancel_timer()
        self._phase = _BODY
        self._timer = self.loop.call_later(self.limits.body_timeout_seconds, self._body_late)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._cancel_timer()
        self._phase = _OTHER
        super().on_message_complete()

    # -- helpers ---------------------------------------------------------------
    def _grow(self, n: int) -> None:
        self._head_bytes += n
        if self._head_bytes > self.limits.max_header_bytes:
            raise _Refuse(Refusal.HEADERS_TOO_LARGE)

    def _start_head(self) -> None:
        self._cancel_timer()
        self._phase = _HEAD
        self._timer = self.loop.call_later(self.limits.header_timeout_seconds, self._head_late)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _head_late(self) -> None:
        self._timer = None
        if self._phase == _HEAD and not self.transport.is_closing():
            if self.cycle is not None and not self.cycle.response_complete:
                return  # the app is still answering the previous request
            self._refuse(Refusal.HEADER_TIMEOUT)

    def _body_late(self) -> None:
        self._timer = None
        if self._phase == _BODY and not self.transport.is_closing():
            self.counter.count(Refusal.BODY_TIMEOUT)
            self._phase = _OTHER
            self.transport.close()

    def _refuse(self, refusal: Refusal) -> None:
        self._cancel_timer()
        self._phase = _OTHER
        self.counter.count(refusal)
        if not self.transport.is_closing():
            if self.cycle is None or self.cycle.response_complete:
                self.transport.write(_answer(refusal))
            self.transport.close()

    def _bad_request(self) -> None:
        self._cancel_timer()
        self._phase = _OTHER
        msg = "Invalid HTTP request received."
        self.logger.warning(msg)
        self.send_400_response(msg)


def protocol_class(limits: DoorLimits, count: Callable[[Refusal], None]) -> type[HttpToolsProtocol]:
    """A protocol class for ``uvicorn.Config(http=...)`` enforcing ``limits``."""
    return type(
        "FrontDoorProtocol",
        (GuardedProtocol,),
        {"limits": limits, "counter": _Counter(count)},
    )
