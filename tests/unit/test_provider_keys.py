"""The provider keys real APIs need: each parses to its typed attribute, each bad value is
one line naming file, key and what to write instead."""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any

import pytest

from reconciler.core.errors import ConfigError
from reconciler.core.signatures import WebhookScheme
from reconciler.providers.loader import load_providers, parse_provider
from reconciler.providers.pointer import MISSING
from reconciler.providers.spec import (
    INLINE_SOURCE,
    IdempotencyMode,
    LineTest,
    ProviderSpec,
    SetRule,
)
from tests.support.provider_tables import with_key

PUBLIC = "https://reconciler.example.com/"
MINIMAL: dict[str, Any] = {
    "base_url": "http://127.0.0.1:8265",
    "create": {"path": "/api/jobs/", "job_id": "/submission_id", "idempotency": "none"},
    "status": {"path": "/api/jobs/{job_id}", "state": "/status"},
    "states": {"pending": ["PENDING", "RUNNING"], "success": ["SUCCEEDED"]},
}
WEBHOOK = {"scheme": "standard-webhooks", "secrets_env": "W", "job_id": "/data/id"}
LOOKUP = {"path": "/v1/batches?limit=100", "job_id": "/id"}
LIST_LOOKUP = {**LOOKUP, "items": "/data", "match": {"/metadata/key": "{idempotency_key}"}}
JSONL_RESULT = {"path": "/files/{result_ref}/content", "content_type": "application/jsonl"}


def _load(data: dict[str, Any], public_url: str = PUBLIC) -> ProviderSpec:
    return parse_provider("p", data, INLINE_SOURCE, public_url=public_url)


def _error(data: dict[str, Any], public_url: str = PUBLIC) -> str:
    with pytest.raises(ConfigError) as caught:
        _load(data, public_url)
    message = caught.value.message
    assert "\n" not in message
    assert message.startswith(f"{INLINE_SOURCE}: providers.p.")
    return message


# --- create.idempotency ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("create", "mode"),
    [
        ({"idempotency_header": "Idempotency-Key"}, IdempotencyMode.HEADER),
        ({"path": "/jobs/{idempotency_key}"}, IdempotencyMode.PATH),
        ({"idempotency": "none"}, IdempotencyMode.NONE),
        (
            {"idempotency": "body", "set": {"/submission_id": "{idempotency_key}"}},
            IdempotencyMode.BODY,
        ),
    ],
)
def test_idempotency_is_resolved_at_load(create: dict[str, Any], mode: IdempotencyMode) -> None:
    data = with_key(MINIMAL, "create.idempotency", MISSING)
    data["create"].update(create)
    assert _load(data).create.idempotency is mode


@pytest.mark.parametrize(
    ("create", "fragment"),
    [
        (
            {},
            "create.idempotency: required: create has no idempotency_header and its path no "
            '{idempotency_key}; say "body"',
        ),
        ({"idempotency": "maybe"}, 'create.idempotency: expected one of "header", "path", "body"'),
        ({"idempotency": 1}, "create.idempotency: expected a non-empty string"),
        ({"idempotency": "header"}, '"header" needs idempotency_header'),
        ({"idempotency": "path"}, '"path" needs {idempotency_key} in create.path'),
        ({"idempotency": "body"}, '"body" needs a [create.set] value using {idempotency_key}'),
        (
            {"idempotency": "none", "idempotency_header": "Idempotency-Key"},
            'create.idempotency: must be "header" (or leave it out) when idempotency_header',
        ),
        (
            {"idempotency": "body", "path": "/jobs/{idempotency_key}"},
            'create.idempotency: must be "path" (or leave it out): create.path holds the key',
        ),
    ],
)
def test_no_silent_idempotency_default(create: dict[str, Any], fragment: str) -> None:
    data = with_key(MINIMAL, "create.idempotency", MISSING)
    data["create"].update(create)
    assert fragment in _error(data)


# --- create.set -------------------------------------------------------------------------


