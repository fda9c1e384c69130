"""Naming the network failure behind an exception: one classifier for every outbound call.

Provider calls and agent callbacks both use it, so "peer closed" means the same
thing in a status read's history and in a callback attempt's record.
"""

from __future__ import annotations

import errno
import socket
import ssl
from collections.abc import Iterator

import httpx

from reconciler.core.vocabulary import TransportError

_RESET_ERRNOS = frozenset({errno.ECONNRESET, errno.EPIPE, errno.ECONNABORTED})


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """The exception, its causes and contexts, and group members; bounded."""
    seen: set[int] = set()
    stack: list[BaseException | None] = [exc]
    while stack and len(seen) < 64:
        current = stack.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        stack.extend((current.__cause__, current.__context__))
        if isinstance(current, BaseExceptionGroup):
            stack.extend(current.exceptions)


def _has(exc: BaseException, kinds: tuple[type[BaseException], ...], codes: frozenset[int]) -> bool:
    return any(
        isinstance(e, kinds) or (isinstance(e, OSError) and e.errno in codes) for e in _chain(exc)
    )


def classify_transport_error(exc: BaseException) -> tuple[TransportError, bool]:
    """(kind, maybe_delivered) for an exception raised while calling a provider.

    What httpx gives (its own transport, and aiohttp's as ``providers.aiohttp_transport``
    maps it, the OS error kept in the chain): a refused port is ``ConnectError`` wrapping
    ``ConnectionRefusedError`` (inside an ``OSError("All connection attempts failed")``);
    an unresolvable host is ``ConnectError`` from ``socket.gaierror``; a peer that closes
    mid-response is ``RemoteProtocolError`` ("peer closed connection ..."/"Server
    disconnected ..."), a TCP reset ``ReadError`` from ``ConnectionResetError``. Both of
    the last two count as ``connection_reset``; a malformed response is ``protocol``.
    """
    if isinstance(exc, httpx.TimeoutException | TimeoutError):
        certain = isinstance(exc, httpx.ConnectTimeout | httpx.PoolTimeout)
        return TransportError.TIMEOUT, not certain
    if isinstance(exc, httpx.UnsupportedProtocol | httpx.InvalidURL):
        return TransportError.OTHER, False
    if _has(exc, (ssl.SSLError, ssl.CertificateError), frozenset()):
        return TransportError.TLS, False
    if _has(exc, (socket.gaierror,), frozenset()):
        return TransportError.DNS, False
    if _has(exc, (ConnectionRefusedError,), frozenset({errno.ECONNREFUSED})):
        return TransportError.CONNECTION_REFUSED, False
    if isinstance(exc, httpx.ConnectError):
        return TransportError.OTHER, False
    if _has(exc, (ConnectionResetError, BrokenPipeError, ConnectionAbortedError), _RESET_ERRNOS):
        return TransportError.CONNECTION_RESET, True
    if isinstance(exc, httpx.RemoteProtocolError):
        text = str(exc).lower()
        if "closed" in text or "disconnected" in text:
            return TransportError.CONNECTION_RESET, True
        return TransportError.PROTOCOL, True
    if isinstance(exc, httpx.ProtocolError):
        return TransportError.PROTOCOL, True
    return TransportError.OTHER, True
