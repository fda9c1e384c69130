"""Each operation's story as spans, on the manual clock with the SDK's in-memory exporter.

The service and the sim talk over ASGI (``tests.support.world``); the spans are the
real SDK's, collected in memory. One trace per operation, continued from the agent's
``traceparent`` (a malformed one starts a new trace and is no error); provider calls
carry the trace context; a second replica's spans join the stored trace; with
telemetry off nothing is sent and nothing is made.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from reconciler.agent_tools.backends import LocalBackend
from reconciler.inbound.auth import principal_for
from reconciler.telemetry import Telemetry
from reconciler.tracing import Attr, SpanName, Tracing
from reconciler.wire import CreateOperation
from tests.support import hooks
from tests.support.world import open_world, world

pytestmark = pytest.mark.anyio

AGENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
AGENT_SPAN = "00f067aa0ba902b7"
AGENT_PARENT = f"00-{AGENT_TRACE}-{AGENT_SPAN}-01"
JOB = {"scenario": "success", "duration": 30}


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    found = InMemorySpanExporter()
    yield found
    found.clear()


def telemetry_to(exporter: InMemorySpanExporter) -> Telemetry:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Telemetry(Tracing(provider.get_tracer("tests")), provider)


def in_trace(exporter: InMemorySpanExporter, trace_hex: str) -> list[ReadableSpan]:
    return [
        s
        for s in exporter.get_finished_spans()
        if s.context is not None and f"{s.context.trace_id:032x}" == trace_hex
    ]


def named(spans: list[ReadableSpan], name: SpanName) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name.value]


def span_hex(span: ReadableSpan) -> str:
    assert span.context is not None
    return f"{span.context.span_id:016x}"


def parent_hex(span: ReadableSpan) -> str | None:
    return f"{span.parent.span_id:016x}" if span.parent is not None else None


async def test_the_story_is_one_trace_continued_from_the_agent(
    tmp_path: Path, db_url: str, exporter: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(hooks.LOG_ENV, str(tmp_path / "hooks.log"))
    async with world(
        tmp_path, db_url, telemetry=telemetry_to(exporter), hooks=(hooks.RECORD_ASYNC,)
    ) as w:
        body = {"provider": "sim", "request": JOB}
        headers = {**w.headers(), "traceparent": AGENT_PARENT}
        response = await w.client.post("/v1/operations", json=body, headers=headers)
        assert response.status_code == 202, response.text
        op = response.json()
        assert op["trace_id"] == f"tr_{AGENT_TRACE}"
        await w.run_until(w.finished(op["id"]))
        spans = in_trace(exporter, AGENT_TRACE)

        (request,) = named(spans, SpanName.AGENT_CREATE)
        assert parent_hex(request) == AGENT_SPAN
        assert request.attributes is not None
        assert request.attributes[Attr.OPERATION.value] == op["id"]
        (create,) = named(spans, SpanName.CREATE)
        assert parent_hex(create) == span_hex(request)
        reads = named(spans, SpanName.STATUS_READ)
        assert reads and all(parent_hex(r) == span_hex(request) for r in reads)
        assert [r.attributes[Attr.DECISION.value] for r in reads if r.attributes][-1] == "collect"
        assert all(r.attributes and r.attributes[Attr.DELAY_SOURCE.value] for r in reads[1:]), (
            "each read after the first says what made it due"
        )
        for name in (SpanName.COLLECT, SpanName.COMPLETION):
            (step,) = named(spans, name)
            assert parent_hex(step) == span_hex(request)
        (hook,) = named(spans, SpanName.HOOK)
        (completion,) = named(spans, SpanName.COMPLETION)
        assert parent_hex(hook) == span_hex(completion)
        assert hook.attributes and hook.attributes[Attr.STEP.value] == f"hook:{hooks.RECORD_ASYNC}"

        # Every provider call is a child of its step and sent that child's context.
        calls = named(spans, SpanName.PROVIDER_CALL)
        steps = {span_hex(s) for s in [create, *reads, *named(spans, SpanName.COLLECT)]}
        assert calls and all(parent_hex(c) in steps for c in calls)
        sent = {r.traceparent for r in w.sim.requests if r.traceparent}
        assert sent == {f"00-{AGENT_TRACE}-{span_hex(c)}-01" for c in calls}

        # The webhook came on its own request: its span is in another trace, linked to ours.
        webhooks = [
            s
            for s in exporter.get_finished_spans()
            if s.name == SpanName.WEBHOOK.value
            and any(f"{link.context.trace_id:032x}" == AGENT_TRACE for link in s.links)
        ]
        assert webhooks, "a verified webhook links to the operation's trace"
        assert all(f"{s.context.trace_id:032x}" != AGENT_TRACE for s in webhooks if s.context)


async def test_a_malformed_traceparent_starts_a_new_trace(
    tmp_path: Path, db_url: str, exporter: InMemorySpanExporter
) -> None:
    async with world(tmp_path, db_url, telemetry=telemetry_to(exporter)) as w:
        body = {"provider": "sim", "request": JOB}
        for bad in ("garbage", f"00-{'0' * 32}-{AGENT_SPAN}-01", f"ff-{AGENT_TRACE}-{AGENT_SPAN}"):
            headers = {**w.headers(), "traceparent": bad}
            response = await w.client.post("/v1/operations", json=body, headers=headers)
            assert response.status_code == 202, response.text
            trace_id = response.json()["trace_id"]
            assert trace_id.startswith("tr_") and len(trace_id) == 35
            assert AGENT_TRACE not in trace_id
            (request,) = named(in_trace(exporter, trace_id[3:]), SpanName.AGENT_CREATE)
            assert request.parent is None


async def test_another_replica_continues_the_stored_trace(
    tmp_path: Path, db_url: str, exporter: InMemorySpanExporter
) -> None:
    first = await open_world(tmp_path, db_url, telemetry=telemetry_to(exporter))
    try:
        headers = {**first.headers(), "traceparent": AGENT_PARENT}
        body = {"provider": "sim", "request": JOB}
        response = await first.client.post("/v1/operations", json=body, headers=headers)
        op_id = response.json()["id"]
        await first.run_until(first.in_state(op_id, "observing"))
        (request,) = named(in_trace(exporter, AGENT_TRACE), SpanName.AGENT_CREATE)
        # The first replica stops acting (as a stopped process would); the second, with a
        # tracer of its own, finishes the operation from what is stored.
        other = InMemorySpanExporter()
        second = await open_world(
            tmp_path,
            db_url,
            telemetry=telemetry_to(other),
            clock=first.clock,
            sim=first.sim,
            tokens=(first.agent_token, first.operator_token),
        )
        try:
            await second.run_until(second.finished(op_id))
        finally:
            await second.close()
    finally:
        await first.close()
    reads = named(in_trace(other, AGENT_TRACE), SpanName.STATUS_READ)
    assert reads and all(parent_hex(r) == span_hex(request) for r in reads)
    assert named(in_trace(other, AGENT_TRACE), SpanName.COLLECT)


async def test_with_telemetry_off_nothing_is_sent(tmp_path: Path, db_url: str) -> None:
    async with world(tmp_path, db_url) as w:
        assert not w.runtime.tracing.enabled
        headers = {**w.headers(), "traceparent": AGENT_PARENT}
        body = {"provider": "sim", "request": JOB}
        response = await w.client.post("/v1/operations", json=body, headers=headers)
        op = response.json()
        await w.run_until(w.finished(op["id"]))
        assert op["trace_id"].startswith("tr_") and AGENT_TRACE not in op["trace_id"]
        assert w.sim.requests and not any(r.traceparent for r in w.sim.requests)
        assert w.row(op["id"])["traceparent"] is None


async def test_an_escalation_and_the_operators_decision_join_the_trace(
    tmp_path: Path, db_url: str, exporter: InMemorySpanExporter
) -> None:
    async with world(tmp_path, db_url, telemetry=telemetry_to(exporter)) as w:
        body = {"provider": "sim", "request": {"scenario": "unknown_state", "duration": 5}}
        headers = {**w.headers(), "traceparent": AGENT_PARENT}
        op_id = (await w.client.post("/v1/operations", json=body, headers=headers)).json()["id"]
        await w.run_until(w.in_state(op_id, "escalated"))
        decided = await w.client.post(
            f"/v1/operations/{op_id}/decisions",
            json={"action": "abandon"},
            headers=w.headers(operator=True),
        )
        assert decided.status_code == 200, decided.text
        spans = in_trace(exporter, AGENT_TRACE)
        (request,) = named(spans, SpanName.AGENT_CREATE)
        (escalation,) = named(spans, SpanName.ESCALATION)
        assert escalation.attributes is not None
        assert escalation.attributes[Attr.REASON.value] == "unknown_state"
        (read,) = [
            r for r in named(spans, SpanName.STATUS_READ) if span_hex(r) == parent_hex(escalation)
        ]
        assert read.attributes is not None and read.attributes[Attr.DECISION.value] == "stop"
        (decision,) = named(spans, SpanName.DECISION)
        assert parent_hex(decision) == span_hex(request)
        assert decision.attributes is not None
        assert decision.attributes[Attr.DECISION.value] == "abandon"


async def test_an_mcp_start_continues_the_agents_trace(
    tmp_path: Path, db_url: str, exporter: InMemorySpanExporter
) -> None:
    # The MCP door builds its backend with the HTTP request's headers (agent_tools/http.py).
    async with world(tmp_path, db_url, telemetry=telemetry_to(exporter)) as w:
        who = await principal_for(w.runtime, f"Bearer {w.agent_token}")
        backend = LocalBackend(w.runtime, who, {"traceparent": AGENT_PARENT})
        view = await backend.start(CreateOperation(provider="sim", request=JOB))
        assert view["trace_id"] == f"tr_{AGENT_TRACE}"
        (request,) = named(in_trace(exporter, AGENT_TRACE), SpanName.AGENT_CREATE)
        assert parent_hex(request) == AGENT_SPAN
        # Without one, a call starts a trace of its own, as over stdio.
        alone = await LocalBackend(w.runtime, who).start(
            CreateOperation(provider="sim", request=JOB)
        )
        assert alone["trace_id"].startswith("tr_") and alone["trace_id"] != view["trace_id"]