def test_set_rules_keep_json_values_and_templates() -> None:
    rules = {
        "/submission_id": "{idempotency_key}",
        "/webhook_events_filter": ["completed"],
        "/metadata": {"op": "{operation_id}", "trace": "{trace_id}"},
        "/return_run_details": True,
        "/webhook": "{webhook_url}",
    }
    data = with_key(MINIMAL, "create.set", rules)
    data["webhook"] = WEBHOOK
    spec = _load(data)
    assert spec.create.set[0] == SetRule(spec.create.set[0].pointer, "{idempotency_key}")
    assert [(r.pointer.text, r.value) for r in spec.create.set] == list(rules.items())
    assert spec.create.set[2].fields == {"operation_id", "trace_id"}
    assert spec.create.uses("webhook_url") and not spec.create.uses("job_id")
    assert spec.webhook_url == "https://reconciler.example.com/webhooks/p"


@pytest.mark.parametrize(
    ("rules", "fragment"),
    [
        ("x", "create.set: expected a table of JSON pointer = value"),
        ({"": 1}, 'create.set."": the whole document cannot be set'),
        ({"model": 1}, "create.set.model: 'model': a JSON pointer is empty or starts with '/'"),
        (
            {"/a": "{job_id}"},
            'create.set."/a": only {idempotency_key}, {idempotency_key_alnum}, {operation_id}, '
            "{trace_id}",
        ),
        ({"/a": ["x", {"b": "{nope}"}]}, 'create.set."/a": only {idempotency_key}'),
        ({"/a": "{idempotency_key!r}"}, 'create.set."/a": only {idempotency_key}'),
        ({"/a": "{idempotency_key"}, 'create.set."/a": not a valid template'),
        ({"/a": 1, "/a/b": 2}, 'create.set."/a/b": overlaps /a: set each member once'),
        ({"/a": float("inf")}, 'create.set."/a": inf and nan are not JSON values'),
        ({"/a": [float("nan")]}, 'create.set."/a": inf and nan are not JSON values'),
        ({"/api_key": "sk-abc123"}, 'create.set."/api_key": looks like a credential'),
        ({"/auth/token": "abc123"}, 'create.set."/auth/token": looks like a credential'),
    ],
)
def test_set_errors(rules: Any, fragment: str) -> None:
    message = _error(with_key(MINIMAL, "create.set", rules))
    assert fragment in message
    assert "abc123" not in message


def test_a_credential_like_name_may_carry_a_template() -> None:
    rules = {"/metadata/reconciler_key": "{idempotency_key}"}
    assert _load(with_key(MINIMAL, "create.set", rules)).create.set[0].value == "{idempotency_key}"


def test_set_refuses_toml_dates() -> None:
    message = _error(with_key(MINIMAL, "create.set", {"/at": dt.date(2026, 1, 1)}))
    assert 'create.set."/at": TOML dates and times are not JSON values' in message


def test_webhook_url_needs_public_url_and_a_webhook_table() -> None:
    data = with_key(MINIMAL, "create.set", {"/webhook": "{webhook_url}"})
    data["webhook"] = WEBHOOK
    message = _error(data, public_url="")
    assert message.endswith(
        'create.set."/webhook": {webhook_url} needs server.public_url in reconciler.toml: '
        "the address the provider reaches this service at"
    )
    message = _error(with_key(MINIMAL, "create.set", {"/webhook": "{webhook_url}"}))
    assert 'create.set."/webhook": {webhook_url} names /webhooks/p, which needs a [webhook]' in (
        message
    )
    lookup = {**LIST_LOOKUP, "match": {"/webhook": "{webhook_url}"}}
    data = {**MINIMAL, "lookup": lookup, "webhook": WEBHOOK}
    assert 'lookup.match."/webhook": {webhook_url} needs server.public_url' in _error(data, "")
    assert _load(data).lookup is not None
    status = {**MINIMAL["status"], "result_ref": "/out", "errors_ref": "/err"}
    result = {**JSONL_RESULT, "errors_path": "/files/{errors_ref}?notify={webhook_url}"}
    data = {**MINIMAL, "status": status, "result": result, "webhook": WEBHOOK}
    assert "result.errors_path: {webhook_url} needs server.public_url" in _error(data, "")


def test_no_public_url_no_webhook_url() -> None:
    assert _load(MINIMAL, public_url="").webhook_url is None


# --- create.duplicate and lookup over a list ---------------------------------------------------


