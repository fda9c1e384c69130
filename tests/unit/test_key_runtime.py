"""The runtime decisions behind the issue-21 provider keys, each pure and without HTTP.

create.set (templates, conflicts), duplicate answers, lookups over a list and its
cursor, rate-limit headers folded into one Retry-After, a 403 that is a rate limit,
which creates may have made a job, JSONL lines, webhook types, and the resend plan.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.commands.webhooks import is_hint
from reconciler.core.backoff import BackoffPolicy, parse_retry_after
from reconciler.core.collect import CollectDecision, RetryFetch, decide_collect
from reconciler.core.create import may_have_landed
from reconciler.core.errors import DecisionNotAllowed, UnsafePathValue
from reconciler.core.operator_decision import DecisionRequest, plan_decision
from reconciler.core.poll import decide
from reconciler.core.poll_values import Observation, PollPolicy, PollRecord, Stop, Wait
from reconciler.core.provider_calls import CallResult
from reconciler.core.rate_limit import is_rate_limited, retry_after_value, wait_seconds
from reconciler.core.records import EscalationRecord, OperationRecord, new_operation
from reconciler.core.states import State
from reconciler.core.vocabulary import (
    DecisionAction,
    EscalationReason,
    RemoteCategory,
    TransportError,
)
from reconciler.providers.adapter import (
    LookupVerdict,
    create_outcome,
    lookup_outcome,
    next_page,
)
from reconciler.providers.call_request import apply_set, set_conflict
from reconciler.providers.loader import parse_provider
from reconciler.providers.pointer import Pointer
from reconciler.providers.result_check import check_result, line_rule
from reconciler.providers.result_scan import Kind, ScanPlan, scan_bytes
from reconciler.providers.spec import LineTest, ProviderSpec, SetRule
from reconciler.providers.templates import alnum_key, compiled, render
from tests.support.provider_mock import BASE_URL
from tests.support.stack import sim_provider_table

NOW = datetime(2026, 5, 4, 12, 0, tzinfo=UTC)
VALUES: dict[str, str | None] = {
    "idempotency_key": "key-1",
    "operation_id": "op_1",
    "trace_id": "trace-1",
    "webhook_url": "https://rec.example/webhooks/sim",
}


def spec_with(**sections: Any) -> ProviderSpec:
    return parse_provider("sim", sim_provider_table(BASE_URL, **sections), "test.toml")


def rule(pointer: str, value: Any) -> SetRule:
    return SetRule(Pointer.parse(pointer), value)


def answered(status: int, body: Any = None, raw: bytes | None = None, **extra: Any) -> CallResult:
    return CallResult("GET", "/x", NOW, 1.0, http_status=status, body=body, body_bytes=raw, **extra)


# --- create.set -----------------------------------------------------------------------


def test_set_values_are_templates_also_when_nested() -> None:
    rules = [
        rule("/submission_id", "{idempotency_key}"),
        rule("/metadata/reconciler_key", "{idempotency_key}"),
        rule("/webhook", "{webhook_url}"),
        rule("/webhook_events_filter", ["completed", "{operation_id}"]),
        rule("/tags", {"trace": "{trace_id}", "keep": "{{braces}}"}),
        rule("/return_run_details", True),
    ]
    request = {"entrypoint": "echo hi", "metadata": {"team": "a"}}
    body = apply_set(request, rules, VALUES)
    assert body == {
        "entrypoint": "echo hi",
        "metadata": {"team": "a", "reconciler_key": "key-1"},
        "submission_id": "key-1",
        "webhook": "https://rec.example/webhooks/sim",
        "webhook_events_filter": ["completed", "op_1"],
        "tags": {"trace": "trace-1", "keep": "{braces}"},
        "return_run_details": True,
    }
    assert request == {"entrypoint": "echo hi", "metadata": {"team": "a"}}  # not changed


def test_a_request_holding_a_set_pointer_is_refused_naming_it() -> None:
    rules = [rule("/metadata/reconciler_key", "{idempotency_key}")]
    problem = set_conflict({"metadata": {"reconciler_key": "mine"}}, rules)
    assert problem is not None and "/metadata/reconciler_key" in problem
    assert set_conflict({"metadata": {"other": 1}}, rules) is None
    assert set_conflict({}, rules) is None
    # Holding null still holds the field: the agent may not choose it either.
    assert set_conflict({"metadata": {"reconciler_key": None}}, rules) is not None
    blocked = set_conflict({"metadata": "text"}, rules)
    assert blocked is not None and "/metadata" in blocked
    assert set_conflict({"anything": 1}, []) is None


# Braces are a template's (a file's values are checked at load): the values here hold none.
PLAIN = st.text(alphabet=st.characters(blacklist_characters="{}"), max_size=8)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | PLAIN,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)
TOKENS = st.lists(st.text(alphabet="abc", min_size=1, max_size=2), min_size=1, max_size=3)


@settings(max_examples=200, deadline=None)
@given(
    request=st.dictionaries(st.text(alphabet="abc", max_size=2), JSON, max_size=4),
    paths=st.lists(TOKENS, min_size=1, max_size=3),
    value=JSON,
)
def test_set_either_refuses_or_writes_every_rule_over_an_untouched_request(
    request: dict[str, Any], paths: list[list[str]], value: Any
) -> None:
    rules = [rule("/" + "/".join(p), value) for p in paths]
    before = copy.deepcopy(request)
    problem = set_conflict(request, rules)
    body = apply_set(request, rules, VALUES)
    assert request == before
    if problem is None:
        # Nothing the agent sent is lost, and the last rule written to a pointer holds.
        last = rules[-1]
        assert last.pointer.resolve(body) == render(last.value, VALUES)
    # Once written, every pointer is held: the written body would itself be refused.
    assert set_conflict(body, rules) is not None


def test_a_template_fills_its_names_and_writes_doubled_braces_as_one() -> None:
    assert compiled("{idempotency_key}/{{x}}/{trace_id}").fill(VALUES) == "key-1/{x}/trace-1"
    # A placeholder with no value refuses the call: the braces are never sent.
    with pytest.raises(UnsafePathValue, match="webhook_url"):
        compiled("{webhook_url}").fill({"webhook_url": None})


def test_the_key_in_letters_and_digits_is_the_key_for_names_that_allow_no_underscore() -> None:
    key = "idem_" + "0123456789abcdef" * 2
    assert alnum_key(key) == "idem" + "0123456789abcdef" * 2
    # Carried in the body or the lookup, it is how the key travels, as {idempotency_key} is.
    spec = spec_with(
        create={
            "idempotency_header": None,
            "idempotency": "body",
            "set": {"/clientRequestToken": "{idempotency_key_alnum}"},
        },
        lookup={
            "path": "/v1/jobs",
            "set": {"/filter/name": "job-{idempotency_key_alnum}"},
            "method": "POST",
        },
    )
    assert spec.create.set[0].fields == {"idempotency_key_alnum"}
    assert spec.lookup is not None and spec.lookup.sends_key(spec.lookup.path)


# --- duplicate answers and lookups over lists ---------------------------------------------


def test_a_duplicate_answer_is_recognised_by_status_and_text() -> None:
    spec = spec_with(
        create={"duplicate": {"status": [500, 409], "body_contains": "already exists"}}
    )
    dup = create_outcome(spec, answered(500, raw=b'{"detail":"Job abc already exists"}'))
    assert dup.duplicate and dup.job_id is None
    assert not create_outcome(spec, answered(500, raw=b'{"detail":"boom"}')).duplicate
    assert not create_outcome(spec, answered(502, raw=b"already exists")).duplicate


LIST_LOOKUP = {
    "path": "/v1/jobs",
    "items": "/data",
    "match": {"/metadata/reconciler_key": "{idempotency_key}"},
    "job_id": "/id",
    "pages": 3,
    "next": "/last_id",
    "next_param": "after",
    "has_more": "/has_more",
}


def test_a_list_lookup_finds_the_matching_item_and_reads_its_id() -> None:
    spec = spec_with(lookup=LIST_LOOKUP)
    wanted = ((Pointer.parse("/metadata/reconciler_key"), "key-1"),)
    body: dict[str, Any] = {
        "data": [
            {"id": "b1", "metadata": {"reconciler_key": "other"}},
            {"id": "b2", "metadata": {"reconciler_key": "key-1"}},
        ],
        "has_more": True,
        "last_id": "b2",
    }
    found = lookup_outcome(spec, answered(200, body), wanted)
    assert found.verdict is LookupVerdict.FOUND and found.job_id == "b2"
    missing = lookup_outcome(spec, answered(200, {**body, "data": body["data"][:1]}), wanted)
    assert missing.verdict is LookupVerdict.NOT_FOUND
    assert spec.lookup is not None and next_page(spec.lookup, body) == ("b2", None)
    assert next_page(spec.lookup, {**body, "has_more": False}) == (None, None)
    # More to read and no cursor to read it with: not the end of the list.
    cursor, problem = next_page(spec.lookup, {**body, "last_id": None})
    assert cursor is None and problem is not None and "has more" in problem
    two = {"data": [body["data"][1], body["data"][1]]}
    assert lookup_outcome(spec, answered(200, two), wanted).verdict is LookupVerdict.UNKNOWN
    not_a_list = lookup_outcome(spec, answered(200, {"data": {}}), wanted)
    assert not_a_list.verdict is LookupVerdict.UNKNOWN and "no list" in str(
        not_a_list.job_id_problem
    )


# --- rate limits ----------------------------------------------------------------------------


def headers(**values: str) -> httpx.Headers:
    return httpx.Headers({k.replace("_", "-"): v for k, v in values.items()})


def test_every_rate_limit_header_is_a_minimum_in_whole_seconds() -> None:
    assert wait_seconds(headers(retry_after_ms="1500"), NOW) == 2
    assert wait_seconds(headers(retry_after="3", retry_after_ms="1200"), NOW) == 3
    reset = str(int(NOW.timestamp()) + 42)
    assert wait_seconds(headers(x_ratelimit_reset=reset), NOW, "x-ratelimit-reset") == 42
    # Without the provider file naming it, a reset header says nothing.
    assert wait_seconds(headers(x_ratelimit_reset=reset), NOW) is None
    past = str(int(NOW.timestamp()) - 10)
    assert wait_seconds(headers(x_ratelimit_reset=past), NOW, "x-ratelimit-reset") == 0
    assert wait_seconds(headers(retry_after_ms="soon"), NOW) is None
    # A lone Retry-After is kept as sent (history shows the provider's words).
    assert retry_after_value(headers(retry_after="Wed, 21 Oct 2026 07:28:00 GMT"), NOW) == (
        "Wed, 21 Oct 2026 07:28:00 GMT"
    )
    assert retry_after_value(headers(retry_after_ms="250"), NOW) == "1"


@settings(max_examples=300, deadline=None)
@given(
    after=st.none() | st.integers(0, 10**6),
    millis=st.none() | st.integers(0, 10**9),
    reset_in=st.none() | st.integers(-1000, 10**6),
)
def test_the_folded_wait_is_the_longest_asked_rounded_up(
    after: int | None, millis: int | None, reset_in: int | None
) -> None:
    values = {}
    if after is not None:
        values["retry-after"] = str(after)
    if millis is not None:
        values["retry-after-ms"] = str(millis)
    if reset_in is not None:
        values["x-ratelimit-reset"] = str(int(NOW.timestamp()) + reset_in)
    asked = [
        float(a)
        for a in (after, None if millis is None else millis / 1000, reset_in)
        if a is not None
    ]
    got = wait_seconds(httpx.Headers(values), NOW, "x-ratelimit-reset")
    if not asked:
        assert got is None
        return
    assert got == math.ceil(max(0.0, *asked))
    text = retry_after_value(httpx.Headers(values), NOW, "x-ratelimit-reset")
    parsed = parse_retry_after(text, NOW)
    assert parsed is not None and parsed.total_seconds() >= max(0.0, *asked)


def test_a_403_with_the_limit_spent_is_a_rate_limit_and_a_plain_403_is_not() -> None:
    assert is_rate_limited(403, headers(x_ratelimit_remaining="0"))
    assert is_rate_limited(403, headers(retry_after="60"))
    assert is_rate_limited(429, headers())
    assert not is_rate_limited(403, headers(x_ratelimit_remaining="12"))
    assert not is_rate_limited(403, headers())
    assert not is_rate_limited(401, headers(x_ratelimit_remaining="0"))


def _record() -> PollRecord:
    return PollRecord(
        deadline_at=NOW + timedelta(hours=1),
        accepted_at=NOW - timedelta(minutes=5),
        max_status_requests=12,
        status_requests_used=1,
        max_transport_failures=3,
    )


def test_a_rate_limited_403_waits_for_its_reset_and_a_plain_403_is_denied() -> None:
    policy = PollPolicy()
    limited = Observation(at=NOW, http_status=403, retry_after="600", rate_limited=True)
    waited = decide(_record(), limited, NOW, random.Random(1), policy)
    assert isinstance(waited, Wait)
    assert waited.at >= NOW + timedelta(seconds=600)
    assert waited.counters.rate_limited_count == 1
    denied = decide(_record(), Observation(at=NOW, http_status=403), NOW, random.Random(1), policy)
    assert isinstance(denied, Stop) and denied.reason is EscalationReason.AUTHORIZATION_DENIED


def first_fetch_decision(call: CallResult) -> CollectDecision:
    """What a first failed fetch of a succeeded job's result leads to."""
    return decide_collect(
        call,
        None,
        ref=None,
        category=RemoteCategory.SUCCESS,
        attempts=1,
        max_failures=3,
        detail={},
        backoff=BackoffPolicy(),
        rng=random.Random(1),
    )


