"""An OTLP/HTTP trace receiver on 127.0.0.1: what a collector would get, decoded.

``POST /v1/traces`` takes an ``ExportTraceServiceRequest`` (protobuf, the real
``opentelemetry-proto`` classes) and keeps every span as a plain value.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.support.servers import serve_asgi


@dataclass(frozen=True)
class ReceivedSpan:
    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    kind: int
    attributes: dict[str, Any]
    links: tuple[tuple[str, str], ...]  # (trace id, span id) of each link
    event_attributes: tuple[dict[str, Any], ...]
    service: str


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind is not None else None


def _attributes(items: Any) -> dict[str, Any]:
    return {item.key: _value(item.value) for item in items}


class OtlpReceiver:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: list[ReceivedSpan] = []
        self.requests = 0
        self.app = Starlette(routes=[Route("/v1/traces", self._export, methods=["POST"])])

    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)

    async def _export(self, request: Request) -> Response:
        body = await request.body()
        if request.headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        message = ExportTraceServiceRequest()
        message.ParseFromString(body)
        found = []
        for resource in message.resource_spans:
            service = _attributes(resource.resource.attributes).get("service.name", "")
            for scope in resource.scope_spans:
                for span in scope.spans:
                    found.append(
                        ReceivedSpan(
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex() or None,
                            name=span.name,
                            kind=span.kind,
                            attributes=_attributes(span.attributes),
                            links=tuple((ln.trace_id.hex(), ln.span_id.hex()) for ln in span.links),
                            event_attributes=tuple(_attributes(e.attributes) for e in span.events),
                            service=service,
                        )
                    )
        with self._lock:
            self._spans.extend(found)
            self.requests += 1
        return Response(
            ExportTraceServiceResponse().SerializeToString(),
            media_type="application/x-protobuf",
        )


@contextmanager
def serve_otlp() -> Iterator[tuple[OtlpReceiver, str]]:
    """A receiver on 127.0.0.1; yields it and its base URL (the exporter adds /v1/traces)."""
    receiver = OtlpReceiver()
    with serve_asgi(receiver.app, lifespan="off") as url:
        yield receiver, url