def test_duplicate_and_list_lookup_parse() -> None:
    lookup = {**LIST_LOOKUP, "pages": 3, "next": "/last_id", "next_param": "after"}
    lookup["has_more"] = "/has_more"
    create = {"duplicate": {"status": [500], "body_contains": "already exists"}}
    data = {**MINIMAL, "lookup": lookup}
    data["create"] = {**MINIMAL["create"], **create}
    spec = _load(data)
    duplicate = spec.create.duplicate
    assert duplicate is not None
    assert (duplicate.status, duplicate.body_contains) == ((500,), "already exists")
    found = spec.lookup
    assert found is not None and found.items is not None
    assert found.items.resolve({"data": [1]}) == [1]
    assert [(p.text, t) for p, t in found.match] == [("/metadata/key", "{idempotency_key}")]
    assert (found.pages, str(found.next), found.next_param, str(found.has_more)) == (
        3,
        "/last_id",
        "after",
        "/has_more",
    )
    whole = _load({**MINIMAL, "lookup": {**LIST_LOOKUP, "items": ""}}).lookup
    assert whole is not None and whole.items is not None and whole.items.tokens == ()


@pytest.mark.parametrize(
    ("lookup", "fragment"),
    [
        ({**LOOKUP, "items": "/data"}, "lookup.match: required with items"),
        ({**LOOKUP, "match": {"/k": "{idempotency_key}"}}, "lookup.items: required with match"),
        ({**LIST_LOOKUP, "match": {}}, "lookup.match: expected a table of pointer = template"),
        ({**LIST_LOOKUP, "match": {"/k": 3}}, 'lookup.match."/k": expected a non-empty string'),
        ({**LIST_LOOKUP, "match": {"k": "x"}}, "lookup.match.k: 'k': a JSON pointer"),
        ({**LIST_LOOKUP, "match": {"/k": "{job_id}"}}, 'lookup.match."/k": only {idempotency_key}'),
        ({**LIST_LOOKUP, "pages": 2}, "lookup.next: following pages needs next and next_param"),
        ({**LIST_LOOKUP, "pages": 0}, "lookup.pages: must be at least 1"),
        ({**LIST_LOOKUP, "next": "/last"}, "lookup.next_param: next and next_param go together"),
        ({**LIST_LOOKUP, "next_param": "after"}, "lookup.next: next and next_param go together"),
        (
            {**LIST_LOOKUP, "next": "/l", "next_param": "a b"},
            "lookup.next_param: expected a query parameter name",
        ),
        ({**LIST_LOOKUP, "has_more": "/more"}, "lookup.has_more: has_more needs next"),
        ({**LIST_LOOKUP, "items": "data"}, "lookup.items: 'data': a JSON pointer"),
        (LOOKUP, "lookup.path: must contain {idempotency_key}: create has no idempotency_header"),
    ],
)
def test_lookup_errors(lookup: dict[str, Any], fragment: str) -> None:
    assert fragment in _error({**MINIMAL, "lookup": lookup})


@pytest.mark.parametrize(
    ("duplicate", "fragment"),
    [
        ({"status": []}, "create.duplicate.status: expected a non-empty list of HTTP status"),
        ({"status": [200]}, "create.duplicate.status: expected HTTP status codes (400 to 599)"),
        ({"status": [True]}, "create.duplicate.status: expected HTTP status codes (400 to 599)"),
        ({"status": [409], "body_contains": ""}, "duplicate.body_contains: expected a non-empty"),
        ({"status": [409], "body": "x"}, "create.duplicate.body: unknown key (known here:"),
        ({"body_contains": "x"}, "create.duplicate.status: required"),
    ],
)
def test_duplicate_errors(duplicate: dict[str, Any], fragment: str) -> None:
    data = {**MINIMAL, "lookup": LIST_LOOKUP}
    assert fragment in _error(with_key(data, "create.duplicate", duplicate))


def test_duplicate_needs_a_lookup() -> None:
    message = _error(with_key(MINIMAL, "create.duplicate", {"status": [409]}))
    assert message.endswith(
        "create.duplicate: needs a [lookup] table: a duplicate answer is settled by looking the "
        "job up"
    )


# --- static headers -----------------------------------------------------------------------