def test_a_result_fetch_retry_waits_at_least_the_providers_retry_after() -> None:
    call = CallResult("GET", "/r", NOW, 1.0, http_status=503, retry_after="90")
    decision = first_fetch_decision(call)
    assert isinstance(decision, RetryFetch) and decision.delay_seconds >= 90


def test_a_rate_limited_403_result_fetch_is_retried_and_a_plain_403_is_not() -> None:
    def fetch(limited: bool) -> object:
        call = CallResult("GET", "/r", NOW, 1.0, http_status=403, rate_limited=limited)
        return first_fetch_decision(call)

    assert isinstance(fetch(True), RetryFetch)
    assert not isinstance(fetch(False), RetryFetch)


# --- which creates may have made a job ------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "error", "delivered", "limited", "landed"),
    [
        (None, TransportError.TIMEOUT, True, False, True),
        (None, TransportError.CONNECTION_RESET, True, False, True),
        (None, TransportError.CONNECTION_REFUSED, False, False, False),
        (500, None, True, False, True),
        (502, None, True, False, True),
        (202, None, True, False, True),  # a 2xx without a job id
        (429, None, True, False, False),
        (408, None, True, False, False),
        (403, None, True, True, False),
    ],
)
def test_may_have_landed(
    status: int | None,
    error: TransportError | None,
    delivered: bool,
    limited: bool,
    landed: bool,
) -> None:
    assert may_have_landed(status, error, delivered, limited) is landed


