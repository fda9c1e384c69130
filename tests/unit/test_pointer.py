"""JSON Pointer (RFC 6901): the examples of section 5, escapes, arrays, and totality."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reconciler.core.errors import PointerSyntaxError, ReconcilerError
from reconciler.providers.pointer import (
    MISSING,
    Pointer,
    resolve,
    split_pointer,
)

RFC_DOCUMENT: dict[str, Any] = {
    "foo": ["bar", "baz"],
    "": 0,
    "a/b": 1,
    "c%d": 2,
    "e^f": 3,
    "g|h": 4,
    "i\\j": 5,
    'k"l': 6,
    " ": 7,
    "m~n": 8,
}


@pytest.mark.parametrize(
    ("pointer", "expected"),
    [
        ("", RFC_DOCUMENT),
        ("/foo", ["bar", "baz"]),
        ("/foo/0", "bar"),
        ("/", 0),
        ("/a~1b", 1),
        ("/c%d", 2),
        ("/e^f", 3),
        ("/g|h", 4),
        ("/i\\j", 5),
        ('/k"l', 6),
        ("/ ", 7),
        ("/m~0n", 8),
    ],
)
def test_rfc_6901_examples(pointer: str, expected: Any) -> None:
    assert resolve(RFC_DOCUMENT, pointer) == expected


def test_tilde_one_is_decoded_before_tilde_zero() -> None:
    # "~01" is "~1" literally, not "/".
    assert split_pointer("/~01") == ("~1",)
    assert resolve({"~1": "right", "/": "wrong"}, "/~01") == "right"


@pytest.mark.parametrize(
    ("pointer", "document"),
    [
        ("/missing", {"a": 1}),
        ("/a/b", {"a": 1}),
        ("/a/b", {"a": "text"}),
        ("/0", {"a": 1}),
        ("/foo/2", {"foo": [1, 2]}),
        ("/foo/-", {"foo": [1, 2]}),
        ("/foo/01", {"foo": [1, 2]}),
        ("/foo/-1", {"foo": [1, 2]}),
        ("/foo/1e0", {"foo": [1, 2]}),
        ("/foo/٣", {"foo": [1, 2, 3, 4]}),  # a non-ASCII digit is no index
        ("/x", None),
        ("/x", [1]),
        ("/true", True),
    ],
)
def test_absent_is_missing_not_an_error(pointer: str, document: Any) -> None:
    assert resolve(document, pointer) is MISSING


def test_null_is_a_value_distinct_from_missing() -> None:
    pointer = Pointer.parse("/error")
    assert pointer.resolve({"error": None}) is None
    assert pointer.resolve({}) is MISSING
    assert pointer.get({}, "default") == "default"
    assert pointer.get({"error": None}, "default") is None
    assert not MISSING


def test_array_indices() -> None:
    document = {"data": [{"job_id": "j0"}, {"job_id": "j1"}]}
    assert resolve(document, "/data/1/job_id") == "j1"
    assert resolve(document, "/data/10/job_id") is MISSING


@pytest.mark.parametrize("text", ["foo", "#/foo", "/a~", "/a~2", "/~x"])
def test_invalid_pointer_text_is_refused(text: str) -> None:
    with pytest.raises(PointerSyntaxError):
        Pointer.parse(text)
    assert issubclass(PointerSyntaxError, ReconcilerError)


def test_pointer_keeps_its_text() -> None:
    pointer = Pointer.parse("/a~1b/0")
    assert str(pointer) == "/a~1b/0"
    assert pointer.tokens == ("a/b", "0")
    assert pointer == Pointer.parse("/a~1b/0")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=20,
)
tokens = st.lists(st.text(max_size=6), max_size=5)


@given(document=json_values, parts=tokens)
def test_resolution_is_total(document: Any, parts: list[str]) -> None:
    text = "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in parts)
    pointer = Pointer.parse(text)
    assert pointer.tokens == tuple(parts)
    pointer.resolve(document)  # never raises, whatever the shape


@given(key=st.text(max_size=10), value=st.integers())
def test_escaped_keys_round_trip(key: str, value: int) -> None:
    text = "/" + key.replace("~", "~0").replace("/", "~1")
    assert resolve({key: value}, text) == value