def test_static_headers_parse_in_order() -> None:
    headers = {"anthropic-version": "2023-06-01", "X-GitHub-Api-Version": "2022-11-28"}
    assert _load({**MINIMAL, "headers": headers}).headers == tuple(headers.items())


@pytest.mark.parametrize(
    ("headers", "fragment"),
    [
        (
            {"Authorization": "Bearer sk-abc123"},
            "headers.Authorization: headers in a provider file are never",
        ),
        (
            {"x-api-key": "abc123"},
            "headers.x-api-key: headers in a provider file are never secrets",
        ),
        ({"Cookie": "s=abc123"}, "headers.Cookie: headers in a provider file are never secrets"),
        (
            {"Proxy-Authorization": "abc123"},
            "headers.Proxy-Authorization: headers in a provider file",
        ),
        (
            {"X-Goog-Session": "abc123"},
            "headers.X-Goog-Session: headers in a provider file are never",
        ),
        ({"X-Auth-Token": "abc123"}, "headers.X-Auth-Token: headers in a provider file are never"),
        (
            {"X-Upstream": "Bearer abc123"},
            "headers.X-Upstream: headers in a provider file are never",
        ),
        ({"a b": "1"}, 'headers."a b": is not a valid HTTP header name'),
        ({"v": 1}, "headers.v: expected a string of printable characters"),
        ({"v": "a\r\nX-Evil: 1"}, "headers.v: expected a string of printable characters"),
        ({"V": "1", "v": "2"}, "headers.v: given twice (header names ignore case)"),
        ("v: 1", "headers: expected a table of header = value"),
        ({"x-trace-id": "1"}, "headers.x-trace-id: is sent by the service (trace_header)"),
    ],
)
def test_header_errors(headers: Any, fragment: str) -> None:
    message = _error({**MINIMAL, "headers": headers})
    assert fragment in message
    assert "abc123" not in message


def test_a_header_may_not_shadow_the_idempotency_header() -> None:
    data = with_key(MINIMAL, "create.idempotency", MISSING)
    data["create"]["idempotency_header"] = "X-Dedupe"
    message = _error({**data, "headers": {"x-dedupe": "x"}})
    assert "headers.x-dedupe: is sent by the service (create.idempotency_header)" in message


# --- polling.rate_limit_reset ---------------------------------------------------------------


def test_rate_limit_reset_names_a_lower_case_header() -> None:
    spec = _load(with_key(MINIMAL, "polling.rate_limit_reset", "header:X-RateLimit-Reset"))
    assert spec.polling.rate_limit_reset == "x-ratelimit-reset"
    assert _load(MINIMAL).polling.rate_limit_reset is None


@pytest.mark.parametrize("value", ["x-ratelimit-reset", "header:", "header:bad name", "/reset", 5])
def test_rate_limit_reset_errors(value: Any) -> None:
    message = _error(with_key(MINIMAL, "polling.rate_limit_reset", value))
    assert "polling.rate_limit_reset: expected" in message


# --- webhook.types and event_type -----------------------------------------------------------


@pytest.mark.parametrize(
    ("scheme", "extra", "event_type"),
    [
        ("standard-webhooks", {}, "/type"),
        ("stripe", {}, "/type"),
        ("github", {}, "header:x-github-event"),
        ("hmac-sha256", {"event_id": "/id"}, None),
        ("hmac-sha256", {"event_id": "/id", "event_type": "header:X-Kind"}, "header:x-kind"),
    ],
)
def test_event_type_defaults_per_scheme(
    scheme: str, extra: dict[str, Any], event_type: str | None
) -> None:
    webhook = {"scheme": scheme, "secrets_env": "W", "job_id": "/j", **extra}
    spec = _load({**MINIMAL, "webhook": webhook})
    assert spec.webhook is not None and spec.webhook.types == ()
    assert spec.webhook.scheme is WebhookScheme(scheme)
    found = spec.webhook.event_type
    assert (None if found is None else str(found)) == event_type


