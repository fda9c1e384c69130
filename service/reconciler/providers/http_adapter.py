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
import os
from collections.abc import Mapping
from typing import Any

import httpx

from reconciler.core.clock import Clock, SystemClock
from reconciler.core.errors import ConfigError
from reconciler.core.provider_calls import CallResult, answer_words, unstorable_in
from reconciler.core.strict_json import shown
from reconciler.providers.adapter import (
    PROTOCOL_METHODS,
    CreateOutcome,
    LookupOutcome,
    LookupVerdict,
    ProviderAdapter,
    StatusOutcome,
    Subject,
    create_outcome,
    lookup_outcome,
    next_page,
    status_outcome,
)
from reconciler.providers.call_request import CallRequest
from reconciler.providers.credentials import build_credential
from reconciler.providers.exchange import Exchange
from reconciler.providers.result_fetch import ResultFetcher, UrlGuard
from reconciler.providers.spec import (
    CallTable,
    IdempotencyMode,
    LookupSpec,
    ProviderSpec,
    ResultSpec,
)
from reconciler.providers.templates import alnum_key, compiled
from reconciler.tracing import NO_TRACING, Tracing

__all__ = ["HttpAdapter", "build_adapter"]


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
        clock = clock or SystemClock()
        env = os.environ if environ is None else environ
        self.credential = build_credential(spec.auth, spec.where, env, clock, transport)
        self._exchange = Exchange(spec, self.credential, transport, clock, tracing)
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

    def values(self, subject: Subject, **refs: str | None) -> dict[str, str | None]:
        """What the file's templates stand for in a call about ``subject``."""
        return {
            "idempotency_key": subject.idempotency_key,
            "idempotency_key_alnum": alnum_key(subject.idempotency_key),
            "operation_id": subject.operation_id,
            "trace_id": subject.trace_id,
            "webhook_url": self._spec.webhook_url,
            "job_id": subject.job_id,
            **refs,
        }

    async def send(
        self,
        built: CallRequest,
        trace_id: str,
        timeout: float,
        limit: int,
        *,
        extra: Mapping[str, str] | None = None,
        url: httpx.URL | None = None,
    ) -> CallResult:
        ex = self._exchange
        headers = extra
        if built.headers:
            headers = {**(extra or {}), **dict(built.headers)}
        call = await ex.call(
            built.method,
            url or ex.url(built.path),
            trace_id,
            timeout=timeout,
            limit=limit,
            extra=headers,
            content=built.content,
        )
        return self._not_json(call)

    async def create(self, request: Any, subject: Subject) -> CreateOutcome:
        create = self._spec.create
        built = self._exchange.build(create, create.path, self.values(subject), request=request)
        if isinstance(built, CallResult):
            return create_outcome(self._spec, built)
        extra = {}
        if create.idempotency is IdempotencyMode.HEADER and create.idempotency_header:
            extra[create.idempotency_header] = subject.idempotency_key
        call = await self.send(
            built,
            subject.trace_id,
            create.timeout_seconds,
            self._spec.http.max_response_bytes,
            extra=extra,
        )
        return create_outcome(self._spec, call)

    async def lookup(self, subject: Subject) -> LookupOutcome:
        """Ask whether the token made a job; a list answer is searched page by page (at most
        ``lookup.pages``) for the item that ``lookup.match`` names."""
        lookup, create, ex = self._spec.lookup, self._spec.create, self._exchange
        if lookup is None:
            refused = ex.refused("GET", "", "the provider file has no [lookup] table")
            return lookup_outcome(self._spec, refused)
        values = self.values(subject)
        built = self._exchange.build(lookup, lookup.path, values)
        if isinstance(built, CallResult):
            return lookup_outcome(self._spec, built)
        extra = {}
        # The token travels where the file puts it; with nowhere named, in the create header.
        if (
            not lookup.sends_key(lookup.path)
            and create.idempotency is IdempotencyMode.HEADER
            and create.idempotency_header
        ):
            extra[create.idempotency_header] = subject.idempotency_key
        wanted = tuple((p, compiled(text).fill(values)) for p, text in lookup.match)
        url = ex.url(built.path)
        cursors: set[str] = set()
        limit = self._spec.http.max_response_bytes
        for page in range(1, lookup.pages + 1):
            call = await self.send(
                built, subject.trace_id, lookup.timeout_seconds, limit, extra=extra, url=url
            )
            if page > 1 and not call.ok:
                # The first page's 404 says "no such job"; a later page's says nothing.
                return _unread(call, f"page {page} of the lookup answered {answer_words(call)}")
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
            if str(cursor) in cursors:
                return _unread(
                    call, f"the lookup's cursor {shown(str(cursor), 40)!r} came back on page {page}"
                )
            cursors.add(str(cursor))
            following = self._next_page(lookup, built, values, cursor)
            if isinstance(following, CallResult):
                return _unread(following, f"page {page + 1} of the lookup could not be built")
            built, url = following
        # Every page allowed was read and the list still goes on: the job may be further
        # down, so "not made" is not known, and concluding it would resend a made job.
        return _unread(call, f"no match in the {lookup.pages} lookup page(s) read")

    def _next_page(
        self,
        lookup: LookupSpec,
        built: CallRequest,
        values: Mapping[str, str | None],
        cursor: str | int,
    ) -> tuple[CallRequest, httpx.URL] | CallResult:
        """The next page's request: its cursor in the body or in the query."""
        if lookup.page_pointer is not None:
            nxt = self._exchange.build(
                lookup, lookup.path, values, page=(lookup.page_pointer, cursor)
            )
            return nxt if isinstance(nxt, CallResult) else (nxt, self._exchange.url(nxt.path))
        assert lookup.next_param is not None  # next_page gives a cursor only then
        url = self._exchange.url(built.path).copy_merge_params({lookup.next_param: str(cursor)})
        return built, url

    async def _job_call(
        self, table: CallTable, path: str, subject: Subject, timeout: float, limit: int
    ) -> CallResult:
        built = self._exchange.build(table, path, self.values(subject))
        if isinstance(built, CallResult):
            return built
        return await self.send(built, subject.trace_id, timeout, limit)

    async def status(self, subject: Subject) -> StatusOutcome:
        status = self._spec.status
        call = await self._job_call(
            status,
            status.path,
            subject,
            status.timeout_seconds,
            self._spec.http.max_response_bytes,
        )
        return status_outcome(self._spec, call, subject.job_id)

    async def cancel(self, subject: Subject) -> CallResult:
        cancel = self._spec.cancel
        if cancel is None:
            return self._exchange.refused("POST", "", "the provider file has no [cancel] table")
        return await self._job_call(
            cancel,
            cancel.path,
            subject,
            cancel.timeout_seconds,
            self._spec.http.max_response_bytes,
        )

    async def fetch_result(self, subject: Subject, result_ref: str | None) -> CallResult:
        result = self._spec.result or ResultSpec()
        if result.from_status is not None:
            status = self._spec.status
            return await self._job_call(
                status, status.path, subject, result.timeout_seconds, result.max_bytes
            )
        return await self._results.fetch(self.values(subject), subject.trace_id, result_ref)

    async def fetch_errors(self, subject: Subject, errors_ref: str) -> CallResult:
        """The separate errors file of a JSONL result (``errors_path`` with ``{errors_ref}``)."""
        return await self._results.fetch_errors(self.values(subject), subject.trace_id, errors_ref)


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