# --- JSONL ------------------------------------------------------------------------------


def test_jsonl_lines_are_parsed_one_by_one_and_a_malformed_one_is_named() -> None:
    report = scan_bytes(ScanPlan(Kind.LINES), b'{"a":1}\n\n{"a":2}\n{oops\n')
    assert report.document == [{"a": 1}, {"a": 2}] and report.lines == 2
    assert len(report.problems) == 1 and "line 4" in report.problems[0]


LINE_TESTS = (
    LineTest.model_validate({"pointer": "/error", "present": True}),
    LineTest.model_validate({"pointer": "/response/status_code", "in": [400, 500]}),
    LineTest.model_validate({"pointer": "/result/type", "equals": "errored"}),
)


@settings(max_examples=200, deadline=None)
@given(
    kinds=st.lists(
        st.sampled_from(["ok", "error", "null_error", "http500", "errored"]), max_size=30
    ),
    errors=st.integers(0, 5),
)
def test_failed_lines_are_counted_whichever_test_matches(kinds: list[str], errors: int) -> None:
    make = {
        "ok": {"response": {"status_code": 200}},
        "error": {"error": {"code": "x"}},
        "null_error": {"error": None, "response": {"status_code": 200}},
        "http500": {"response": {"status_code": 500}},
        "errored": {"result": {"type": "errored"}},
    }
    data = b"".join(json.dumps(make[k]).encode() + b"\n" for k in kinds)
    rules = tuple(line_rule(t) for t in LINE_TESTS)
    report = scan_bytes(ScanPlan(Kind.LINES, rules=rules), data)
    errors_file = b"".join(b'{"e": %d}\n' % i for i in range(errors))
    failed_file = scan_bytes(ScanPlan(Kind.LINES, every_line_failed=True), errors_file)
    bad = sum(k in ("error", "http500", "errored") for k in kinds)
    assert report.lines + failed_file.lines == len(kinds) + errors
    assert report.failed == bad == len(report.items)
    assert failed_file.failed == errors == len(failed_file.items)


