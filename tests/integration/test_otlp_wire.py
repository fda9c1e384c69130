"""Traces on the wire: a real service run, the real OTLP/HTTP exporter, a receiver decoding
the real protobuf (``tests.support.otlp``).

One operation, started with an agent's ``traceparent``, is followed from the agent's
request through its status reads, the provider's webhook, the result, a hook and the
agent's callback; the spans that reach the receiver form that story as one tree in the
agent's trace, the webhook's span links to it, every provider request and the callback
carried the context of the span that sent it, and no secret, token or body appears in
any attribute.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from reconciler.storage import operations as store
from reconciler.tracing import Attr, SpanName
from tests.support import hooks, loopback
from tests.support.hooks import serve_receiver
from tests.support.otlp import OtlpReceiver, ReceivedSpan, serve_otlp
from tests.support.stack import (
    CALLBACK_SECRET,
    SIM_TOKEN,
    WEBHOOK_SECRET,
    Stack,
    running_stack,
)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

AGENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
AGENT_SPAN = "b7ad6b7169203331"
BODY_MARKER = "body-marker-3f9a71c2"  # in the agent's request: must never reach a span
CALLBACKS = {"max_attempts": 3, "base_delay_seconds": 0.05, "max_delay_seconds": 0.2}
SERVER_KIND = 2  # opentelemetry.proto.trace.v1.Span.SPAN_KIND_SERVER


def of(receiver: OtlpReceiver, name: SpanName) -> list[ReceivedSpan]:
    return [s for s in receiver.spans() if s.name == name.value and s.trace_id == AGENT_TRACE]


def only(spans: list[ReceivedSpan], name: SpanName) -> ReceivedSpan:
    found = [s for s in spans if s.name == name.value]
    assert len(found) == 1, f"{name}: {found}"
    return found[0]


def idempotency_token(stack: Stack, op_id: str) -> str:
    with stack.runtime.db.read() as conn:
        return store.load_operation(conn, op_id).idempotency_token


def strings(span: ReceivedSpan) -> list[str]:
    values: list[Any] = [*span.attributes.values(), *span.attributes.keys()]
    for event in span.event_attributes:
        values += [*event.values(), *event.keys()]
    return [json.dumps(v) if not isinstance(v, str) else v for v in values]


def test_one_operation_reaches_a_collector_as_one_trace(
    tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(hooks.LOG_ENV, str(tmp_path / "hooks.log"))
    # The stack stops first (the exits run in reverse): its last spans go out at shutdown
    # while the receiver still listens.
    with (
        serve_otlp() as (collector, otlp_url),
        serve_receiver() as (receiver, cb_url),
        running_stack(
            tmp_path,
            db_url,
            callbacks=CALLBACKS,
            hooks=(hooks.RECORD_ASYNC,),
            telemetry={"otlp_endpoint": otlp_url, "export_interval_seconds": 0.05},
        ) as stack,
    ):
        body = {
            "provider": "sim",
            "request": {"scenario": "success", "duration": 600, "note": BODY_MARKER},
            "callback_url": f"{cb_url}/cb/ok",
        }
        headers = {**stack.headers(), "traceparent": f"00-{AGENT_TRACE}-{AGENT_SPAN}-01"}
        response = stack.client.post("/v1/operations", json=body, headers=headers)
        assert response.status_code == 202, response.text
        op_id = response.json()["id"]
        assert response.json()["trace_id"] == f"tr_{AGENT_TRACE}"
        job_id = wait_until(lambda: stack.get(op_id)["remote_job_id"], 30, "the provider's job id")
        wait_until(lambda: of(collector, SpanName.STATUS_READ), 30, "a status read's span")
        forced = loopback.post(
            f"{stack.sim_url}/_sim/jobs/{job_id}/complete",
            json={"state": "succeeded"},
            timeout=10,
        )
        forced.raise_for_status()
        (delivery,) = wait_until(lambda: receiver.deliveries("ok"), 30, "the callback")
        wait_until(lambda: of(collector, SpanName.CALLBACK), 30, "the callback's span")
        wait_until(lambda: hooks.completion_finished(stack.runtime.db, op_id), 30, "the completion")
        result = stack.get(op_id)["result"]
        secrets = {
            SIM_TOKEN,
            WEBHOOK_SECRET,
            CALLBACK_SECRET,
            stack.agent_token,
            stack.operator_token,
            stack.callback_secret(),
            idempotency_token(stack, op_id),
            BODY_MARKER,
            json.dumps(result),
            *[v for v in result.values() if isinstance(v, str) and len(v) > 8],
        }
        sent = [r.traceparent for r in stack.sim.requests]

    spans = [s for s in collector.spans() if s.trace_id == AGENT_TRACE]
    assert {s.service for s in spans} == {"reconciler"}
    by_id = {s.span_id: s for s in spans}
    request = only(spans, SpanName.AGENT_CREATE)
    assert request.parent_span_id == AGENT_SPAN and request.kind == SERVER_KIND
    assert request.attributes[Attr.OPERATION.value] == op_id
    under = {s.name for s in spans if s.parent_span_id == request.span_id}
    assert {SpanName.CREATE, SpanName.STATUS_READ, SpanName.COLLECT, SpanName.COMPLETION} <= {
        SpanName(n) for n in under
    }
    reads = [s for s in spans if s.name == SpanName.STATUS_READ.value]
    assert all(r.parent_span_id == request.span_id for r in reads)
    assert reads[-1].attributes[Attr.DECISION.value] == "collect" or any(
        r.attributes.get(Attr.DECISION.value) == "collect" for r in reads
    )
    # The hooks and the callback run in shares of their own: a completion span each.
    completions = {s.span_id for s in spans if s.name == SpanName.COMPLETION.value}
    hook = only(spans, SpanName.HOOK)
    callback = only(spans, SpanName.CALLBACK)
    assert {hook.parent_span_id, callback.parent_span_id} <= completions
    assert not any(s.links for s in spans if s.name != SpanName.WEBHOOK.value)
    assert callback.attributes[Attr.HTTP_STATUS.value] == 204
    assert delivery.headers["traceparent"] == f"00-{AGENT_TRACE}-{callback.span_id}-01"

    # Each provider request carried the context of the call's own span, under its step.
    calls = [s for s in spans if s.name == SpanName.PROVIDER_CALL.value]
    assert calls and all(by_id[c.parent_span_id or ""].parent_span_id for c in calls)
    assert {tp for tp in sent if tp} <= {f"00-{AGENT_TRACE}-{c.span_id}-01" for c in calls}
    assert any(by_id[c.parent_span_id or ""].name == SpanName.COLLECT.value for c in calls)

    # The webhook came on its own request: another trace, linked to the operation's.
    webhooks = [
        s
        for s in collector.spans()
        if s.name == SpanName.WEBHOOK.value and (AGENT_TRACE, request.span_id) in s.links
    ]
    assert webhooks and all(w.trace_id != AGENT_TRACE for w in webhooks)
    assert webhooks[0].attributes[Attr.OPERATION.value] == op_id

    for span in collector.spans():
        for text in strings(span):
            leaked = [s for s in secrets if s and s in text]
            assert not leaked, f"{span.name} carries a secret or a body: {text!r}"
