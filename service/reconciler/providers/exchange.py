"""One request to a provider and its answer as a ``CallResult``: the adapter's only way out.

Credentials come from the adapter and live only in a ``Secret`` and in the outgoing
header; they are not in reprs, results or error strings. The credential and the file's
static headers go to the provider's own origin (its ``base_url``) only. Bodies are read
streamed and decoded within a limit (``providers.decoding``): an API answer into memory
and parsed as JSON; a result into a ``Spool`` (memory, then an unnamed file) and not
parsed here, because ``providers.result_scan`` reads it off the event loop. The whole
exchange (connect, send, read) is bounded by the section's ``timeout_seconds``, so a
provider that trickles bytes cannot hold a worker. Every answer's ``Retry-After``,
``retry-after-ms`` and ``polling.rate_limit_reset`` header are folded into one
``Retry-After`` (``core.rate_limit``).

A request to another host (a result a provider keeps elsewhere) goes to an address the
URL guard checked (``Pinned``): the connection is made to that address, the host name
kept for ``Host`` and TLS, and never kept alive for a later request.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import io
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import anyio.to_thread
import httpx

from reconciler.core.clock import Clock
from reconciler.core.errors import CredentialUnavailable, InvalidRequest, UnsafePathValue
from reconciler.core.provider_calls import CallResult
from reconciler.core.rate_limit import is_rate_limited, retry_after_value
from reconciler.core.strict_json import parse_json
from reconciler.core.vocabulary import TransportError
from reconciler.providers.aiohttp_transport import AiohttpTransport
from reconciler.providers.call_request import CONTENT_TYPE, CallRequest, build_request
from reconciler.providers.client import OutboundClient
from reconciler.providers.credentials import Credential
from reconciler.providers.decoding import (
    ACCEPT_ENCODING,
    declared_length,
    encoding_problem,
    read_bounded,
)
from reconciler.providers.pointer import Pointer
from reconciler.providers.spec import CallTable, ProviderSpec
from reconciler.providers.spool import Spool
from reconciler.providers.templates import Values
from reconciler.providers.transport import classify_transport_error
from reconciler.tracing import SpanName, Tracing

USER_AGENT = "reconciler/0.1"
# A larger JSON answer (a status that carries its result, up to [result] max_bytes) is
# parsed in a worker thread: a parse of megabytes would hold the event loop.
PARSE_IN_LOOP_BYTES = 262_144
MAX_DETAIL_CHARS = 200
MAX_REQUEST_ID_CHARS = 200  # operations.last_provider_request_id
REQUEST_ID_HEADERS = (
    "x-request-id",
    "request-id",
    "x-amzn-requestid",
    "x-amz-request-id",
    "x-ms-request-id",
    "x-goog-request-id",
    "x-correlation-id",
    "cf-ray",
)


def _detail(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return text[:MAX_DETAIL_CHARS]


def is_json(content_type: str | None) -> bool:
    media = (content_type or "").split(";", 1)[0].strip().lower()
    # AWS's JSON protocol answers application/x-amz-json-1.0 and -1.1.
    return media.endswith(("/json", "+json")) or media.startswith("application/x-amz-json-")


def _request_id(headers: httpx.Headers, configured: str | None) -> str | None:
    names = ((configured,) if configured else ()) + REQUEST_ID_HEADERS
    for name in names:
        value = str(headers.get(name) or "")
        if value and value.isprintable():
            return value[:MAX_REQUEST_ID_CHARS]
    return None


def origin(url: httpx.URL) -> tuple[str, str, int | None]:
    default = {"http": 80, "https": 443}.get(url.scheme)
    return (url.scheme, url.host, url.port or default)


def path_of(target: str) -> str:
    """A call's target for a span: never its query (a signature, a token may ride there)."""
    return target.split("?", 1)[0]


@dataclass(frozen=True)
class Pinned:
    """Where a request to a checked foreign URL really goes: one address the guard passed."""

    url: httpx.URL  # the URL with the address for its host
    host_header: str
    sni_hostname: str | None


@dataclass
class _Read:
    data: bytes | None = None
    file: Any = None
    too_large: bool = False
    undecodable: str | None = None  # why the body was not read (``encoding_problem``)


