"""``error`` and ``progress`` in one shape each, whatever the provider's API words them as."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reconciler.core.create import Rejected, body_text
from reconciler.core.outcome_parts import (
    MAX_PROVIDER_MESSAGE,
    error_view,
    progress_view,
    provider_message,
)
from reconciler.wire.answers import OperationError, Progress

# The error bodies of the APIs the presets follow (shapes from their references).
BODIES = [
    ({"error": {"message": "Invalid file id", "type": "invalid_request_error"}}, "Invalid file id"),
    ({"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}, "bad"),
    ({"message": "Not Found", "documentation_url": "https://docs.github.com"}, "Not Found"),
    ({"detail": "Invalid version or not permitted", "status": 422}, "Invalid version or"),
    ({"detail": [{"loc": ["body", "input"], "msg": "field required"}]}, "field required"),
    ({"error": {"code": 400, "message": "Invalid JSON", "status": "INVALID_ARGUMENT"}}, "Invalid"),
    ({"object": "list", "data": [{"code": "x", "message": "line 3 bad", "line": 3}]}, "line 3"),
    ({"error": {"code": "job_failed", "message": "Processing failed"}}, "Processing failed"),
    ({"error": "no such scenario"}, "no such scenario"),
    ("Bad Request\n\nscenario", "Bad Request scenario"),
    ({"code": 3}, None),
    (None, None),
]


@pytest.mark.parametrize(("body", "said"), BODIES)
def test_the_providers_own_words_are_found_where_its_api_puts_them(
    body: Any, said: str | None
) -> None:
    found = provider_message(body)
    if said is None:
        assert found is None
    else:
        assert found is not None and found.startswith(said)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=20,
)


@given(stored=_json)
def test_any_stored_error_reads_as_the_one_shape(stored: Any) -> None:
    view = error_view(stored)
    if stored is None:
        assert view is None
        return
    assert view is not None
    OperationError.model_validate(view)  # the output schema's shape, whatever was stored
    assert "\n" not in view["message"]


@given(stored=st.dictionaries(st.sampled_from(["code", "message", "provider_error"]), _json))
def test_a_stored_error_keeps_everything_but_its_own_fields_in_detail(
    stored: dict[str, Any],
) -> None:
    view = error_view(stored)
    assert view is not None
    rest = {k: v for k, v in stored.items() if k not in ("code", "message")}
    assert view["detail"] == (rest or None)


@given(body=_json)
def test_a_provider_message_is_one_short_line(body: Any) -> None:
    said = provider_message(body)
    assert said is None or (
        "\n" not in said and 0 < len(said) <= MAX_PROVIDER_MESSAGE and said.isprintable()
    )


@given(stored=_json)
def test_progress_has_numbers_or_nothing(stored: Any) -> None:
    view = progress_view(stored)
    if stored is None:
        assert view is None
        return
    assert view is not None
    Progress.model_validate(view)
    assert view["detail"] == stored


def test_stored_errors_of_every_kind_read_plainly() -> None:
    failed = error_view(
        {
            "code": "provider_failed",
            "remote_state": "failed",
            "provider_error": {"code": "job_failed", "message": "input unreadable"},
        }
    )
    assert failed is not None
    assert failed["message"] == (
        "the provider reports the job failed (its state: failed): input unreadable"
    )
    assert failed["provider_message"] == "input unreadable" and failed["http_status"] is None
    unavailable = error_view(
        {"code": "result_unavailable", "detail": {"http_status": 503}, "attempts": 3}
    )
    assert unavailable is not None and unavailable["http_status"] == 503
    assert unavailable["message"] == "the result could not be fetched (3 attempts; last: HTTP 503)"
    invalid = error_view({"code": "result_invalid", "problems": ["missing /rows"]})
    assert invalid is not None and invalid["message"].endswith("missing /rows")
    abandoned = error_view({"code": "abandoned_deadline_exceeded", "message": "an operator..."})
    assert abandoned is not None and abandoned["message"] == "an operator..."


def test_a_refused_create_is_request_rejected_and_a_refused_credential_is_not() -> None:
    body = {"error": {"message": "scenario must be one of success, ..."}}
    refused = Rejected(422, body).error_record("create")
    assert refused == {
        "code": "request_rejected",
        "http_status": 422,
        "provider_message": "scenario must be one of success, ...",
        "provider_error": body,
    }
    assert Rejected(404, body).error_record("lookup")["code"] == "lookup_rejected"
    assert Rejected(401, None).error_record("create")["code"] == "authorization_denied"
    assert Rejected(403, None).error_record("create")["code"] == "authorization_denied"


def test_an_error_body_that_is_not_json_is_kept_as_one_clipped_line() -> None:
    assert body_text(b"Bad Request:\x00 scenario\r\nunknown") == "Bad Request: scenario unknown"
    assert body_text(b"\xff\xfe") == "\ufffd\ufffd"
    long = body_text(b"x" * 5000)
    assert long is not None and len(long) == 1000
    assert body_text(b"") is None and body_text(None) is None
