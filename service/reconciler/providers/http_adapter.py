"""The declarative adapter: a provider file turned into HTTP calls on one pooled httpx client.

Credentials come from the injected environment when the adapter is built and
live only in a ``Secret`` and in the outgoing header; they are not in reprs,
results or error strings. Bodies are read streamed up to a cap, and the whole
exchange (connect, send, read) is bounded by the section's ``timeout_seconds``,
so a provider that trickles bytes cannot hold a worker.

Result fetching: ``[result].from_status`` re-reads the status; ``[result].path``
is rendered with ``{job_id}``/``{result_ref}``; otherwise ``result_ref`` itself is
fetched when it is an http(s) URL (or a path on the provider's origin). The
credential is sent only to the provider's own origin: a pre-signed URL on a
storage host gets no ``Authorization``, and redirects are followed by hand (at
most ``MAX_REDIRECTS``) with the same rule, because httpx drops only the
``Authorization`` header on a cross-origin redirect, not an API-key header.
The file's static ``headers`` follow the same rule and never replace the credential
or the trace header. A ``[lookup]`` over a list is searched page by page, following
its cursor, at most ``lookup.pages`` requests, counted as one lookup. Every answer's
``Retry-After``, ``retry-after-ms`` and ``polling.rate_limit_reset`` header are folded
into one ``Retry-After`` (``core.rate_limit``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import inspect
import json
import os
from collections.abc import Mapping
from datetime import datetime
from typing import Any
from urllib.parse import quote

import httpx

from reconciler.config import Secret
from reconciler.core.clock import Clock, SystemClock
from reconciler.core.errors import ConfigError, InvalidRequest, UnsafePathValue
from reconciler.core.provider_calls import CallResult, unstorable_in
from reconciler.core.rate_limit import is_rate_limited, retry_after_value
from reconciler.core.strict_json import parse_json
from reconciler.providers.adapter import (
    PROTOCOL_METHODS,
    CreateOutcome,
    LookupOutcome,
    LookupVerdict,
    ProviderAdapter,
    StatusOutcome,
    create_outcome,
    lookup_outcome,
    next_cursor,
    status_outcome,
)
from reconciler.providers.aiohttp_transport import AiohttpTransport
from reconciler.providers.client import OutboundClient
from reconciler.providers.create_set import fill
from reconciler.providers.spec import (
    ERRORS_REF,
    IDEMPOTENCY_KEY,
    JOB_ID,
    RESULT_REF,
    AuthType,
    IdempotencyMode,
    ProviderSpec,
    ResultSpec,
    auth_secret,
    template_fields,
)
from reconciler.providers.transport import classify_transport_error
from reconciler.tracing import NO_TRACING, SpanName, Tracing

USER_AGENT = "reconciler/0.1"
MAX_REDIRECTS = 5
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
_REDIRECTS = frozenset({301, 302, 303, 307, 308})


def _segment(value: str, what: str) -> str:
    if value in ("", ".", ".."):
        raise UnsafePathValue(f"the {what} is empty or a '.'/'..' path segment")
    return quote(value, safe="")


def encode_path_value(value: str, what: str, *, keep_slashes: bool = False) -> str:
    """Percent-encode ``value`` for a path; ``keep_slashes`` keeps ``/`` between segments."""
    if not keep_slashes:
        return _segment(value, what)
    return "/".join(_segment(part, what) for part in value.split("/"))


def render_path(
    template: str,
    *,
    job_id: str | None = None,
    idempotency_key: str | None = None,
    result_ref: str | None = None,
    errors_ref: str | None = None,
    keep_slashes: bool = False,
) -> str:
    """Fill a validated path template; raises ``UnsafePathValue`` for a missing or unsafe value."""
    given = {
        JOB_ID: job_id,
        IDEMPOTENCY_KEY: idempotency_key,
        RESULT_REF: result_ref,
        ERRORS_REF: errors_ref,
    }
    values: dict[str, str] = {}
    for name in template_fields(template):
        value = given.get(name)
        if value is None:
            raise UnsafePathValue(f"the path needs {{{name}}} and none was given")
        values[name] = encode_path_value(value, name, keep_slashes=keep_slashes and name == JOB_ID)
    return template.format(**values)


def _detail(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return text[:MAX_DETAIL_CHARS]


def _is_json(content_type: str | None) -> bool:
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return media.endswith("/json") or media.endswith("+json")


def _int_header(value: str | None) -> int | None:
    if value is None or not (value.strip().isascii() and value.strip().isdigit()):
        return None
    if len(value.strip()) > 18:
        return None
    return int(value.strip())


def _request_id(headers: httpx.Headers, configured: str | None) -> str | None:
    names = ((configured,) if configured else ()) + REQUEST_ID_HEADERS
    for name in names:
        value = str(headers.get(name) or "")
        if value and value.isprintable():
            return value[:MAX_REQUEST_ID_CHARS]
    return None


def _origin(url: httpx.URL) -> tuple[str, str, int | None]:
    default = {"http": 80, "https": 443}.get(url.scheme)
    return (url.scheme, url.host, url.port or default)


async def _read_capped(response: httpx.Response, limit: int) -> tuple[bytes | None, bool]:
    """The body, or (None, True) once it is larger than ``limit``; stops reading there."""
    declared = _int_header(response.headers.get("content-length"))
    if declared is not None and declared > limit:
        return None, True
    buffer = bytearray()
    async for chunk in response.aiter_bytes():
        if len(buffer) + len(chunk) > limit:
            return None, True
        buffer.extend(chunk)
    return bytes(buffer), False


class HttpAdapter:
    """``ProviderAdapter`` for a provider file, over one pooled ``httpx.AsyncClient``."""

    def __init__(
        self,
        spec: ProviderSpec,
        environ: Mapping[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        *,
        clock: Clock | None = None,
        tracing: Tracing = NO_TRACING,
    ) -> None:
        self._spec = spec
        self._clock = clock or SystemClock()
        self._tracing = tracing
        secret = auth_secret(spec, os.environ if environ is None else environ)
        self._credential: tuple[str, Secret] | None = None
        if secret is not None and spec.auth.type is AuthType.BEARER:
            self._credential = ("Authorization", Secret("Bearer " + secret.reveal()))
        elif secret is not None and spec.auth.header_name:
            self._credential = (spec.auth.header_name, secret)
        self._base = httpx.URL(spec.base_url)
        limits = httpx.Limits(
            max_connections=spec.http.max_connections,
            max_keepalive_connections=spec.http.max_keepalive_connections,
            keepalive_expiry=spec.http.keepalive_expiry_seconds,
        )
        self._client = OutboundClient(
            transport=transport or AiohttpTransport(limits=limits),
            headers={"User-Agent": USER_AGENT},
        )

    def __repr__(self) -> str:
        return f"HttpAdapter(provider={self._spec.name!r}, base_url={self._spec.base_url!r})"

    @property
    def spec(self) -> ProviderSpec:
        return self._spec

    async def aclose(self) -> None:
        await self._client.aclose()

    def _headers(self, trace_id: str, url: httpx.URL, accept: str) -> httpx.Headers:
        # The file's static headers first: the trace header and the credential replace a
        # header of the same name (compared case-insensitively), never the other way round.
        # They go to the provider's origin only, as the credential does.
        own = _origin(url) == _origin(self._base)
        headers = httpx.Headers(list(self._spec.headers) if own else [])
        headers["Accept"] = accept
        headers[self._spec.trace_header] = trace_id
        if self._credential is not None and own:
            headers[self._credential[0]] = self._credential[1].reveal()
        return headers

    def _url(self, path: str) -> httpx.URL:
        return httpx.URL(self._spec.base_url + path)

    def _target(self, url: httpx.URL) -> str:
        """What a result records as the request target: the path on the provider's origin; for
        another origin the URL without its query, which on a pre-signed URL is a credential."""
        if _origin(url) == _origin(self._base):
            return url.raw_path.decode("ascii")
        return str(url.copy_with(query=None, fragment=None, userinfo=b""))

    def _refused(self, method: str, target: str, reason: str) -> CallResult:
        return CallResult(
            method, target, self._clock.now(), 0.0, refused=reason, maybe_delivered=False
        )

    async def _call(
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
    ) -> CallResult:
        target = self._target(url)
        with self._tracing.call(SpanName.PROVIDER_CALL, method=method, path=_path_of(target)):
            result = await self._send(
                method, url, target, trace_id, timeout, limit, json_expected, extra, content
            )
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
        trace_id: str,
        timeout: float,
        limit: int,
        json_expected: bool,
        extra: Mapping[str, str] | None,
        content: bytes | None,
    ) -> CallResult:
        headers = self._headers(trace_id, url, "application/json" if json_expected else "*/*")
        for name, value in (extra or {}).items():
            headers[name] = value
        # W3C trace context beside the provider's own trace header: the client span's.
        self._tracing.inject(headers)
        sent_at, start = self._clock.now(), self._clock.monotonic()
        try:
            async with asyncio.timeout(timeout):
                request = self._client.build_request(
                    method, url, headers=headers, content=content, timeout=timeout
                )
                response = await self._client.send(request, stream=True)
                try:
                    data, too_large = await _read_capped(response, limit)
                finally:
                    await response.aclose()
        except (httpx.HTTPError, httpx.InvalidURL, OSError, TimeoutError) as exc:
            kind, delivered = classify_transport_error(exc)
            elapsed = (self._clock.monotonic() - start) * 1000.0
            return CallResult(
                method,
                target,
                sent_at,
                elapsed,
                transport_error=kind,
                transport_detail=_detail(exc),
                maybe_delivered=delivered,
            )
        elapsed = (self._clock.monotonic() - start) * 1000.0
        return self._answered(method, target, sent_at, elapsed, response, data, too_large)

    def _answered(
        self,
        method: str,
        target: str,
        sent_at: datetime,
        elapsed: float,
        response: httpx.Response,
        data: bytes | None,
        too_large: bool,
    ) -> CallResult:
        content_type = response.headers.get("content-type")
        body, parse_error = None, None
        if data and not too_large and (content_type is None or _is_json(content_type)):
            try:
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
            content_length=_int_header(response.headers.get("content-length")),
            provider_request_id=_request_id(response.headers, self._spec.http.request_id_header),
            body=body,
            body_bytes=data,
            parse_error=parse_error,
            too_large=too_large,
        )

    def _not_json(self, call: CallResult) -> CallResult:
        """A JSON endpoint that answered with another content type: say so in parse_error."""
        if call.body is None and call.parse_error is None and call.body_bytes:
            note = f"the response is not JSON (content type {call.content_type!r})"
            return dataclasses.replace(call, parse_error=note)
        return call

    async def create(
        self, request_body: Any, idempotency_token: str, trace_id: str
    ) -> CreateOutcome:
        create = self._spec.create
        try:
            path = render_path(create.path, idempotency_key=idempotency_token)
        except UnsafePathValue as exc:
            return create_outcome(
                self._spec, self._refused(create.method, create.path, exc.message)
            )
        extra = {"Content-Type": "application/json"}
        if create.idempotency is IdempotencyMode.HEADER and create.idempotency_header:
            extra[create.idempotency_header] = idempotency_token
        content = None
        if request_body is not None:
            try:
                content = json.dumps(request_body, separators=(",", ":"), allow_nan=False).encode()
            except (TypeError, ValueError):
                refused = self._refused(create.method, path, "the request body is not JSON")
                return create_outcome(self._spec, refused)
        call = await self._call(
            create.method,
            self._url(path),
            trace_id,
            timeout=create.timeout_seconds,
            limit=self._spec.http.max_response_bytes,
            extra=extra,
            content=content,
        )
        return create_outcome(self._spec, self._not_json(call))

    async def lookup(
        self, idempotency_token: str, trace_id: str, *, operation_id: str | None = None
    ) -> LookupOutcome:
        """Ask whether the token made a job; a list answer is searched page by page (at most
        ``lookup.pages``) for the item that ``lookup.match`` names."""
        lookup, create = self._spec.lookup, self._spec.create
        if lookup is None:
            refused = self._refused("GET", "", "the provider file has no [lookup] table")
            return lookup_outcome(self._spec, refused)
        try:
            path = render_path(lookup.path, idempotency_key=idempotency_token)
        except UnsafePathValue as exc:
            return lookup_outcome(
                self._spec, self._refused(lookup.method, lookup.path, exc.message)
            )
        extra = {}
        # The token travels in the path when the template has it, else in the create header.
        if (
            IDEMPOTENCY_KEY not in template_fields(lookup.path)
            and create.idempotency is IdempotencyMode.HEADER
            and create.idempotency_header
        ):
            extra[create.idempotency_header] = idempotency_token
        values = {
            "idempotency_key": idempotency_token,
            "operation_id": operation_id,
            "trace_id": trace_id,
            "webhook_url": self._spec.webhook_url,
        }
        wanted = tuple((pointer, fill(text, values)) for pointer, text in lookup.match)
        url = self._url(path)
        for _ in range(lookup.pages):
            call = self._not_json(
                await self._call(
                    lookup.method,
                    url,
                    trace_id,
                    timeout=lookup.timeout_seconds,
                    limit=self._spec.http.max_response_bytes,
                    extra=extra,
                )
            )
            outcome = lookup_outcome(self._spec, call, wanted)
            if outcome.verdict is not LookupVerdict.NOT_FOUND or not call.ok:
                return outcome
            if unstorable_in(call) is not None:
                return outcome  # the step refuses the answer (``StepContext.call``): no more pages
            cursor = next_cursor(lookup, call.body)
            if cursor is None or lookup.next_param is None:
                return outcome
            url = self._url(path).copy_merge_params({lookup.next_param: cursor})
        # Every page allowed was read and the list still goes on: the job may be further
        # down, so "not made" is not known, and concluding it would resend a made job.
        return LookupOutcome(
            outcome.call,
            LookupVerdict.UNKNOWN,
            job_id_problem=f"no match in the {lookup.pages} lookup page(s) read, "
            "and the list has more",
        )

    async def _job_call(
        self, method: str, template: str, job_id: str, trace_id: str, timeout: float, limit: int
    ) -> CallResult:
        try:
            path = render_path(template, job_id=job_id, keep_slashes=self._spec.job_id_slashes)
        except UnsafePathValue as exc:
            return self._refused(method, template, exc.message)
        call = await self._call(method, self._url(path), trace_id, timeout=timeout, limit=limit)
        return self._not_json(call)

    async def status(self, job_id: str, trace_id: str) -> StatusOutcome:
        status = self._spec.status
        call = await self._job_call(
            status.method,
            status.path,
            job_id,
            trace_id,
            status.timeout_seconds,
            self._spec.http.max_response_bytes,
        )
        return status_outcome(self._spec, call, job_id)

    async def cancel(self, job_id: str, trace_id: str) -> CallResult:
        cancel = self._spec.cancel
        if cancel is None:
            return self._refused("POST", "", "the provider file has no [cancel] table")
        return await self._job_call(
            cancel.method,
            cancel.path,
            job_id,
            trace_id,
            cancel.timeout_seconds,
            self._spec.http.max_response_bytes,
        )

    async def fetch_result(self, job_id: str, result_ref: str | None, trace_id: str) -> CallResult:
        result = self._spec.result or ResultSpec()
        status = self._spec.status
        if result.from_status is not None:
            return await self._job_call(
                status.method,
                status.path,
                job_id,
                trace_id,
                result.timeout_seconds,
                result.max_bytes,
            )
        if result.path is not None:
            try:
                path = render_path(
                    result.path,
                    job_id=job_id,
                    result_ref=result_ref,
                    keep_slashes=self._spec.job_id_slashes,
                )
            except UnsafePathValue as exc:
                return self._refused(result.method, result.path, exc.message)
            return await self._follow(result, self._url(path), trace_id)
        url = self._result_url(result_ref)
        if url is None:
            reason = "result_ref is not an http(s) URL or path and [result] has no path"
            return self._refused(result.method, "", reason)
        return await self._follow(result, url, trace_id)

    async def fetch_errors(self, job_id: str, errors_ref: str, trace_id: str) -> CallResult:
        """The separate errors file of a JSONL result (``errors_path`` with ``{errors_ref}``)."""
        result = self._spec.result or ResultSpec()
        if result.errors_path is None:
            return self._refused(result.method, "", "the provider file has no result.errors_path")
        try:
            path = render_path(
                result.errors_path,
                job_id=job_id,
                errors_ref=errors_ref,
                keep_slashes=self._spec.job_id_slashes,
            )
        except UnsafePathValue as exc:
            return self._refused(result.method, result.errors_path, exc.message)
        return await self._follow(result, self._url(path), trace_id)

    def _result_url(self, result_ref: str | None) -> httpx.URL | None:
        if not result_ref or not (result_ref.startswith("/") or "://" in result_ref):
            return None
        try:
            url = self._base.join(result_ref)
        except httpx.InvalidURL:
            return None
        return url if url.scheme in ("http", "https") and url.host else None

    async def _follow(self, result: ResultSpec, url: httpx.URL, trace_id: str) -> CallResult:
        method = result.method
        for _ in range(MAX_REDIRECTS + 1):
            if url.userinfo:
                # A password in a URL the provider handed us is no credential of ours to send
                # (and the client would refuse to combine it with a header of its own).
                return self._refused(method, self._target(url), "the URL carries user info")
            call = await self._call(
                method,
                url,
                trace_id,
                timeout=result.timeout_seconds,
                limit=result.max_bytes,
                json_expected=False,
            )
            if call.http_status not in _REDIRECTS or not call.location:
                return call
            try:
                url = url.join(call.location)
            except httpx.InvalidURL:
                return call
            if url.scheme not in ("http", "https"):
                return self._refused(method, self._target(url), "redirected to a non-http(s) URL")
            method = "GET" if call.http_status == 303 else method
        return self._refused(method, self._target(url), f"more than {MAX_REDIRECTS} redirects")


def _path_of(target: str) -> str:
    """A call's target for a span: never its query (a signature, a token may ride there)."""
    return target.split("?", 1)[0]


