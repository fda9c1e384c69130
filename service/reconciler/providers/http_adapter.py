"""The declarative adapter: a provider file turned into HTTP calls on one pooled httpx client.

Each call goes out through ``providers.exchange`` (credentials to the provider's origin
only, bodies read within a limit after decoding, the section's timeout over the whole
exchange); result files through ``providers.result_fetch`` (where a provider may send
the service for one, redirects followed by hand). ``[result].from_status`` re-reads the
status instead.

A ``[lookup]`` over a list is searched page by page, following its cursor, at most
``lookup.pages`` requests, counted as one lookup. Only the end of the list says the job
was not made: a lookup that cannot read the list to its end (its pages run out, a
cursor comes back, the list says it has more but gives no cursor, a later page is not
a readable 2xx) knows nothing, and says so (``LookupVerdict.UNKNOWN``):
docs/design.md#create_unknown.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import os
from collections.abc import Mapping
from typing import Any

import httpx

from reconciler.config import Secret
from reconciler.core.clock import Clock, SystemClock
from reconciler.core.errors import ConfigError, UnsafePathValue
from reconciler.core.provider_calls import CallResult, unstorable_in
from reconciler.core.strict_json import shown
from reconciler.providers.adapter import (
    PROTOCOL_METHODS,
    CreateOutcome,
    LookupOutcome,
    LookupVerdict,
    ProviderAdapter,
    StatusOutcome,
    create_outcome,
    lookup_outcome,
    next_page,
    status_outcome,
)
from reconciler.providers.create_set import fill
from reconciler.providers.exchange import Exchange
from reconciler.providers.paths import render_path
from reconciler.providers.result_fetch import ResultFetcher, UrlGuard
from reconciler.providers.spec import (
    IDEMPOTENCY_KEY,
    AuthType,
    IdempotencyMode,
    ProviderSpec,
    ResultSpec,
    auth_secret,
    template_fields,
)
from reconciler.tracing import NO_TRACING, Tracing

__all__ = ["HttpAdapter", "build_adapter", "render_path"]


class HttpAdapter:
    """``ProviderAdapter`` for a provider file, over one pooled ``httpx.AsyncClient``.

    ``guard`` checks a result URL on another host (``providers.result_fetch``); without
    one, results are fetched from the provider's own origin only.
    """

    def __init__(
        self,
        spec: ProviderSpec,
        environ: Mapping[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        *,
        clock: Clock | None = None,
        tracing: Tracing = NO_TRACING,
        guard: UrlGuard | None = None,
    ) -> None:
        self._spec = spec
        secret = auth_secret(spec, os.environ if environ is None else environ)
        credential: tuple[str, Secret] | None = None
        if secret is not None and spec.auth.type is AuthType.BEARER:
            credential = ("Authorization", Secret("Bearer " + secret.reveal()))
        elif secret is not None and spec.auth.header_name:
            credential = (spec.auth.header_name, secret)
        self._exchange = Exchange(spec, credential, transport, clock or SystemClock(), tracing)
        self._results = ResultFetcher(spec, self._exchange, guard)

    def __repr__(self) -> str:
        return f"HttpAdapter(provider={self._spec.name!r}, base_url={self._spec.base_url!r})"

    @property
    def spec(self) -> ProviderSpec:
        return self._spec

    async def aclose(self) -> None:
        await self._exchange.aclose()

    def _not_json(self, call: CallResult) -> CallResult:
        """A JSON endpoint that answered with another content type: say so in parse_error."""
        if call.body is None and call.parse_error is None and call.body_bytes:
            note = f"the response is not JSON (content type {call.content_type!r})"
            return dataclasses.replace(call, parse_error=note)
        return call

    async def create(
        self, request_body: Any, idempotency_token: str, trace_id: str
    ) -> CreateOutcome:
        create, ex = self._spec.create, self._exchange
        try:
            path = render_path(create.path, idempotency_key=idempotency_token)
        except UnsafePathValue as exc:
            return create_outcome(self._spec, ex.refused(create.method, create.path, exc.message))
        extra = {"Content-Type": "application/json"}
        if create.idempotency is IdempotencyMode.HEADER and create.idempotency_header:
            extra[create.idempotency_header] = idempotency_token
        content = None
        if request_body is not None:
            try:
                content = json.dumps(request_body, separators=(",", ":"), allow_nan=False).encode()
            except (TypeError, ValueError):
                refused = ex.refused(create.method, path, "the request body is not JSON")
                return create_outcome(self._spec, refused)
        call = await ex.call(
            create.method,
            ex.url(path),
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
        lookup, create, ex = self._spec.lookup, self._spec.create, self._exchange
        if lookup is None:
            refused = ex.refused("GET", "", "the provider file has no [lookup] table")
            return lookup_outcome(self._spec, refused)
        try:
            path = render_path(lookup.path, idempotency_key=idempotency_token)
        except UnsafePathValue as exc:
            return lookup_outcome(self._spec, ex.refused(lookup.method, lookup.path, exc.message))
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
        url = ex.url(path)
        cursors: set[str] = set()
        for page in range(1, lookup.pages + 1):
            call = self._not_json(
                await ex.call(
                    lookup.method,
                    url,
                    trace_id,
                    timeout=lookup.timeout_seconds,
                    limit=self._spec.http.max_response_bytes,
                    extra=extra,
                )
            )
            if page > 1 and not call.ok:
                # The first page's 404 says "no such job"; a later page's says nothing.
                return _unread(call, f"page {page} of the lookup answered {_answer(call)}")
            outcome = lookup_outcome(self._spec, call, wanted)
            if outcome.verdict is not LookupVerdict.NOT_FOUND or not call.ok:
                return outcome
            if unstorable_in(call) is not None:
                return outcome  # the step refuses the answer (``StepContext.call``): no more pages
            cursor, problem = next_page(lookup, call.body)
            if problem is not None:
                return _unread(call, problem)
            if cursor is None:
                return outcome  # the end of the list: the job is not in it
            if cursor in cursors:
                return _unread(
                    call, f"the lookup's cursor {shown(cursor, 40)!r} came back on page {page}"
                )
            cursors.add(cursor)
            assert lookup.next_param is not None  # next_page gives a cursor only then
            url = ex.url(path).copy_merge_params({lookup.next_param: cursor})
        # Every page allowed was read and the list still goes on: the job may be further
        # down, so "not made" is not known, and concluding it would resend a made job.
        return _unread(call, f"no match in the {lookup.pages} lookup page(s) read")

    async def _job_call(
        self, method: str, template: str, job_id: str, trace_id: str, timeout: float, limit: int
    ) -> CallResult:
        ex = self._exchange
        try:
            path = render_path(template, job_id=job_id, keep_slashes=self._spec.job_id_slashes)
        except UnsafePathValue as exc:
            return ex.refused(method, template, exc.message)
        call = await ex.call(method, ex.url(path), trace_id, timeout=timeout, limit=limit)
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
            return self._exchange.refused("POST", "", "the provider file has no [cancel] table")
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
        if result.from_status is not None:
            status = self._spec.status
            return await self._job_call(
                status.method,
                status.path,
                job_id,
                trace_id,
                result.timeout_seconds,
                result.max_bytes,
            )
        return await self._results.fetch(job_id, result_ref, trace_id)

    async def fetch_errors(self, job_id: str, errors_ref: str, trace_id: str) -> CallResult:
        """The separate errors file of a JSONL result (``errors_path`` with ``{errors_ref}``)."""
        return await self._results.fetch_errors(job_id, errors_ref, trace_id)


def _answer(call: CallResult) -> str:
    if call.http_status is not None:
        return f"HTTP {call.http_status}"
    if call.transport_error is not None:
        return f"no answer ({call.transport_error.value})"
    return f"nothing: {call.refused}"


def _unread(call: CallResult, why: str) -> LookupOutcome:
    """A lookup that could not read the list to its end: whether the job exists is unknown."""
    return LookupOutcome(
        call, LookupVerdict.UNKNOWN, job_id_problem=f"{why}; the list was not read to its end"
    )


def build_adapter(
    spec: ProviderSpec,
    environ: Mapping[str, str] | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    *,
    clock: Clock | None = None,
    tracing: Tracing = NO_TRACING,
    guard: UrlGuard | None = None,
) -> ProviderAdapter:
    """The provider's adapter: ``HttpAdapter``, or ``adapter = "pkg.module:Class"`` built as
    ``Class(spec, environ)``. An import or protocol problem is a ``ConfigError``."""
    env = os.environ if environ is None else environ
    if spec.adapter is None:
        return HttpAdapter(spec, env, transport, clock=clock, tracing=tracing, guard=guard)
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
