"""The state table: exact words per category, declared rules, and totality."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reconciler.core.errors import ConfigError
from reconciler.core.vocabulary import RemoteCategory as C
from reconciler.providers.pointer import Pointer
from reconciler.providers.state_table import (
    StateRule,
    StateTable,
    classify,
    json_equal,
    state_word,
)

WHERE = "providers/acme.toml: providers.acme.states"
ACME = {
    "pending": ["queued", "running", "processing"],
    "success": ["succeeded"],
    "partial": ["completed_with_errors"],
    "failure": ["failed"],
    "cancelled": ["cancelled", "canceled"],
    "expired": ["expired"],
}
STATE = Pointer.parse("/state")


@pytest.fixture
def table() -> StateTable:
    return StateTable.from_mapping(ACME, WHERE)


@pytest.mark.parametrize(
    ("word", "category"),
    [
        ("queued", C.PENDING),
        ("running", C.PENDING),
        ("succeeded", C.SUCCESS),
        ("completed_with_errors", C.PARTIAL),
        ("failed", C.FAILURE),
        ("canceled", C.CANCELLED),
        ("expired", C.EXPIRED),
        ("paused", C.UNKNOWN),
        ("needs_payment", C.UNKNOWN),
        (None, C.UNKNOWN),
    ],
)
def test_listed_words_map_and_anything_else_is_unknown(
    table: StateTable, word: str | None, category: C
) -> None:
    assert table.category_of(word) is category


@pytest.mark.parametrize("word", ["Succeeded", "SUCCEEDED", " succeeded", "succeeded "])
def test_matching_is_exact_and_case_sensitive(table: StateTable, word: str) -> None:
    assert table.category_of(word) is C.UNKNOWN


def test_same_word_in_two_categories_is_refused() -> None:
    with pytest.raises(ConfigError) as caught:
        StateTable.from_mapping({"pending": ["done"], "success": ["done"]}, WHERE)
    assert caught.value.message == (
        "providers/acme.toml: providers.acme.states.success: 'done' is already listed under pending"
    )


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ({"success": ["ok"], "finished": ["x"]}, "states.finished: unknown category"),
        ({"success": ["ok"], "unknown": ["x"]}, "states.unknown: leave unknown words out"),
        ({"success": "ok"}, "states.success: expected a list"),
        ({"success": ["ok", ""]}, "states.success: state words must be non-empty strings"),
        ({"success": ["ok", 1]}, "states.success: state words must be non-empty strings"),
        ({"pending": ["queued"]}, "states.success: list at least one success state"),
    ],
)
def test_table_errors_name_file_and_key(data: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        StateTable.from_mapping(data, WHERE)
    assert caught.value.message.startswith("providers/acme.toml: providers.acme.")
    assert fragment in caught.value.message


@pytest.mark.parametrize(
    ("value", "word"),
    [
        ("running", "running"),
        (True, "true"),
        (False, "false"),
        (3, "3"),
        (None, None),
        (1.5, None),
        ({"a": 1}, None),
        (["running"], None),
        (10**400, None),
    ],
)
def test_state_word_from_json_values(value: Any, word: str | None) -> None:
    assert state_word(value) == word


@pytest.mark.parametrize(
    ("value", "expected", "equal"),
    [
        (1, 1, True),
        (1.0, 1, True),
        (True, 1, False),
        (1, True, False),
        (True, True, True),
        ("1", 1, False),
        ("a", "a", True),
        (None, "a", False),
        ([1], 1, False),
    ],
)
def test_json_equality_keeps_booleans_apart(value: Any, expected: Any, equal: bool) -> None:
    assert json_equal(value, expected) is equal


def _lro_rules() -> tuple[StateRule, ...]:
    where = "f.toml: providers.g.status.rules"
    raw = [
        {"pointer": "/done", "present": False, "category": "pending"},
        {"if_state": "true", "pointer": "/error/code", "equals": 1, "category": "cancelled"},
        {"if_state": "true", "pointer": "/error", "present": True, "category": "failure"},
    ]
    return tuple(StateRule.from_table(r, f"{where}[{i}]") for i, r in enumerate(raw))


LRO_TABLE = StateTable.from_mapping({"pending": ["false"], "success": ["true"]}, "f")
DONE = Pointer.parse("/done")


@pytest.mark.parametrize(
    ("body", "category", "word", "rule"),
    [
        ({"name": "operations/1"}, C.PENDING, None, 0),
        ({"done": False}, C.PENDING, "false", None),
        ({"done": True, "response": {}}, C.SUCCESS, "true", None),
        ({"done": True, "error": {"code": 3}}, C.FAILURE, "true", 2),
        ({"done": True, "error": {"code": 1}}, C.CANCELLED, "true", 1),
        ({"done": True, "error": None, "response": {}}, C.SUCCESS, "true", None),
        ({"done": "yes"}, C.UNKNOWN, "yes", None),
        # A rule limited to one state word does not fire for another.
        ({"done": False, "error": {"code": 1}}, C.PENDING, "false", None),
    ],
)
def test_rules_decide_before_the_table(
    body: dict[str, Any], category: C, word: str | None, rule: int | None
) -> None:
    verdict = classify(body, DONE, LRO_TABLE, _lro_rules())
    assert (verdict.category, verdict.word, verdict.rule) == (category, word, rule)


def test_rule_with_in_list() -> None:
    rule = StateRule.from_table(
        {"pointer": "/reason", "in": ["quota", "billing"], "category": "failure"}, "w"
    )
    table = StateTable.from_mapping({"success": ["ok"], "pending": ["held"]}, "w")
    assert classify({"state": "held", "reason": "billing"}, STATE, table, (rule,)).category is (
        C.FAILURE
    )
    assert classify({"state": "held", "reason": "review"}, STATE, table, (rule,)).category is (
        C.PENDING
    )


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ("x", "expected an inline table"),
        ({"pointer": "/a", "category": "failure"}, "give exactly one of present, equals, in"),
        (
            {"pointer": "/a", "present": True, "equals": 1, "category": "failure"},
            "give exactly one of present, equals, in",
        ),
        ({"present": True, "category": "failure"}, "rules[0].pointer: required"),
        ({"pointer": "a", "present": True, "category": "failure"}, "rules[0].pointer: "),
        ({"pointer": "/a", "present": True, "category": "done"}, "rules[0].category: expected"),
        ({"pointer": "/a", "present": "yes", "category": "failure"}, "present: expected true"),
        ({"pointer": "/a", "equals": [1], "category": "failure"}, "equals: expected a string"),
        ({"pointer": "/a", "in": [], "category": "failure"}, "in: expected a non-empty list"),
        ({"pointer": "/a", "in": [{}], "category": "failure"}, "in[0]: expected a string"),
        ({"pointer": "/a", "present": True, "category": "failure", "when": 1}, "when: unknown"),
    ],
)
def test_rule_errors_name_the_rule(raw: Any, fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        StateRule.from_table(raw, "p.toml: providers.p.status.rules[0]")
    assert caught.value.message.startswith("p.toml: providers.p.status.rules[0]")
    assert fragment in caught.value.message


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
    | st.sampled_from(["queued", "succeeded", "failed", "true", "false"]),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(
            st.sampled_from(["state", "done", "error", "code", "x"]), children, max_size=4
        )
    ),
    max_leaves=15,
)


@given(value=json_values, body=json_values)
def test_classification_is_total(value: Any, body: Any) -> None:
    table = StateTable.from_mapping(ACME, WHERE)
    for document in ({"state": value}, body, value):
        verdict = classify(document, STATE, table)
        assert isinstance(verdict.category, C)
        if verdict.word is None or verdict.word not in {w for ws in ACME.values() for w in ws}:
            assert verdict.category is C.UNKNOWN
        lro = classify({"done": value, "error": body}, DONE, LRO_TABLE, _lro_rules())
        assert isinstance(lro.category, C)


@given(word=st.text(max_size=20))
def test_unlisted_words_are_unknown(word: str) -> None:
    table = StateTable.from_mapping(ACME, WHERE)
    listed = {w for words in ACME.values() for w in words}
    expected = C.UNKNOWN if word not in listed else table.category_of(word)
    assert classify({"state": word}, STATE, table).category is expected
    assert (word in listed) is (expected is not C.UNKNOWN)
