"""Strict JSON's fast checks answer exactly what their slow walks answer: the depth bound
(a byte scan against a character scan) and the storable-text check (one encoding of the
value against a walk of every string in it)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reconciler.core.errors import InvalidRequest
from reconciler.core.strict_json import (
    MAX_JSON_DEPTH,
    _depth_by_scan,
    _depth_ok,
    first_unstorable,
    is_storable,
    parse_json,
)

# Texts made of what the depth depends on: brackets, quotes, escapes, and filler
# (multi-byte characters too, whose UTF-8 bytes must never read as brackets).
_pieces = st.sampled_from(["[", "]", "{", "}", '"', "\\", '\\"', "a", ",", "é", "\u4e16", " "])
_texts = st.lists(_pieces, max_size=80).map("".join)


@given(prefix=st.integers(0, MAX_JSON_DEPTH + 4), body=_texts, suffix=st.integers(0, 70))
def test_the_fast_check_agrees_with_the_scan(prefix: int, body: str, suffix: int) -> None:
    text = "[" * prefix + body + "]" * suffix
    assert _depth_ok(text) == _depth_by_scan(text)


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH, True),
        ("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1), False),
        # Brackets inside a string do not nest, escaped quote or not.
        ('["' + "[" * 100 + '"]', True),
        ('["\\"' + "[" * 100 + '"]', True),
        # A closer inside a string does not undo an opener outside it.
        ("[" * 40 + '"' + "]" * 40 + '"' + "[" * 40, False),
        # Past an unclosed quote everything is string.
        ('["' + "[" * 100, True),
    ],
)
def test_depth_cases(text: str, ok: bool) -> None:
    assert _depth_ok(text) is ok
    assert _depth_by_scan(text) is ok


def test_a_wide_document_passes_and_a_deep_one_is_refused() -> None:
    wide = "[" + ",".join(['{"item":"x","status":"ok"}'] * 500) + "]"
    assert len(parse_json(wide.encode())) == 500
    deep = "[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1)
    with pytest.raises(InvalidRequest, match=f"nests deeper than {MAX_JSON_DEPTH} levels"):
        parse_json(deep.encode())


# Strings with what no database stores (NUL, a lone surrogate) and what only looks like it
# in JSON text (a backslash, the six characters of an escape).
_chars = st.sampled_from(["a", "\x00", "\ud800", "\udfff", "\\", "u0000", "\\u0000", "é", "~", "/"])
_words = st.lists(_chars, max_size=6).map("".join)
_values = st.recursive(
    st.none() | st.booleans() | st.integers() | _words,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_words, inner, max_size=4),
    max_leaves=12,
)


def _walked(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for key, child in value.items() for s in [key, *_walked(child)]]
    if isinstance(value, list):
        return [s for child in value for s in _walked(child)]
    return []


@given(_values)
def test_the_storable_check_finds_exactly_what_a_walk_finds(value: object) -> None:
    found = first_unstorable(value)
    assert (found is None) == all(is_storable(s) for s in _walked(value))
