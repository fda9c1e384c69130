"""The caller's W3C trace context, sent with each request when the caller has a span.

The client never needs OpenTelemetry: it looks only when the caller's process has
imported ``opentelemetry.trace`` already (a caller with a current span has), so
``import reconciler.client`` stays light and works without the package installed.
"""

from __future__ import annotations

import sys


def trace_headers() -> dict[str, str]:
    """``{"traceparent": ...}`` for the caller's current span; empty without one."""
    module = sys.modules.get("opentelemetry.trace")
    if module is None:
        return {}
    try:
        context = module.get_current_span().get_span_context()
    except Exception:  # a caller's broken or foreign tracing must never fail a call
        return {}
    if not context.is_valid:
        return {}
    flags = int(context.trace_flags)
    headers = {"traceparent": f"00-{context.trace_id:032x}-{context.span_id:016x}-{flags:02x}"}
    state = context.trace_state
    if state:
        headers["tracestate"] = state.to_header()
    return headers
