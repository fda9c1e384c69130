"""Provider text at intake (``unstorable_in``) and at every door (``visible``), as values.

A NUL or a lone surrogate anywhere in what an answer says is found, with where and the
value escaped; a clean answer is passed whatever it holds (astral characters written
as surrogate pairs included). ``visible`` makes any stored value encodable and leaves a
clean one untouched (the same object).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from reconciler.core.provider_calls import CallResult, unstorable_in
from reconciler.core.strict_json import escaped, is_storable, visible

NOW = datetime(2026, 12, 1, tzinfo=UTC)
# Every code point, surrogates included (hypothesis leaves them out unless asked).
any_char = st.characters(min_codepoint=0, max_codepoint=0x10FFFF, exclude_categories=())
any_text = st.text(any_char, max_size=12)
clean_text = st.text(max_size=12).filter(is_storable)
BAD = ["\x00", "\ud800", "\udfff", "a\x00b", "x\udc00"]


def json_values(text: st.SearchStrategy[str]) -> st.SearchStrategy[Any]:
    return st.recursive(
        st.none() | st.booleans() | st.integers() | text,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
        max_leaves=12,
    )


def answered(body: Any) -> CallResult:
    """A call whose body was parsed from the bytes a provider sent (``json.dumps`` writes
    NUL and surrogates as escapes, as any JSON encoder must)."""
    return CallResult(
        "GET",
        "/v1/jobs/1",
        NOW,
        1.0,
        http_status=200,
        body=body,
        body_bytes=json.dumps(body).encode(),
    )


@given(json_values(clean_text))
def test_an_answer_of_storable_text_passes(body: Any) -> None:
    assert unstorable_in(answered(body)) is None


@given(json_values(any_text))
def test_an_answer_is_refused_exactly_when_a_string_cannot_be_stored(body: Any) -> None:
    strings: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, str):
            strings.append(value)
        elif isinstance(value, dict):
            for key, child in value.items():
                strings.append(key)
                walk(child)
        elif isinstance(value, list):
            for child in value:
                walk(child)

    walk(body)
    found = unstorable_in(answered(body))
    assert (found is not None) == (not all(is_storable(s) for s in strings))
    if found is not None:
        assert is_storable(found.where) and is_storable(found.shown)


def test_the_finding_names_the_pointer_and_shows_the_value_escaped() -> None:
    body = {"state": "failed", "error": {"message": "bad\x00nul \ud800 x"}}
    found = unstorable_in(answered(body))
    assert found is not None
    assert found.where == "the body at /error/message"
    assert found.shown == "bad\\u0000nul \\ud800 x"
    key = unstorable_in(answered({"items": [{"k\ud800": 1}]}))
    assert key is not None and key.where == "the body at /items/0/k\\ud800"


def test_a_pair_of_surrogate_escapes_is_one_character_and_passes() -> None:
    raw = b'{"name":"\\ud83d\\ude00 \\u00e9"}'
    call = CallResult("GET", "/", NOW, 1.0, http_status=200, body=json.loads(raw), body_bytes=raw)
    assert unstorable_in(call) is None


def test_json_lines_are_read_line_by_line() -> None:
    raw = b'{"n":1}\nnot json \\u0000\n{"n":2,"err":"x\\u0000"}\n'
    call = CallResult("GET", "/r", NOW, 1.0, http_status=200, body=None, body_bytes=raw)
    found = unstorable_in(call)
    assert found is not None and found.where == "line 3 at /err" and found.shown == "x\\u0000"


def test_recorded_headers_are_checked() -> None:
    call = CallResult("GET", "/", NOW, 1.0, http_status=200, provider_request_id="req\x00")
    found = unstorable_in(call)
    assert found is not None and found.where == "the provider-request-id header"


@dataclass(frozen=True)
class _Outcome:
    """What a custom adapter may return: values read beside the call."""

    call: CallResult
    job_id: str | None
    view: Any = None


@dataclass(frozen=True)
class _View:
    remote_state: str | None


def test_values_an_adapter_read_out_of_an_answer_are_checked_too() -> None:
    clean = CallResult("GET", "/", NOW, 1.0, http_status=200, body={}, body_bytes=b"{}")
    assert unstorable_in(_Outcome(clean, "job_1", _View("running"))) is None
    found = unstorable_in(_Outcome(clean, "job\x00", None))
    assert found is not None and found.where == "job_id" and found.shown == "job\\u0000"
    nested = unstorable_in(_Outcome(clean, "job_1", _View("queued\ud800")))
    assert nested is not None and nested.where == "view.remote_state"


@given(json_values(any_text))
def test_visible_makes_every_value_encodable_and_storable(value: Any) -> None:
    shown = visible(value)
    text = json.dumps(shown, ensure_ascii=False)
    text.encode("utf-8")  # never raises
    assert "\x00" not in text


@given(json_values(clean_text))
def test_visible_leaves_clean_values_as_they_are(value: Any) -> None:
    assert visible(value) is value


def test_visible_writes_the_escape_an_operator_can_read() -> None:
    assert visible({"error": {"message": "bad\x00nul \ud800 x"}}) == {
        "error": {"message": "bad\\u0000nul \\ud800 x"}
    }


@given(any_text)
def test_escaped_text_is_storable_and_clipped(text: str) -> None:
    shown = escaped(text * 20, limit=30)
    assert is_storable(shown) and len(shown) <= 30 * 6 + 2
