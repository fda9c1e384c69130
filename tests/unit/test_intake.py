"""Agent input validation: typed requests out, or one InvalidRequest that says what to fix."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reconciler.commands.validation import parse_cancel, parse_create
from reconciler.core.errors import InvalidRequest
from reconciler.core.operator_decision import DecisionRequest
from reconciler.core.vocabulary import DecisionAction
from reconciler.wire import (
    MAX_CANCEL_REASON,
    MAX_KEY_LENGTH,
    MAX_METADATA_BYTES,
    CancelOperation,
    CreateOperation,
    parse_decision,
)

PROVIDERS = {"sim": object(), "acme": object()}


class Refused(InvalidRequest):
    pass


def no_check(url: str) -> None:
    return None


def refuse(url: str) -> None:
    raise Refused(f"callback_url {url} refused")


def create(body: Any, check: Any = no_check) -> CreateOperation:
    return parse_create(body, PROVIDERS, check)


def base(**fields: Any) -> dict[str, Any]:
    return {"provider": "sim", "request": {"report": "q3"}, **fields}


# --- parse_create -------------------------------------------------------------------------


def test_minimal_create() -> None:
    assert create(base()) == CreateOperation(
        provider="sim",
        request={"report": "q3"},
        idempotency_key=None,
        callback_url=None,
        deadline_seconds=None,
        max_status_requests=None,
        metadata=None,
    )


def test_full_create_and_the_callback_check_sees_the_url() -> None:
    seen: list[str] = []
    body = base(
        idempotency_key="idem-1",
        callback_url="https://agent.example/hook",
        deadline_seconds=600,
        max_status_requests=12.0,
        metadata={"ticket": "T-1", "nested": {"a": [1, 2]}},
    )
    req = parse_create(body, PROVIDERS, seen.append)
    assert seen == ["https://agent.example/hook"]
    assert req.idempotency_key == "idem-1"
    assert req.callback_url == "https://agent.example/hook"
    assert req.deadline_seconds == 600.0 and isinstance(req.deadline_seconds, float)
    assert req.max_status_requests == 12 and isinstance(req.max_status_requests, int)
    assert req.metadata == {"ticket": "T-1", "nested": {"a": [1, 2]}}


def test_null_optional_fields_count_as_absent() -> None:
    req = create(
        base(
            idempotency_key=None,
            callback_url=None,
            deadline_seconds=None,
            max_status_requests=None,
            metadata=None,
        )
    )
    assert req == create(base())


def test_the_request_is_a_copy() -> None:
    inner = {"report": "q3"}
    req = create({"provider": "sim", "request": inner})
    inner["report"] = "changed"
    assert req.request == {"report": "q3"}


def test_limits_at_the_edge_are_accepted() -> None:
    req = create(base(idempotency_key="k" * MAX_KEY_LENGTH))
    assert req.idempotency_key == "k" * MAX_KEY_LENGTH
    # canonical JSON of {"b": "..."} is 8 bytes plus the string
    metadata = {"b": "x" * (MAX_METADATA_BYTES - 8)}
    assert create(base(metadata=metadata)).metadata == metadata


CREATE_ERRORS: list[tuple[str, Any, str]] = [
    ("body null", None, "the request body must be a JSON object, got null"),
    ("body array", [base()], "the request body must be a JSON object, got an array"),
    ("body string", "sim", "the request body must be a JSON object, got a string"),
    ("body number", 3, "the request body must be a JSON object, got a number"),
    ("body boolean", True, "the request body must be a JSON object, got a boolean"),
    (
        "unknown fields",
        base(zeta=1, alpha=2),
        "unknown field(s): alpha, zeta; allowed: callback_url, deadline_seconds, "
        "idempotency_key, max_status_requests, metadata, provider, request",
    ),
    ("provider missing", {"request": {}}, "'provider' is required"),
    ("provider null", {"provider": None, "request": {}}, "'provider' is required"),
    (
        "provider number",
        {"provider": 5, "request": {}},
        "'provider' must be a string, got a number",
    ),
    (
        "provider object",
        {"provider": {}, "request": {}},
        "'provider' must be a string, got an object",
    ),
    ("provider blank", {"provider": "  ", "request": {}}, "'provider' must not be empty"),
    ("provider long", {"provider": "p" * 101, "request": {}}, "'provider' must be at most 100"),
    (
        "provider unknown",
        {"provider": "zeta", "request": {}},
        "unknown provider 'zeta'; known providers: acme, sim",
    ),
    (
        "request missing",
        {"provider": "sim"},
        "'request' is required: the JSON body of the provider's create call",
    ),
    ("request null", base(request=None), "'request' must be a JSON object, got null"),
    ("request array", base(request=[1]), "'request' must be a JSON object, got an array"),
    ("key number", base(idempotency_key=7), "'idempotency_key' must be a string, got a number"),
    ("key empty", base(idempotency_key=""), "'idempotency_key' must not be empty"),
    ("key blank", base(idempotency_key=" \t"), "'idempotency_key' must not be empty"),
    (
        "key long",
        base(idempotency_key="k" * (MAX_KEY_LENGTH + 1)),
        f"'idempotency_key' must be at most {MAX_KEY_LENGTH} characters",
    ),
    ("callback number", base(callback_url=1), "'callback_url' must be a string, got a number"),
    ("callback empty", base(callback_url=""), "'callback_url' must not be empty"),
    (
        "callback long",
        base(callback_url="https://a.example/" + "p" * 2040),
        "'callback_url' must be at most 2048 characters",
    ),
    ("deadline zero", base(deadline_seconds=0), "'deadline_seconds' must be greater than 0"),
    ("deadline negative", base(deadline_seconds=-1.5), "'deadline_seconds' must be greater than 0"),
    (
        "deadline infinite",
        base(deadline_seconds=float("inf")),
        "'deadline_seconds' must be greater than 0",
    ),
    (
        "deadline string",
        base(deadline_seconds="60"),
        "'deadline_seconds' must be a number, got a string",
    ),
    (
        "deadline boolean",
        base(deadline_seconds=True),
        "'deadline_seconds' must be a number, got a boolean",
    ),
    ("budget zero", base(max_status_requests=0), "'max_status_requests' must be greater than 0"),
    (
        "budget negative",
        base(max_status_requests=-3),
        "'max_status_requests' must be greater than 0",
    ),
    ("budget fraction", base(max_status_requests=2.5), "'max_status_requests' must be a whole"),
    (
        "budget string",
        base(max_status_requests="12"),
        "'max_status_requests' must be a number, got a string",
    ),
    ("metadata string", base(metadata="x"), "'metadata' must be a JSON object, got a string"),
    ("metadata array", base(metadata=[]), "'metadata' must be a JSON object, got an array"),
    (
        "metadata big",
        base(metadata={"b": "x" * (MAX_METADATA_BYTES - 7)}),
        f"'metadata' must be at most {MAX_METADATA_BYTES} bytes as JSON",
    ),
]


@pytest.mark.parametrize(
    ("case", "body", "message"), CREATE_ERRORS, ids=[c[0] for c in CREATE_ERRORS]
)
def test_create_errors_say_what_to_fix(case: str, body: Any, message: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        create(body)
    assert message in caught.value.message
    assert str(caught.value) == caught.value.message


def test_a_refused_callback_url_is_an_invalid_request() -> None:
    with pytest.raises(Refused, match="callback_url http://10.0.0.1/ refused"):
        create(base(callback_url="http://10.0.0.1/"), refuse)


def test_the_callback_is_not_checked_when_absent() -> None:
    assert create(base(), refuse).callback_url is None


def test_no_provider_configured_is_said_plainly() -> None:
    with pytest.raises(InvalidRequest, match="known providers: none configured"):
        parse_create(base(), {}, no_check)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
field_names = st.sampled_from(
    [
        "provider",
        "request",
        "idempotency_key",
        "callback_url",
        "deadline_seconds",
        "max_status_requests",
        "metadata",
    ]
)


@given(st.dictionaries(field_names, json_values) | json_values)
def test_any_json_value_is_either_parsed_or_refused_with_invalid_request(body: Any) -> None:
    try:
        req = create(body)
    except InvalidRequest as exc:
        assert exc.message
        return
    assert req.provider in PROVIDERS
    assert isinstance(req.request, dict)


# --- parse_cancel -------------------------------------------------------------------------


def test_cancel_without_a_body_or_with_a_reason() -> None:
    assert parse_cancel(None) == CancelOperation(reason=None)
    assert parse_cancel({}) == CancelOperation(reason=None)
    assert parse_cancel({"reason": "customer withdrew"}) == CancelOperation(
        reason="customer withdrew"
    )
    long_enough = "r" * MAX_CANCEL_REASON
    assert parse_cancel({"reason": long_enough}).reason == long_enough


CANCEL_ERRORS: list[tuple[Any, str]] = [
    ([], "the request body must be a JSON object, got an array"),
    ("stop", "the request body must be a JSON object, got a string"),
    ({"reason": "x", "force": True}, "unknown field(s): force; allowed: reason"),
    ({"reason": 5}, "'reason' must be a string, got a number"),
    ({"reason": ""}, "'reason' must not be empty"),
    ({"reason": "r" * (MAX_CANCEL_REASON + 1)}, f"'reason' must be at most {MAX_CANCEL_REASON}"),
]


@pytest.mark.parametrize(("body", "message"), CANCEL_ERRORS)
def test_cancel_errors_say_what_to_fix(body: Any, message: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_cancel(body)
    assert message in caught.value.message


# --- parse_decision -----------------------------------------------------------------------


def test_decisions() -> None:
    assert parse_decision({"action": "cancel"}) == DecisionRequest(
        DecisionAction.CANCEL, None, None
    )
    assert parse_decision({"action": "abandon"}) == DecisionRequest(
        DecisionAction.ABANDON, None, None
    )
    assert parse_decision({"action": "extend"}) == DecisionRequest(
        DecisionAction.EXTEND, None, None
    )
    extend = parse_decision({"action": "extend", "extra_seconds": 600, "extra_status_requests": 6})
    assert extend == DecisionRequest(DecisionAction.EXTEND, 600.0, 6)
    assert isinstance(extend.extra_seconds, float)
    assert isinstance(extend.extra_status_requests, int)
    whole = parse_decision({"action": "extend", "extra_status_requests": 4.0})
    assert whole.extra_status_requests == 4 and isinstance(whole.extra_status_requests, int)


DECISION_ERRORS: list[tuple[Any, str]] = [
    (None, "the request body must be a JSON object, got null"),
    ([{"action": "cancel"}], "the request body must be a JSON object, got an array"),
    ({}, "'action' is required"),
    ({"action": 1}, "'action' must be a string, got a number"),
    ({"action": ""}, "'action' must not be empty"),
    ({"action": "again"}, "'action' must be one of: extend, cancel, abandon, resend, retry"),
    ({"action": "cancel", "why": "x"}, "unknown field(s): why; allowed: action, extra_seconds"),
    ({"action": "extend", "extra_seconds": -1}, "'extra_seconds' must be greater than 0"),
    ({"action": "extend", "extra_seconds": "60"}, "'extra_seconds' must be a number, got a string"),
    (
        {"action": "extend", "extra_status_requests": 1.5},
        "'extra_status_requests' must be a whole number",
    ),
    (
        {"action": "cancel", "extra_seconds": 60},
        "'extra_seconds' and 'extra_status_requests' apply only to 'extend'",
    ),
    (
        {"action": "abandon", "extra_status_requests": 2},
        "'extra_seconds' and 'extra_status_requests' apply only to 'extend'",
    ),
]


@pytest.mark.parametrize(("body", "message"), DECISION_ERRORS)
def test_decision_errors_say_what_to_fix(body: Any, message: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_decision(body)
    assert message in caught.value.message