def test_webhook_types_parse() -> None:
    webhook = {**WEBHOOK, "types": ["batch.completed", "batch.failed"]}
    spec = _load({**MINIMAL, "webhook": webhook})
    assert spec.webhook is not None
    assert spec.webhook.types == ("batch.completed", "batch.failed")
    assert spec.webhook.event_type is not None
    assert spec.webhook.event_type.extract({}, {"type": "batch.failed"}) == "batch.failed"


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ({"types": "batch.completed"}, "webhook.types: expected a list of event types"),
        ({"types": ["a", "a"]}, "webhook.types: lists an event type twice"),
        ({"types": [""]}, "webhook.types[0]: expected a non-empty string"),
        ({"types": [3]}, "webhook.types[0]: expected a non-empty string"),
        ({"event_type": "header:"}, "webhook.event_type: is not a valid header name"),
        ({"event_type": "type"}, "webhook.event_type: 'type': a JSON pointer"),
        (
            {"scheme": "hmac-sha256", "event_id": "/id", "types": ["done"]},
            "webhook.event_type: types need event_type",
        ),
    ],
)
def test_webhook_type_errors(extra: dict[str, Any], fragment: str) -> None:
    assert fragment in _error({**MINIMAL, "webhook": {**WEBHOOK, **extra}})


# --- JSONL results and status.errors_ref ----------------------------------------------------


def test_jsonl_result_keys_parse() -> None:
    result = {
        **JSONL_RESULT,
        "failed_lines": [
            {"pointer": "/error", "present": True},
            {"pointer": "/response/status_code", "in": [400, 500]},
            {"pointer": "/result/type", "equals": "errored"},
        ],
        "errors_path": "/files/{errors_ref}/content",
    }
    status = {**MINIMAL["status"], "result_ref": "/output_file_id", "errors_ref": "/error_file_id"}
    spec = _load({**MINIMAL, "status": status, "result": result})
    found = spec.result
    assert found is not None and found.jsonl and found.content_type == "application/jsonl"
    assert found.errors_path == "/files/{errors_ref}/content"
    assert str(spec.status.errors_ref) == "/error_file_id"
    present, among, equal = found.failed_lines
    assert present == LineTest.model_validate({"pointer": "/error", "present": True})
    assert present.matches({"error": {"code": "x"}}) and not present.matches({"error": None})
    assert among.in_ == (400, 500) and among.matches({"response": {"status_code": 500}})
    assert not among.matches({"response": {"status_code": 200}})
    assert equal.matches({"result": {"type": "errored"}}) and not equal.matches({})


@pytest.mark.parametrize(
    ("result", "fragment"),
    [
        (
            {"path": "/r/{job_id}", "failed_lines": [{"pointer": "/e", "present": True}]},
            'result.failed_lines: applies to content_type = "application/jsonl"',
        ),
        (
            {"path": "/r/{job_id}", "errors_path": "/e/{job_id}"},
            'result.errors_path: applies to content_type = "application/jsonl"',
        ),
        (
            {**JSONL_RESULT, "failed_lines": {"pointer": "/e"}},
            "result.failed_lines: expected a list of inline tables",
        ),
        (
            {**JSONL_RESULT, "failed_lines": [{"pointer": "/e"}]},
            "result.failed_lines[0]: give exactly one of present, equals, in",
        ),
        (
            {**JSONL_RESULT, "failed_lines": [{"pointer": "/e", "present": True, "equals": 1}]},
            "result.failed_lines[0]: give exactly one of present, equals, in",
        ),
        (
            {**JSONL_RESULT, "failed_lines": [{"pointer": "/e", "equals": [1]}]},
            "result.failed_lines[0].equals: expected a string, number or boolean",
        ),
        (
            {**JSONL_RESULT, "failed_lines": [{"pointer": "/e", "in": []}]},
            "result.failed_lines[0].in: expected a non-empty list",
        ),
        (
            {**JSONL_RESULT, "failed_lines": [{"pointer": "e", "present": True}]},
            "result.failed_lines[0].pointer: 'e': a JSON pointer",
        ),
        (
            {**JSONL_RESULT, "failed_lines": [{"pointer": "/e", "present": 1}]},
            "result.failed_lines[0].present: expected true or false",
        ),
        (
            {**JSONL_RESULT, "failed_lines": [{"pointer": "/e", "present": True, "category": 1}]},
            "result.failed_lines[0].category: unknown key (known here: equals, in, pointer",
        ),
        (
            {**JSONL_RESULT, "errors_path": "/files/{errors_ref}"},
            "result.errors_path: {errors_ref} needs status.errors_ref",
        ),
        (
            {**JSONL_RESULT, "errors_path": "/files/{error_id}"},
            "result.errors_path: only {errors_ref}, {idempotency_key}, {idempotency_key_alnum}, ",
        ),
        ({**JSONL_RESULT, "content_type": ""}, "result.content_type: expected a non-empty string"),
    ],
)
def test_jsonl_result_errors(result: dict[str, Any], fragment: str) -> None:
    status = {**MINIMAL["status"], "result_ref": "/output_file_id"}
    assert fragment in _error({**MINIMAL, "status": status, "result": result})