def build_adapter(
    spec: ProviderSpec,
    environ: Mapping[str, str] | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    *,
    clock: Clock | None = None,
    tracing: Tracing = NO_TRACING,
) -> ProviderAdapter:
    """The provider's adapter: ``HttpAdapter``, or ``adapter = "pkg.module:Class"`` built as
    ``Class(spec, environ)``. An import or protocol problem is a ``ConfigError``."""
    env = os.environ if environ is None else environ
    if spec.adapter is None:
        return HttpAdapter(spec, env, transport, clock=clock, tracing=tracing)
    cls = _import_class(spec)
    try:
        adapter = cls(spec, env)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(
            f"{spec.where('adapter')}: {spec.adapter}(spec, environ) failed: {type(exc).__name__}"
        ) from None
    if not isinstance(adapter, ProviderAdapter):
        raise ConfigError(f"{spec.where('adapter')}: the built object is not a provider adapter")
    return adapter


def _import_class(spec: ProviderSpec) -> type[Any]:
    ref = spec.adapter or ""
    module_name, _, attribute = ref.partition(":")
    where = spec.where("adapter")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{where}: cannot import {module_name}: {exc}") from None
    except Exception as exc:
        raise ConfigError(
            f"{where}: importing {module_name} failed: {type(exc).__name__}"
        ) from None
    cls = getattr(module, attribute, None)
    if not isinstance(cls, type):
        raise ConfigError(f"{where}: {module_name} has no class {attribute}")
    missing = [
        name
        for name in PROTOCOL_METHODS
        if not inspect.iscoroutinefunction(getattr(cls, name, None))
    ]
    if missing:
        raise ConfigError(
            f"{where}: {ref} does not implement the adapter protocol "
            f"(missing async methods: {', '.join(missing)})"
        )
    return cls
