"""One delivery attempt of a signed agent callback.

The client never raises for network trouble: every attempt ends in a
``DeliveryOutcome`` that says whether the event arrived, whether trying again
can help, and why not. The caller keeps the attempt count, stores the outcome
and escalates ``callback_undeliverable`` when its budget is spent (when the next
attempt is, or that there is none, ``core.completion_retry`` decides).

Decisions:

* The host is resolved and checked by ``ssrf`` at every attempt, and the
  request goes to the checked IP itself (the URL is rewritten to the address;
  ``Host`` keeps the original name and, for https, so do SNI and certificate
  verification). Proxies from the environment are ignored: a proxy would pick
  its own destination.
* Plain-http connections are kept alive for ``KEEPALIVE_SECONDS`` and reused by
  deliveries to the same checked address and port (each request carries its own
  ``Host``); opening one cost ~6 % of the service's CPU under load. https
  connections are not kept: aiohttp pools by address, not by the SNI name a
  pinned delivery sends, so a kept one could carry a TLS session verified for one
  host name to another name's delivery on the same address.
* Redirects are not followed; a 3xx is a permanent failure (the receiver is
  misconfigured, and following it would leave the checked address).
* An SSRF refusal is permanent; a failed DNS lookup is retryable.
* ``timeout_seconds`` bounds each phase (connect, write, read, pool) and the
  whole attempt, resolution and a slowly dripping response included. Once the
  status line has arrived, it decides the outcome even if the body is cut off.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import httpx

from reconciler.core.canonical import canonical_json
from reconciler.core.clock import Clock
from reconciler.core.errors import InvalidRequest, ResolutionFailed
from reconciler.core.rate_limit import retry_after_value
from reconciler.core.signatures import sign_standard_webhook
from reconciler.core.strict_json import visible
from reconciler.core.vocabulary import RETRYABLE_4XX, TransportError
from reconciler.outbound import ssrf
from reconciler.outbound.address_classes import IPAddress
from reconciler.providers.aiohttp_transport import AiohttpTransport
from reconciler.providers.client import OutboundClient
from reconciler.providers.transport import classify_transport_error
from reconciler.tracing import NO_TRACING, Tracing

EVENT_OPERATION_COMPLETED = "operation.completed"
USER_AGENT = "reconciler-callbacks/1"
MAX_WEBHOOK_ID = 256
EXCERPT_CHARS = 160

_TRANSPORT_TEXT = {
    TransportError.TIMEOUT: "the receiver did not answer in time",
    TransportError.CONNECTION_REFUSED: "the connection was refused",
    TransportError.CONNECTION_RESET: "the connection was reset or closed early",
    TransportError.DNS: "the host name could not be resolved",
    TransportError.TLS: "the TLS handshake or certificate check failed",
    TransportError.PROTOCOL: "the receiver did not speak valid HTTP",
    TransportError.OTHER: "a network error occurred",
}


@dataclass(frozen=True)
class DeliveryOutcome:
    """What one attempt achieved. ``permanent`` means another attempt cannot help."""

    delivered: bool
    permanent: bool = False
    http_status: int | None = None
    retry_after: str | None = None  # the raw header, for ``next_attempt_delay``
    refused: str | None = None  # the SSRF guard's reason; nothing was connected
    error: str | None = None
    transport_error: TransportError | None = None
    address: str | None = None  # the checked IP the request went to
    response_bytes: int = 0  # how much of the response body was read (at most the cap)
    elapsed_ms: int = 0

    @property
    def retryable(self) -> bool:
        return not self.delivered and not self.permanent


def status_verdict(status: int) -> tuple[bool, bool]:
    """(delivered, permanent) for an HTTP status; a pure table."""
    if 200 <= status < 300:
        return True, False
    if 300 <= status < 400:
        return False, True
    if 400 <= status < 500:
        return False, status not in RETRYABLE_4XX
    return False, False


def _status_error(status: int, excerpt: str) -> str | None:
    if 200 <= status < 300:
        return None
    text = f"the receiver answered HTTP {status}"
    if 300 <= status < 400:
        text += "; redirects are not followed, configure the final URL"
    return f"{text}: {excerpt}" if excerpt else text


def _body(event: Mapping[str, Any]) -> bytes:
    """The event as UTF-8 JSON; stored text UTF-8 cannot encode (a lone surrogate a
    provider sent before such answers were refused) is sent as a visible escape."""
    try:
        return canonical_json(event).encode("utf-8")
    except UnicodeEncodeError:
        return canonical_json(visible(event)).encode("utf-8")


def _excerpt(body: bytes) -> str:
    text = body[: EXCERPT_CHARS * 4].decode("utf-8", errors="replace")
    text = "".join(ch if ch.isprintable() else " " for ch in text)
    text = " ".join(text.split())
    return text if len(text) <= EXCERPT_CHARS else text[: EXCERPT_CHARS - 3] + "..."


def _failure(kind: TransportError, address: str | None, detail: str = "") -> DeliveryOutcome:
    text = _TRANSPORT_TEXT[kind] + (f" ({detail})" if detail else "")
    return DeliveryOutcome(delivered=False, error=text, transport_error=kind, address=address)


def receiver_host(url: str, allow_hosts: Collection[str] | ssrf.AllowList) -> str:
    """The host a callback URL is delivered to, as the SSRF guard checks it (lower case,
    no brackets): the key of that receiver's share of delivery slots. A URL the guard
    refuses keys to "" (its delivery fails at once, without connecting)."""
    try:
        return ssrf.check_url(url, allow_hosts).host
    except InvalidRequest:
        return ""


def _check_webhook_id(webhook_id: str) -> None:
    ok = 0 < len(webhook_id) <= MAX_WEBHOOK_ID and all("!" <= ch <= "~" for ch in webhook_id)
    if not ok:
        raise InvalidRequest(
            f"webhook_id must be 1 to {MAX_WEBHOOK_ID} printable ASCII characters without spaces"
        )


# Idle kept connections close well before the usual servers' keep-alive timeouts (5 s
# for uvicorn and Node): a connection the receiver closes just as it is reused would
# fail that delivery.
KEEPALIVE_SECONDS = 2.0


class DeliveryTransport(httpx.AsyncBaseTransport):
    """Deliveries' connections: plain-http ones kept alive, https ones fresh each time
    (see the module)."""

    def __init__(self, verify: ssl.SSLContext | bool = True) -> None:
        self._kept = AiohttpTransport(
            limits=httpx.Limits(max_keepalive_connections=None, keepalive_expiry=KEEPALIVE_SECONDS),
            verify=verify,
        )
        self._fresh = AiohttpTransport(
            limits=httpx.Limits(max_keepalive_connections=0), verify=verify
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        plain = request.url.scheme == "http"
        return await (self._kept if plain else self._fresh).handle_async_request(request)

    async def aclose(self) -> None:
        await self._kept.aclose()
        await self._fresh.aclose()


def _pinned_url(checked: ssrf.CheckedUrl, address: IPAddress) -> httpx.URL:
    return httpx.URL(
        scheme=checked.scheme,
        host=str(address),
        port=checked.port,
        raw_path=checked.target.encode("ascii"),
    )


@dataclass
class _Progress:
    """What the attempt has learnt so far, kept when the deadline cuts it short."""

    answer: DeliveryOutcome | None = None


class CallbackClient:
    """Delivers signed callback events; one instance per process is enough."""

    def __init__(
        self,
        *,
        signing_key: bytes,
        allow_hosts: Collection[str],
        clock: Clock,
        timeout_seconds: float = 10.0,
        max_response_bytes: int = 65_536,
        resolver: ssrf.Resolver = ssrf.system_resolver,
        transport: httpx.AsyncBaseTransport | None = None,
        verify: ssl.SSLContext | bool = True,
        tracing: Tracing = NO_TRACING,
    ) -> None:
        if timeout_seconds <= 0 or max_response_bytes < 0:
            raise InvalidRequest("timeout_seconds must be > 0 and max_response_bytes >= 0")
        self._key = signing_key
        self._allow = ssrf.AllowList.parse(allow_hosts)
        self._clock = clock
        self._timeout = timeout_seconds
        self._max_bytes = max_response_bytes
        self._resolver = resolver
        self._tracing = tracing
        if transport is None:
            transport = DeliveryTransport(verify)
        self._client = OutboundClient(transport=transport, timeout=httpx.Timeout(timeout_seconds))

    def __repr__(self) -> str:
        return f"CallbackClient(timeout_seconds={self._timeout}, allow_hosts=...)"

    async def __aenter__(self) -> CallbackClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._client.aclose()

    async def deliver(
        self,
        url: str,
        webhook_id: str,
        event: Mapping[str, Any],
        signing_keys: Sequence[bytes] | None = None,
    ) -> DeliveryOutcome:
        """One attempt: check, resolve, sign, POST to the checked address, classify.

        ``signing_keys`` are the receiving agent's own keys (its current one first; in a
        rotation window the previous one too); without them the client's key signs.
        """
        _check_webhook_id(webhook_id)
        keys = tuple(signing_keys) if signing_keys else (self._key,)
        body = _body(event)
        started = self._clock.monotonic()
        progress = _Progress()
        try:
            async with asyncio.timeout(self._timeout):
                outcome = await self._attempt(url, webhook_id, body, progress, keys)
        except TimeoutError:
            # Once the status line has arrived, the receiver has answered; a body
            # still dripping at the deadline does not change that answer.
            outcome = progress.answer or _failure(
                TransportError.TIMEOUT, None, f"attempt deadline of {self._timeout:g} s"
            )
        elapsed = max(0.0, self._clock.monotonic() - started)
        return replace(outcome, elapsed_ms=round(elapsed * 1000))

    async def _attempt(
        self,
        url: str,
        webhook_id: str,
        body: bytes,
        progress: _Progress,
        keys: tuple[bytes, ...],
    ) -> DeliveryOutcome:
        try:
            checked = ssrf.check_url(url, self._allow)
            addresses = await ssrf.resolve_checked(checked, self._allow, self._resolver)
        except ResolutionFailed as exc:
            return replace(_failure(TransportError.DNS, None), error=exc.message)
        except InvalidRequest as exc:
            return DeliveryOutcome(delivered=False, permanent=True, refused=exc.message)
        timestamp = int(self._clock.now().timestamp())
        headers = {
            "Host": checked.host_header,
            "Content-Type": "application/json",
            "Accept-Encoding": "identity",
            "User-Agent": USER_AGENT,
            **sign_standard_webhook(keys[0], webhook_id, timestamp, body, *keys[1:]),
        }
        # The agent's receiver continues the operation's trace from the delivery's span.
        self._tracing.inject(headers)
        extensions: dict[str, Any] = {}
        if checked.scheme == "https" and checked.address is None:
            extensions["sni_hostname"] = checked.host.rstrip(".")
        outcome: DeliveryOutcome | None = None
        for address in addresses:
            request = self._client.build_request(
                "POST",
                _pinned_url(checked, address),
                headers=headers,
                content=body,
                extensions=extensions,
            )
            outcome, connected = await self._send(request, str(address), progress)
            if connected:
                break
        assert outcome is not None  # resolve_checked never returns an empty list
        return outcome

    async def _send(
        self, request: httpx.Request, address: str, progress: _Progress
    ) -> tuple[DeliveryOutcome, bool]:
        """The outcome, and whether a connection was made (else the next address may be tried)."""
        try:
            response = await self._client.send(request, stream=True, follow_redirects=False)
        except httpx.ConnectError as exc:
            return _failure(classify_transport_error(exc)[0], address), False
        except (httpx.HTTPError, OSError) as exc:
            return _failure(classify_transport_error(exc)[0], address), True
        status = response.status_code
        delivered, permanent = status_verdict(status)
        progress.answer = DeliveryOutcome(
            delivered=delivered,
            permanent=permanent,
            http_status=status,
            retry_after=retry_after_value(response.headers, self._clock.now()),
            error=_status_error(status, ""),
            address=address,
        )
        try:
            kept, size = await self._read_capped(response)
        except (httpx.HTTPError, OSError):
            return progress.answer, True  # the status is the answer; the body is a courtesy
        finally:
            await response.aclose()
        return replace(
            progress.answer, error=_status_error(status, _excerpt(kept)), response_bytes=size
        ), True

    async def _read_capped(self, response: httpx.Response) -> tuple[bytes, int]:
        """Read until the cap is reached, then stop; keep only a short prefix for the excerpt."""
        kept = bytearray()
        size = 0
        if self._max_bytes == 0:
            return b"", 0
        if response.is_stream_consumed:  # an in-memory answer, e.g. from a test transport
            body = response.content[: self._max_bytes]
            return body[: EXCERPT_CHARS * 4], len(body)
        async for chunk in response.aiter_raw():
            take = chunk[: self._max_bytes - size]
            size += len(take)
            if len(kept) < EXCERPT_CHARS * 4:
                kept += take[: EXCERPT_CHARS * 4 - len(kept)]
            if size >= self._max_bytes:
                break
        return bytes(kept), size