def test_errors_ref_is_a_pointer() -> None:
    message = _error(with_key(MINIMAL, "status.errors_ref", "error_file_id"))
    assert "status.errors_ref: 'error_file_id': a JSON pointer is empty or starts with '/'" in (
        message
    )


def test_name_source_and_webhook_url_cannot_be_written_in_a_file() -> None:
    for key in ("name", "source", "webhook_url"):
        assert f"providers.p.{key}: unknown key (known here: " in _error({**MINIMAL, key: "x"})


def test_a_pasted_secret_is_reported_before_other_problems() -> None:
    data = {**MINIMAL, "base_url": "ftp://x", "auth": {"type": "bearer", "token": "sk-abc123"}}
    message = _error(data)
    assert "providers.p.auth.token: secrets may not be written in provider files" in message
    assert "abc123" not in message


def test_specs_are_frozen() -> None:
    spec = _load(MINIMAL)
    with pytest.raises(ValueError, match="frozen"):
        spec.create.path = "/elsewhere"  # type: ignore[misc]


FULL: dict[str, Any] = {
    "base_url": "https://api.example.com",
    "description": "Example.",
    "auth": {"type": "bearer", "token_env": "T"},
    "trace_header": "X-Trace-ID",
    "job_id_slashes": True,
    "headers": {"example-version": "1"},
    "http": {"max_connections": 2, "request_id_header": "x-request-id"},
    "create": {
        "path": "/jobs",
        "job_id": "/id",
        "idempotency": "body",
        "set": {"/key": "{idempotency_key}", "/hook": "{webhook_url}"},
        "duplicate": {"status": [409], "body_contains": "exists"},
    },
    "lookup": {
        **LIST_LOOKUP,
        "pages": 2,
        "next": "/last",
        "next_param": "after",
        "has_more": "/more",
    },
    "status": {
        "path": "/jobs/{job_id}",
        "state": "/status",
        "result_ref": "/out",
        "errors_ref": "/err",
        "rules": [{"pointer": "/done", "present": False, "category": "pending"}],
        "required": ["/id"],
    },
    "states": {"pending": ["running"], "success": ["done"]},
    "cancel": {"path": "/jobs/{job_id}/cancel"},
    "result": {
        **JSONL_RESULT,
        "failed_lines": [{"pointer": "/error", "present": True}],
        "errors_path": "/files/{errors_ref}",
        "summary": {"n": "status:/count"},
    },
    "webhook": {**WEBHOOK, "types": ["job.done"]},
    "polling": {"rate_limit_reset": "header:x-ratelimit-reset", "webhook_trust": "adaptive"},
    "request_schema": {"type": "object"},
}
GARBAGE: list[Any] = [1, -1, 0.5, float("nan"), True, "", "x", "/x", [], [1], {}, {"a": 1}]


