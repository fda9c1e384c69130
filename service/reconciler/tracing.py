"""Each operation's story as OpenTelemetry spans, or no tracing work at all.

One trace per operation. The agent's request starts it (as a child of the agent's own
``traceparent`` when that is well formed; a malformed one is ignored), and its context is
stored with the operation (``traceparent``; the operation's ``trace_id`` is ``tr_`` and the
same W3C trace id). Every later span about the operation, on any replica and after any
restart, is made under that stored context, so they all join the one trace. A webhook
arrives on a request of its own: its span links to the operation's trace.

Off unless configured (``reconciler.telemetry`` chooses once at startup): ``NO_TRACING``
answers every call with the same do-nothing object, so the hot path pays one method call.

Attributes carry identifiers, states, counts and HTTP statuses only: never a token, a
secret, a request body or a result body (``Attr`` is the whole vocabulary).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from opentelemetry import context as context_api
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from reconciler.core.records import OperationRecord

TRACE_PREFIX = "tr_"
TRACEPARENT = "traceparent"


class SpanName(StrEnum):
    """What happened: every span the service makes is named from this list."""

    AGENT_CREATE = "agent request create"
    CREATE = "create"
    STATUS_READ = "status read"
    CANCEL = "cancel"
    COLLECT = "result collection"
    COMPLETION = "completion"
    HOOK = "completion hook"
    CALLBACK = "callback delivery"
    PROVIDER_CALL = "provider call"
    WEBHOOK = "webhook"
    ESCALATION = "escalation"
    DECISION = "operator decision"


class Attr(StrEnum):
    """The attribute keys spans carry (identifiers and facts, never content)."""

    OPERATION = "reconciler.operation_id"
    PROVIDER = "reconciler.provider"
    STATE = "reconciler.state"
    CREATED = "reconciler.created"
    DELAY_SOURCE = "reconciler.delay_source"  # what made this step due now
    NEXT_DELAY_SOURCE = "reconciler.next_delay_source"  # what set the wait after it
    DECISION = "reconciler.decision"
    STEP = "reconciler.step"
    ATTEMPT = "reconciler.attempt"
    OUTCOME = "reconciler.outcome"
    REASON = "reconciler.escalation_reason"
    WEBHOOK_EVENT = "reconciler.webhook_event_id"
    METHOD = "http.request.method"
    PATH = "url.path"
    HTTP_STATUS = "http.response.status_code"
    ERROR = "error.type"


@dataclass(frozen=True)
class StoredTrace:
    """What an operation keeps of its trace: our ``trace_id`` and the W3C ``traceparent``."""

    trace_id: str
    traceparent: str


_PROPAGATOR = TraceContextTextMapPropagator()
_NULL: AbstractContextManager[None] = nullcontext()


def format_traceparent(context: SpanContext) -> str:
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def w3c_trace_id(trace_id: str) -> int | None:
    """The W3C trace id our ``trace_id`` stands for: ``tr_`` and 32 hex digits (older ids
    had 24, read as the same number); None for anything else."""
    digits = trace_id.removeprefix(TRACE_PREFIX)
    if not digits or len(digits) > 32 or digits == trace_id:
        return None
    try:
        value = int(digits, 16)
    except ValueError:
        return None
    return value or None


def _derived_span_id(op_id: str) -> int:
    # An operation stored without a context (made while tracing was off) still gets one
    # trace: its spans hang under a parent id derived from the operation id.
    return int.from_bytes(hashlib.sha256(op_id.encode()).digest()[:8], "big") or 1


def operation_context(op: OperationRecord) -> SpanContext | None:
    """The span context every span about ``op`` descends from."""
    return stored_context(op.id, op.trace_id, op.traceparent)


def stored_context(op_id: str, trace_id: str, traceparent: str | None) -> SpanContext | None:
    """``operation_context`` from the three columns it reads."""
    if traceparent:
        parent = trace.get_current_span(_PROPAGATOR.extract({TRACEPARENT: traceparent}))
        found = parent.get_span_context()
        if found.is_valid:
            return found
    w3c = w3c_trace_id(trace_id)
    if w3c is None:
        return None
    return SpanContext(
        w3c, _derived_span_id(op_id), is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED)
    )


class Tracing:
    """Spans about operations, made by one tracer (the SDK's, when telemetry is on)."""

    enabled = True

    def __init__(self, tracer: trace.Tracer) -> None:
        self._tracer = tracer

    def request(
        self, name: SpanName, headers: Mapping[str, str], **attrs: Any
    ) -> AbstractContextManager[Any]:
        """A server span for an incoming request: a child of its ``traceparent`` when that is
        well formed, else the root of a new trace (a malformed one is ignored, never an
        error)."""
        value = headers.get(TRACEPARENT)
        parent = _PROPAGATOR.extract({TRACEPARENT: value}) if value else Context()
        return self._span(name, context=parent, kind=SpanKind.SERVER, attributes=_clean(attrs))

    def about(
        self, op: OperationRecord, name: SpanName, **attrs: Any
    ) -> AbstractContextManager[Any]:
        """A span in ``op``'s trace: under the current span when that is in the same trace,
        else under the stored context (then linked to the current span, a request's)."""
        current = trace.get_current_span().get_span_context()
        stored = operation_context(op)
        attributes = {Attr.OPERATION.value: op.id, Attr.PROVIDER.value: op.provider}
        attributes.update(_clean(attrs))
        if stored is None or (current.is_valid and current.trace_id == stored.trace_id):
            return self._span(name, attributes=attributes)
        links = [Link(current)] if current.is_valid else []
        parent = trace.set_span_in_context(trace.NonRecordingSpan(stored), Context())
        return self._span(name, context=parent, links=links, attributes=attributes)

    def mark(self, op: OperationRecord, name: SpanName, **attrs: Any) -> None:
        """A moment in ``op``'s trace (an escalation raised, a decision made): an instant span."""
        with self.about(op, name, **attrs):
            pass

    def call(self, name: SpanName, **attrs: Any) -> AbstractContextManager[Any]:
        """A client span under the current one, for a request this service sends."""
        return self._span(name, kind=SpanKind.CLIENT, attributes=_clean(attrs))

    @contextlib.contextmanager
    def _span(self, name: SpanName, **options: Any) -> Iterator[trace.Span]:
        # An exception's message may quote what it refused (a body's value): the span is
        # told its type only, never the message or a traceback.
        with self._tracer.start_as_current_span(
            name, record_exception=False, set_status_on_exception=False, **options
        ) as span:
            try:
                yield span
            except BaseException as exc:
                span.set_attribute(Attr.ERROR.value, type(exc).__name__)
                span.set_status(Status(StatusCode.ERROR))
                raise

    def detach(self) -> None:
        """Start this task's spans afresh: a worker task started while a request's span was
        current (a wake-up from a webhook) must not hang its steps under that request."""
        context_api.attach(Context())

    def note(self, **attrs: Any) -> None:
        """Attributes on the current span (what a step decided, once it knows)."""
        span = trace.get_current_span()
        if span.is_recording():
            span.set_attributes(_clean(attrs))

    def failed(self, kind: str) -> None:
        span = trace.get_current_span()
        if span.is_recording():
            span.set_attribute(Attr.ERROR.value, kind)
            span.set_status(Status(StatusCode.ERROR))

    def link(self, context: SpanContext | None) -> None:
        """Link the current span to an operation's trace (a webhook, an idempotent retry):
        ``operation_context`` or ``stored_context`` of it."""
        span = trace.get_current_span()
        if context is not None and context.is_valid and span.is_recording():
            span.add_link(context)

    def inject(self, headers: MutableMapping[str, str]) -> None:
        """``traceparent`` (and ``tracestate``) of the current span, for a request we send."""
        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            headers[TRACEPARENT] = format_traceparent(context)
            if context.trace_state:
                headers["tracestate"] = context.trace_state.to_header()

    def current(self) -> StoredTrace | None:
        """What a new operation stores of the current span (the agent's request)."""
        context = trace.get_current_span().get_span_context()
        if not context.is_valid:
            return None
        return StoredTrace(f"{TRACE_PREFIX}{context.trace_id:032x}", format_traceparent(context))


class NoTracing(Tracing):
    """Telemetry off: every call answers at once with the same do-nothing object."""

    enabled = False

    def __init__(self) -> None:
        pass

    def request(
        self, name: SpanName, headers: Mapping[str, str], **attrs: Any
    ) -> AbstractContextManager[Any]:
        return _NULL

    def about(
        self, op: OperationRecord, name: SpanName, **attrs: Any
    ) -> AbstractContextManager[Any]:
        return _NULL

    def mark(self, op: OperationRecord, name: SpanName, **attrs: Any) -> None:
        return None

    def call(self, name: SpanName, **attrs: Any) -> AbstractContextManager[Any]:
        return _NULL

    def detach(self) -> None:
        return None

    def note(self, **attrs: Any) -> None:
        return None

    def failed(self, kind: str) -> None:
        return None

    def link(self, context: SpanContext | None) -> None:
        return None

    def inject(self, headers: MutableMapping[str, str]) -> None:
        return None

    def current(self) -> StoredTrace | None:
        return None


NO_TRACING = NoTracing()


def _clean(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword names to attribute keys (``delay_source`` -> ``reconciler.delay_source``),
    ``None`` values left out (OpenTelemetry refuses them)."""
    out: dict[str, Any] = {}
    for key, value in attrs.items():
        if value is None:
            continue
        out[_KEYS[key]] = value.value if isinstance(value, StrEnum) else value
    return out


_KEYS: dict[str, str] = {member.name.lower(): member.value for member in Attr}