def test_a_jsonl_result_counts_its_lines_and_keeps_failed_ones_as_items() -> None:
    spec = spec_with(
        result={
            "path": "/v1/jobs/{job_id}/result",
            "content_type": "application/jsonl",
            "required": [],
            "summary": {},
            "failed_items": None,
            "checksum": None,
            "size": None,
            "failed_lines": [{"pointer": "/error", "present": True}],
        }
    )
    data = b'{"id":1}\n{"id":2,"error":{"code":"e"}}\n'
    call = answered(200, raw=data, content_type="application/octet-stream")
    check = check_result(spec, call, {})
    assert check.ok, check.problems
    assert check.summary == {"total_lines": 2, "failed_lines": 1}
    assert check.failed_items == ({"line": 2, "item": {"id": 2, "error": {"code": "e"}}},)
    broken = check_result(spec, answered(200, raw=b'{"id":1}\nnot json\n'), {})
    assert not broken.ok and "line 2" in broken.problems[0]


# --- webhook types --------------------------------------------------------------------------


def test_only_listed_event_types_are_hints() -> None:
    spec = spec_with(webhook={"types": ["batch.completed", "batch.failed"]})
    assert spec.webhook is not None
    assert is_hint(spec.webhook, {}, {"type": "batch.completed", "data": {"id": "b1"}})
    assert not is_hint(spec.webhook, {}, {"type": "batch.created", "data": {"id": "b1"}})
    assert not is_hint(spec.webhook, {}, {"data": {"id": "b1"}})
    every = spec_with()
    assert every.webhook is not None and is_hint(every.webhook, {}, {"anything": 1})


