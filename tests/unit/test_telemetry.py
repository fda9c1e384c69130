"""Telemetry is chosen once at start: where spans go, when it is off, and what a bad
setting says; the client's trace context; the trace id's W3C form."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider

from reconciler.client.tracecontext import trace_headers
from reconciler.config import Settings, TelemetrySettings, load_settings
from reconciler.core import ids
from reconciler.core.errors import ConfigError
from reconciler.telemetry import OFF, build, traces_endpoint
from reconciler.tracing import NO_TRACING, w3c_trace_id
from tests.support.imports import modules_after, top_level


def settings(endpoint: str = "") -> Settings:
    return Settings(telemetry=TelemetrySettings(otlp_endpoint=endpoint))


@pytest.mark.parametrize(
    ("endpoint", "environ", "expected"),
    [
        ("", {}, None),
        ("http://collector:4318/", {}, "http://collector:4318/v1/traces"),
        ("", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, "http://c:4318/v1/traces"),
        ("", {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:9/t"}, "http://c:9/t"),
        # The setting wins over the variables.
        (
            "http://mine:4318",
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"},
            "http://mine:4318/v1/traces",
        ),
        ("http://mine:4318", {"OTEL_SDK_DISABLED": "true"}, None),
    ],
)
def test_where_spans_go(endpoint: str, environ: dict[str, str], expected: str | None) -> None:
    assert traces_endpoint(settings(endpoint), environ) == expected


def test_off_is_the_one_no_op() -> None:
    assert build(settings(), {}) is OFF
    assert OFF.tracing is NO_TRACING and not NO_TRACING.enabled


def test_on_builds_the_exporter_and_stops_it() -> None:
    telemetry = build(settings("http://127.0.0.1:9"), {})
    assert telemetry.tracing.enabled
    telemetry.shutdown()  # nothing was queued: no export is tried
    assert telemetry.provider is None


@pytest.mark.parametrize("bad", ["collector:4318", "ftp://c", "http://"])
def test_a_bad_endpoint_is_one_line_naming_the_key(tmp_path: Path, bad: str) -> None:
    file = tmp_path / "reconciler.toml"
    file.write_text(f'[telemetry]\notlp_endpoint = "{bad}"\n')
    with pytest.raises(ConfigError, match=r"telemetry\.otlp_endpoint: must be an http"):
        load_settings(file, environ={})


def test_without_the_sdk_a_configured_endpoint_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)
    with pytest.raises(ConfigError, match=r"install reconciler\[otel\]"):
        build(settings("http://collector:4318"), {})


def test_trace_ids_are_w3c_ids_and_old_ones_still_read() -> None:
    made = ids.trace_id()
    assert made.startswith("tr_") and len(made) == 35 and w3c_trace_id(made)
    assert w3c_trace_id("tr_" + "ab" * 12) == int("ab" * 12, 16)  # an older, shorter id
    for bad in ("tr_", "tr_xyz", "abc", "tr_" + "0" * 32, "tr_" + "1" * 33):
        assert w3c_trace_id(bad) is None


def test_the_client_sends_the_callers_span_and_nothing_without_one() -> None:
    assert trace_headers() == {}
    tracer = TracerProvider().get_tracer("agent")
    with tracer.start_as_current_span("agent work") as span:
        context = span.get_span_context()
        sent = trace_headers()
    flags = int(context.trace_flags)
    assert sent == {"traceparent": f"00-{context.trace_id:032x}-{context.span_id:016x}-{flags:02x}"}
    assert flags & 1  # sampled
    assert trace_headers() == {}


def test_the_client_import_stays_without_opentelemetry() -> None:
    assert "opentelemetry" not in top_level(modules_after("import reconciler.client"))
