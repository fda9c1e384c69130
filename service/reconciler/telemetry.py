"""Telemetry chosen once at startup: the OTLP/HTTP exporter when configured, else nothing.

``[telemetry] otlp_endpoint`` wins over the standard ``OTEL_EXPORTER_OTLP_ENDPOINT`` (both
name the receiver's base; spans go to its ``/v1/traces``); the standard
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is used as it is. ``OTEL_SDK_DISABLED=true`` keeps
it off. The SDK and the exporter are the ``reconciler[otel]`` extra, imported only here
and only when tracing is on: without them a configured endpoint is a start-up error.

The tracer provider is the service's own (never the process-global one), so an
embedding application's tracing and ours do not replace each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from reconciler.config import Settings
from reconciler.core.errors import ConfigError
from reconciler.tracing import NO_TRACING, Tracing

ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"
TRACES_ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
DISABLED_ENV = "OTEL_SDK_DISABLED"
TRACES_PATH = "/v1/traces"


@dataclass
class Telemetry:
    """The tracing the service uses, and what must be flushed when it stops."""

    tracing: Tracing
    provider: Any = None  # the SDK's TracerProvider when tracing is on

    def shutdown(self) -> None:
        """Send what is still queued, then stop the exporter (the last spans are not lost)."""
        if self.provider is not None:
            self.provider.shutdown()
            self.provider = None


OFF = Telemetry(NO_TRACING)


def traces_endpoint(settings: Settings, environ: Mapping[str, str]) -> str | None:
    """Where spans go, or None when tracing is off."""
    if environ.get(DISABLED_ENV, "").strip().lower() == "true":
        return None
    if settings.telemetry.otlp_endpoint:
        return settings.telemetry.otlp_endpoint.rstrip("/") + TRACES_PATH
    traces = environ.get(TRACES_ENDPOINT_ENV, "").strip()
    if traces:
        return traces
    base = environ.get(ENDPOINT_ENV, "").strip()
    return base.rstrip("/") + TRACES_PATH if base else None


def build(settings: Settings, environ: Mapping[str, str]) -> Telemetry:
    endpoint = traces_endpoint(settings, environ)
    if endpoint is None:
        return OFF
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        raise ConfigError(
            f"{settings.source}: tracing is configured ({endpoint}) but the OpenTelemetry SDK "
            "is not installed; install reconciler[otel], or unset telemetry.otlp_endpoint "
            f"and {ENDPOINT_ENV}"
        ) from None
    provider = TracerProvider(
        resource=Resource.create({"service.name": settings.telemetry.service_name})
    )
    # The queue's bounds follow the standard OTEL_BSP_* variables; a full queue drops
    # spans rather than slow the service down.
    interval = settings.telemetry.export_interval_seconds * 1000.0
    processor = BatchSpanProcessor(
        OTLPSpanExporter(endpoint=endpoint), schedule_delay_millis=interval
    )
    provider.add_span_processor(processor)
    return Telemetry(Tracing(provider.get_tracer("reconciler")), provider)