# --- the resend decision --------------------------------------------------------------------


def _escalated(
    reason: EscalationReason = EscalationReason.CREATE_UNKNOWN,
) -> tuple[OperationRecord, EscalationRecord]:
    op = new_operation(
        id="op_1",
        provider="sim",
        caller="agent-1",
        request_fingerprint="fp",
        state=State.ESCALATED.value,
        idempotency_token="tok",
        trace_id="trace",
        created_at=NOW - timedelta(hours=2),
        updated_at=NOW,
        deadline_at=NOW - timedelta(minutes=1),
        create_deadline_at=NOW - timedelta(hours=1),
        max_status_requests=12,
        max_transport_failures=3,
        create_attempts=1,
        escalation_id=5,
    )
    esc = EscalationRecord(
        id=5,
        operation_id="op_1",
        reason=reason.value,
        message="External job needs a decision",
        created_at=NOW,
        options=[{"action": "abandon"}, {"action": "resend"}],
        resume_state=State.CREATE_UNKNOWN.value,
        decided_at=None,
        decided_by=None,
        decision=None,
    )
    return op, esc


def test_resend_reopens_the_create_for_the_next_attempt_only() -> None:
    op, esc = _escalated()
    plan = plan_decision(op, esc, DecisionRequest(DecisionAction.RESEND), "operator:ops", NOW, 30)
    assert plan.target is State.CREATE_UNKNOWN
    assert plan.record == {"action": "resend", "create_attempts": 1}
    assert plan.changes["next_poll_at"] == NOW
    assert plan.changes["create_deadline_at"] > NOW and plan.changes["deadline_at"] > NOW


def test_resend_is_refused_where_it_was_not_offered() -> None:
    op, offered = _escalated()
    esc = dataclasses.replace(
        offered,
        options=[{"action": "extend"}, {"action": "abandon"}],
        reason=EscalationReason.PROVIDER_FAILURE.value,
    )
    with pytest.raises(DecisionNotAllowed, match="not offered"):
        plan_decision(op, esc, DecisionRequest(DecisionAction.RESEND), "operator:ops", NOW, 30)