class Exchange:
    """The pooled clients, the credential and the rules every provider call follows."""

    def __init__(
        self,
        spec: ProviderSpec,
        credential: Credential | None,
        transport: httpx.AsyncBaseTransport | None,
        clock: Clock,
        tracing: Tracing,
    ) -> None:
        self._spec = spec
        # Whether the file's static headers name a Content-Type: a body then gets no other.
        self._typed = any(name.lower() == CONTENT_TYPE for name, _ in spec.headers)
        self._credential = credential
        # A credential that is one fixed header goes on with the other headers; any other is
        # put on each request last (a signature covers the request as it is sent).
        self._fixed = credential.static_header() if credential is not None else None
        self._per_request = credential if credential is not None and self._fixed is None else None
        self._clock = clock
        self._tracing = tracing
        self.base = httpx.URL(spec.base_url)
        http = spec.http
        limits = httpx.Limits(
            max_connections=http.max_connections,
            max_keepalive_connections=http.max_keepalive_connections,
            keepalive_expiry=http.keepalive_expiry_seconds,
        )
        self._client = OutboundClient(
            transport=transport or AiohttpTransport(limits=limits),
            headers={"User-Agent": USER_AGENT},
        )
        # Foreign hosts: a fresh connection each time, so a TLS session verified for one
        # host name never carries a request pinned to the same address for another.
        once = httpx.Limits(max_connections=http.max_connections, max_keepalive_connections=0)
        self._foreign = OutboundClient(
            transport=transport or AiohttpTransport(limits=once),
            headers={"User-Agent": USER_AGENT},
        )

    async def aclose(self) -> None:
        await self._client.aclose()
        await self._foreign.aclose()
        if self._credential is not None:
            await self._credential.aclose()

    def own(self, url: httpx.URL) -> bool:
        return origin(url) == origin(self.base)

    def headers(self, trace_id: str, url: httpx.URL, accept: str) -> httpx.Headers:
        # The file's static headers first: the trace header (and the credential, put on
        # last in ``_send``) replace a header of the same name (compared
        # case-insensitively), never the other way round. They go to the provider's origin
        # only, as the credential does.
        own = self.own(url)
        headers = httpx.Headers(list(self._spec.headers) if own else [])
        headers["Accept"] = accept
        headers["Accept-Encoding"] = ACCEPT_ENCODING
        headers[self._spec.trace_header] = trace_id
        fixed = self._fixed
        if fixed is not None and own:
            headers[fixed[0]] = fixed[1]
        return headers

    def url(self, path: str) -> httpx.URL:
        return httpx.URL(self._spec.base_url + path)

    def target(self, url: httpx.URL) -> str:
        """What a result records as the request target: the path on the provider's origin; for
        another origin the URL without its query, which on a pre-signed URL is a credential."""
        if self.own(url):
            return url.raw_path.decode("ascii")
        return str(url.copy_with(query=None, fragment=None, userinfo=b""))

    def refused(self, method: str, target: str, reason: str) -> CallResult:
        return CallResult(
            method, target, self._clock.now(), 0.0, refused=reason, maybe_delivered=False
        )

    def build(
        self,
        table: CallTable,
        path: str,
        values: Values,
        *,
        request: Any = None,
        page: tuple[Pointer, Any] | None = None,
    ) -> CallRequest | CallResult:
        """The request ``table`` describes (``build_request`` with the file's own headers and
        job-id rule), or the refusal to send it: nothing went out."""
        try:
            return build_request(
                table,
                path,
                values,
                request=request,
                typed=self._typed,
                keep_slashes=self._spec.job_id_slashes,
                page=page,
            )
        except UnsafePathValue as exc:
            return self.refused(table.method, path, exc.message)
        except (TypeError, ValueError):
            return self.refused(table.method, path, "the request body is not JSON")

    def unsent(self, method: str, target: str, kind: TransportError, detail: str) -> CallResult:
        """A call that failed before a request could go out (its host did not resolve)."""
        return CallResult(
            method,
            target,
            self._clock.now(),
            0.0,
            transport_error=kind,
            transport_detail=detail[:MAX_DETAIL_CHARS],
            maybe_delivered=False,
        )

    async def call(
        self,
        method: str,
        url: httpx.URL,
        trace_id: str,
        *,
        timeout: float,
        limit: int,
        json_expected: bool = True,
        extra: Mapping[str, str] | None = None,
        content: bytes | None = None,
        spool: bool = False,
        pinned: Pinned | None = None,
    ) -> CallResult:
        """One request; ``spool`` reads the body into a ``Spool`` (a result), unparsed."""
        target = self.target(url)
        with self._tracing.call(SpanName.PROVIDER_CALL, method=method, path=path_of(target)):
            headers = self.headers(trace_id, url, "application/json" if json_expected else "*/*")
            for name, value in (extra or {}).items():
                headers[name] = value
            # W3C trace context beside the provider's own trace header: the client span's.
            self._tracing.inject(headers)
            send = functools.partial(
                self._send, method, url, target, headers, timeout, limit, content, spool
            )
            result = await send(pinned)
            if self._renews(result, pinned):
                # The answer refused the credential: a fresh one, and this call once more.
                result = await self._renewed(result, lambda: send(None))
            if result.http_status is not None:
                self._tracing.note(http_status=result.http_status)
            elif result.transport_error is not None:
                self._tracing.failed(result.transport_error.value)
            return result

    async def _send(
        self,
        method: str,
        url: httpx.URL,
        target: str,
        headers: httpx.Headers,
        timeout: float,
        limit: int,
        content: bytes | None,
        spool: bool,
        pinned: Pinned | None,
    ) -> CallResult:
        client, extensions = self._client, {}
        if pinned is not None:
            client, url = self._foreign, pinned.url
            headers["Host"] = pinned.host_header
            if pinned.sni_hostname is not None:
                extensions["sni_hostname"] = pinned.sni_hostname
        try:
            request = client.build_request(
                method,
                url,
                headers=headers,
                content=content,
                timeout=timeout,
                extensions=extensions,
            )
            if self._per_request is not None and pinned is None and self.own(url):
                # Last, so that a signature covers the request as it is sent.
                await self._per_request.apply(request)
        except CredentialUnavailable as exc:
            return self._no_credential(method, target, exc)
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            return self._unanswered(method, target, self._clock.now(), self._clock.monotonic(), exc)
        sent_at, start = self._clock.now(), self._clock.monotonic()
        try:
            async with asyncio.timeout(timeout):
                response = await client.send(request, stream=True)
                try:
                    read = await _read(response, limit, spool)
                finally:
                    await response.aclose()
        except (httpx.HTTPError, httpx.InvalidURL, OSError, TimeoutError) as exc:
            return self._unanswered(method, target, sent_at, start, exc)
        elapsed = (self._clock.monotonic() - start) * 1000.0
        return await self._answered(method, target, sent_at, elapsed, response, read, not spool)

    async def _renewed(
        self, result: CallResult, resend: Callable[[], Awaitable[CallResult]]
    ) -> CallResult:
        """The answer refused the credential: a fresh one, and this call once more; or the
        answer as it was, saying why no fresh credential could be had."""
        assert self._credential is not None
        try:
            fresh = await self._credential.renew()
        except CredentialUnavailable as exc:
            return dataclasses.replace(result, credential_problem=exc.message)
        if not fresh:
            return result
        _discard(result)
        again = await resend()
        return dataclasses.replace(again, credential_renewed=True)

    def _renews(self, result: CallResult, pinned: Pinned | None) -> bool:
        return (
            self._credential is not None
            and pinned is None
            and result.http_status is not None
            and self._credential.renews_on(result.http_status, result.body_bytes)
        )

    def _no_credential(self, method: str, target: str, exc: CredentialUnavailable) -> CallResult:
        """A call not sent for want of its credential: refused by its source (the operation
        asks a person), or not obtainable now (undelivered: a later try may work)."""
        if exc.refused:
            return CallResult(
                method,
                target,
                self._clock.now(),
                0.0,
                refused=f"no credential: {exc.message}",
                maybe_delivered=False,
                credential_refused=True,
            )
        return self.unsent(method, target, TransportError.CREDENTIAL, exc.message)

    def _unanswered(
        self, method: str, target: str, sent_at: datetime, start: float, exc: BaseException
    ) -> CallResult:
        kind, delivered = classify_transport_error(exc)
        return CallResult(
            method,
            target,
            sent_at,
            (self._clock.monotonic() - start) * 1000.0,
            transport_error=kind,
            transport_detail=_detail(exc),
            maybe_delivered=delivered,
        )

    async def _answered(
        self,
        method: str,
        target: str,
        sent_at: datetime,
        elapsed: float,
        response: httpx.Response,
        read: _Read,
        parse: bool,
    ) -> CallResult:
        content_type = response.headers.get("content-type")
        body, parse_error = None, read.undecodable
        data = read.data
        if parse and data and (content_type is None or is_json(content_type)):
            try:
                if len(data) > PARSE_IN_LOOP_BYTES:
                    body = await anyio.to_thread.run_sync(parse_json, data, "the response body")
                else:
                    body = parse_json(data, "the response body")
            except InvalidRequest as exc:
                parse_error = exc.message
        return CallResult(
            method,
            target,
            sent_at,
            elapsed,
            http_status=response.status_code,
            retry_after=retry_after_value(
                response.headers, self._clock.now(), self._spec.polling.rate_limit_reset
            ),
            rate_limited=is_rate_limited(response.status_code, response.headers),
            location=response.headers.get("location"),
            content_type=content_type,
            content_length=declared_length(response.headers),
            provider_request_id=_request_id(response.headers, self._spec.http.request_id_header),
            body=body,
            body_bytes=data,
            body_file=read.file,
            parse_error=parse_error,
            too_large=read.too_large,
        )


def _discard(result: CallResult) -> None:
    if result.body_file is not None:
        result.body_file.close()


async def _read(response: httpx.Response, limit: int, spool: bool) -> _Read:
    """The body within ``limit`` (decoded): in memory, or spooled; nothing once too large."""
    problem = encoding_problem(response.headers.get("content-encoding"))
    if problem is not None:
        return _Read(undecodable=problem)
    if not spool:
        buffer = io.BytesIO()
        _, too_large = await read_bounded(response, limit, buffer)
        return _Read(too_large=True) if too_large else _Read(buffer.getvalue())
    sink = Spool()
    try:
        _, too_large = await read_bounded(response, limit, sink)
    except BaseException:
        sink.discard()
        raise
    if too_large:
        sink.discard()
        return _Read(too_large=True)
    data, file = sink.finish()
    return _Read(data, file)