def _leaves(table: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found: list[tuple[str, ...]] = []
    for key, value in table.items():
        found.append((*prefix, key))
        if isinstance(value, dict):
            found.extend(_leaves(value, (*prefix, key)))
    return found


def test_any_value_anywhere_is_a_spec_or_one_line_never_a_crash() -> None:
    assert _load(FULL).create.duplicate is not None
    for path in _leaves(FULL):
        for value in GARBAGE:
            data = copy.deepcopy(FULL)
            target = data
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = value
            try:
                _load(data)
            except ConfigError as exc:
                assert "\n" not in exc.message and exc.message.startswith(INLINE_SOURCE), path


# --- every call's body and headers --------------------------------------------------------


def test_every_call_takes_a_body_and_headers_that_may_name_the_job() -> None:
    aws_read = {
        "method": "POST",
        "path": "/",
        "headers": {"X-Amz-Target": "Transcribe.GetTranscriptionJob"},
        "set": {"/TranscriptionJobName": "{job_id}"},
        "state": "/TranscriptionJob/TranscriptionJobStatus",
        "not_found": {"status": [400], "body_contains": "NotFoundException"},
    }
    cancel = {
        "path": "/runs/set_state",
        "set": {"/run_id": "{job_id}", "/state/type": "CANCELLING"},
    }
    spec = _load({**MINIMAL, "status": aws_read, "cancel": cancel})
    assert [r.pointer.text for r in spec.status.set] == ["/TranscriptionJobName"]
    assert spec.status.headers == (("X-Amz-Target", "Transcribe.GetTranscriptionJob"),)
    assert spec.status.not_found is not None and spec.status.not_found.status == (400,)
    assert spec.cancel is not None and len(spec.cancel.set) == 2


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        (
            {"status": {"path": "/", "state": "/s"}},
            "status.path: must contain {job_id} (or send it in this call's set or headers)",
        ),
        (
            {"status": {"path": "/j/{job_id}", "state": "/s", "set": {"/x": "{result_ref}"}}},
            'status.set."/x": only {idempotency_key}, {idempotency_key_alnum}, {job_id}',
        ),
        (
            {"create": {**MINIMAL["create"], "headers": {"X-Run": "{job_id}"}}},
            "create.headers.X-Run: only {idempotency_key}, {idempotency_key_alnum}, {operation_id}",
        ),
        (
            {"status": {**MINIMAL["status"], "headers": {"X-Api-Key": "{job_id}"}}},
            "status.headers.X-Api-Key: headers in a provider file are never secrets",
        ),
        (
            {"status": {**MINIMAL["status"], "headers": {"X-Trace-ID": "x"}}},
            "status.headers.X-Trace-ID: is sent by the service (trace_header)",
        ),
        (
            {"status": {**MINIMAL["status"], "set": {"": "x"}}},
            'status.set."": the whole document cannot be set',
        ),
        (
            {"cancel": {"path": "/c/{job_id}", "refused": {"status": [100]}}},
            "cancel.refused.status: expected HTTP status codes (200 to 599)",
        ),
        (
            {"status": {**MINIMAL["status"], "not_found": {"status": [200]}}},
            "status.not_found.status: expected HTTP status codes (400 to 599)",
        ),
    ],
)
def test_call_shape_errors(changes: dict[str, Any], fragment: str) -> None:
    assert fragment in _error({**MINIMAL, **changes})


def test_a_lookup_pages_with_a_cursor_in_the_body() -> None:
    lookup = {
        **LIST_LOOKUP,
        "method": "POST",
        "set": {"/limit": 200},
        "pages": 5,
        "next": "/next_offset",
        "next_in": "body",
        "next_param": "/offset",
    }
    found = _load({**MINIMAL, "lookup": lookup}).lookup
    assert found is not None and found.page_pointer is not None
    assert found.page_pointer.tokens == ("offset",)
    bad = {**lookup, "next_param": "offset"}
    assert "lookup.next_param: 'offset': a JSON pointer" in _error({**MINIMAL, "lookup": bad})
    query = {**lookup, "next_in": "query"}
    assert "lookup.next_param: expected a query parameter" in _error({**MINIMAL, "lookup": query})


@pytest.mark.parametrize(
    ("duplicate", "fine"),
    [
        ({"status": [400]}, False),
        ({"status": [409, 422]}, False),
        ({"status": [400], "body_contains": "already exists"}, True),
        ({"status": [409]}, True),
        ({"status": [500]}, True),
    ],
)
def test_a_duplicate_rule_never_reads_a_plain_refusal_as_a_made_job(
    duplicate: dict[str, Any], fine: bool
) -> None:
    data = with_key({**MINIMAL, "lookup": LIST_LOOKUP}, "create.duplicate", duplicate)
    if fine:
        assert _load(data).create.duplicate is not None
    else:
        assert "create.duplicate: HTTP 4" in _error(data)
        assert "add body_contains" in _error(data)


# --- credentials that refresh ------------------------------------------------------------


def test_the_cloud_auth_types_take_their_keys() -> None:
    aws = _load(
        {**MINIMAL, "auth": {"type": "aws_sigv4", "service": "states", "region": "eu-west-1"}}
    )
    assert (aws.auth.service, aws.auth.region) == ("states", "eu-west-1")
    google = _load({**MINIMAL, "auth": {"type": "google"}})
    assert google.auth.google_scopes == ("https://www.googleapis.com/auth/cloud-platform",)
    oauth2 = {
        "type": "oauth2",
        "token_url": "https://login.example/token",
        "client_id_env": "ID",
        "client_secret_env": "SECRET",
        "scope": "jobs.read jobs.write",
    }
    assert _load({**MINIMAL, "auth": oauth2}).auth.scope == "jobs.read jobs.write"
    filed = _load({**MINIMAL, "auth": {"type": "bearer", "token_file": "/var/run/token"}})
    assert filed.auth.token_file == "/var/run/token" and filed.auth.env_key is None


@pytest.mark.parametrize(
    ("auth", "fragment"),
    [
        ({"type": "aws_sigv4", "region": "us-east-1"}, "auth.service: required (the signing name"),
        ({"type": "aws_sigv4", "service": "states"}, "auth.region: required (the AWS region"),
        (
            {"type": "aws_sigv4", "service": "states", "region": "mars"},
            'auth.region: expected an AWS region such as "us-east-1"',
        ),
        ({"type": "google", "scopes": []}, "auth.scopes: expected a non-empty list of scope URLs"),
        ({"type": "google", "token_env": "T"}, 'auth.token_env: unknown key for type "google"'),
        (
            {"type": "oauth2", "token_url": "https://l.example/t", "client_id_env": "I"},
            "auth.client_secret_env: required (the name of an environment variable)",
        ),
        (
            {
                "type": "oauth2",
                "token_url": "ftp://x",
                "client_id_env": "I",
                "client_secret_env": "S",
            },
            "auth.token_url: must be an http:// or https:// URL",
        ),
        (
            {"type": "bearer", "token_env": "T", "token_file": "/t"},
            "auth.token_file: give one of token_env or token_file, not both",
        ),
        ({"type": "bearer", "token_file": "token"}, "auth.token_file: expected an absolute path"),
        (
            {"type": "header", "name": "x-api-key"},
            "auth.value_env: required (the name of an environment variable, or token_file",
        ),
        ({"type": "oauth2", "client_secret": "s3cr3t"}, "auth.client_secret: secrets may not"),
    ],
)
def test_auth_type_errors(auth: dict[str, Any], fragment: str) -> None:
    assert fragment in _error({**MINIMAL, "auth": auth})


def test_a_cloud_auth_without_its_extra_fails_at_load_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from reconciler.providers import credentials

    real = credentials.importlib.util.find_spec
    monkeypatch.setattr(
        credentials.importlib.util,
        "find_spec",
        lambda name, *a: None if name.startswith(("botocore", "google")) else real(name, *a),
    )
    aws = {**MINIMAL, "auth": {"type": "aws_sigv4", "service": "batch", "region": "us-east-1"}}
    with pytest.raises(ConfigError) as caught:
        load_providers(None, {"p": aws}, {})
    assert caught.value.message == (
        f'{INLINE_SOURCE}: providers.p.auth.type: "aws_sigv4" needs the optional extra '
        "reconciler[aws] (pip install 'reconciler[aws]')"
    )
    google = {**MINIMAL, "auth": {"type": "google"}}
    with pytest.raises(ConfigError, match=r"reconciler\[google\]"):
        load_providers(None, {"p": google}, {})


def test_an_oauth2_client_whose_variables_are_unset_fails_at_load() -> None:
    oauth2 = {
        "type": "oauth2",
        "token_url": "https://login.example/token",
        "client_id_env": "RUNS_CLIENT_ID",
        "client_secret_env": "RUNS_CLIENT_SECRET",
    }
    with pytest.raises(ConfigError) as caught:
        load_providers(None, {"p": {**MINIMAL, "auth": oauth2}}, {"RUNS_CLIENT_ID": "id"})
    assert caught.value.message.endswith(
        "providers.p.auth.client_secret_env: environment variable RUNS_CLIENT_SECRET is not set"
    )
