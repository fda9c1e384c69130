"""No request can make the request_schema check costly, and the check never stalls the
service: each hostile schema of the red team's, checked here.

* ``uniqueItems`` over 20,000 distinct objects (269 KB) took minutes (jsonschema compares
  every pair of items that do not sort): hashed, it is linear.
* ``pattern = "^(a+)+$"`` against 28 ``a`` and a ``!`` (72 bytes) took 11 s of
  backtracking: RE2 matches it in linear time; what RE2 cannot take (lookaround,
  backreferences) is refused at load.
* What no keyword alone costs (a ``$ref`` fan-out over nested arrays) is cut off by the
  check's time bound: 413, nothing stored. A ``$ref`` cycle that would recurse on every
  request is refused at load.
* The check runs off the event loop: ``/healthz`` answers while one runs.

The bound given to ``check`` here is generous (seconds, where the linear checks take
milliseconds): the old check ran past it by minutes.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from reconciler.core.errors import ConfigError, InvalidRequest, PayloadTooLarge
from reconciler.providers.loader import load_providers
from reconciler.providers.request_schema import RequestSchema
from tests.support.world import open_world

GENEROUS = 10.0
UNIQUE = {"type": "object", "properties": {"u": {"type": "array", "uniqueItems": True}}}
NESTED = {"type": "object", "properties": {"u": {"type": "string", "pattern": "^(a+)+$"}}}
# Every level checks the level below twice: 2 ** depth checks of one nested array.
FAN_OUT = {
    "type": "object",
    "properties": {"u": {"$ref": "#/$defs/n"}},
    "$defs": {
        "n": {"type": "array", "items": {"allOf": [{"$ref": "#/$defs/n"}, {"$ref": "#/$defs/n"}]}}
    },
}


def _nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


def test_unique_items_over_20000_objects_is_linear() -> None:
    schema = RequestSchema.compile("acme", UNIQUE)
    items = [{"id": i, "tags": [i, str(i)]} for i in range(20_000)]
    schema.check({"u": items}, seconds=GENEROUS)
    with pytest.raises(InvalidRequest, match=r"'request\.u' .*items 3 and 20000 are equal"):
        schema.check({"u": [*items, {"tags": [3, "3"], "id": 3.0}]}, seconds=GENEROUS)


@pytest.mark.parametrize(
    ("items", "unique"),
    [
        ([1, 1.0], False),
        ([1, True], True),
        ([0, False], True),
        ([{"a": 1, "b": [1]}, {"b": [1.0], "a": 1}], False),
        ([[1, 2], [2, 1]], True),
        (["1", 1], True),
        ([None, None], False),
    ],
)
def test_unique_items_keeps_json_schema_equality(items: list[Any], unique: bool) -> None:
    schema = RequestSchema.compile("acme", UNIQUE)
    if unique:
        schema.check({"u": items})
    else:
        with pytest.raises(InvalidRequest, match="are equal"):
            schema.check({"u": items})


def test_a_backtracking_pattern_is_matched_in_linear_time() -> None:
    schema = RequestSchema.compile("acme", NESTED)
    schema.check({"u": "a" * 28}, seconds=GENEROUS)
    with pytest.raises(InvalidRequest, match=r"'request\.u' does not match"):
        schema.check({"u": "a" * 28 + "!"}, seconds=GENEROUS)
    with pytest.raises(InvalidRequest, match=r"'request\.u' does not match"):
        schema.check({"u": "a" * 100_000 + "!"}, seconds=GENEROUS)


def test_pattern_properties_and_what_they_leave_are_matched_in_linear_time() -> None:
    schema = RequestSchema.compile(
        "acme",
        {
            "type": "object",
            "patternProperties": {"^(a+)+$": {"type": "integer"}},
            "additionalProperties": False,
            "propertyNames": {"pattern": "^(a|aa)+!?$"},
        },
    )
    schema.check({"a" * 40: 1}, seconds=GENEROUS)
    with pytest.raises(InvalidRequest, match="does not match any of the regexes"):
        schema.check({"a" * 40 + "!": 1}, seconds=GENEROUS)
    with pytest.raises(InvalidRequest, match="is not of type 'integer'"):
        schema.check({"a" * 40: "x"}, seconds=GENEROUS)


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        ("^(?=a)a+$", "lookaround"),
        (r"^(a)\1$", "backreference"),
        ("^(?!b).*$", "lookaround"),
    ],
)
def test_a_pattern_re2_cannot_take_stops_the_service_at_start(pattern: str, why: str) -> None:
    table = {
        "base_url": "http://127.0.0.1:9000",
        "create": {"path": "/v1/jobs", "job_id": "/job_id", "idempotency_header": "Idem"},
        "status": {"path": "/v1/jobs/{job_id}", "state": "/state"},
        "states": {"pending": ["running"], "success": ["done"]},
        "request_schema": {"properties": {"name": {"type": "string", "pattern": pattern}}},
    }
    with pytest.raises(ConfigError) as caught:
        load_providers(None, {"acme": table}, {})
    message = caught.value.message
    assert "providers.acme.request_schema" in message, message
    assert "properties/name/pattern" in message and "lookaround and backreferences" in message


def test_unevaluated_properties_beside_pattern_properties_is_refused_at_load() -> None:
    schema = {
        "patternProperties": {"^x": {}},
        "allOf": [{"unevaluatedProperties": False}],
    }
    with pytest.raises(ValueError, match="unevaluatedProperties beside patternProperties"):
        RequestSchema.compile("acme", schema)


def test_a_fan_out_past_the_bound_is_refused_with_413() -> None:
    schema = RequestSchema.compile("acme", FAN_OUT)
    schema.check({"u": _nested(3)})
    with pytest.raises(PayloadTooLarge, match=r"more than 0\.05 s of CPU .*nothing was stored"):
        schema.check({"u": _nested(40)}, seconds=0.05)


def test_a_ref_cycle_on_the_same_value_is_refused_at_load() -> None:
    with pytest.raises(ValueError, match="refers to itself without end"):
        RequestSchema.compile("acme", {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#"}}})


@pytest.mark.anyio
async def test_healthz_answers_while_a_check_runs_and_the_create_stores_nothing(
    tmp_path: Path, db_url: str
) -> None:
    world = await open_world(tmp_path, db_url, provider={"request_schema": FAN_OUT})
    try:
        create = asyncio.create_task(world.submit({"u": _nested(40)}))
        while world.runtime.request_checks.borrowed_tokens == 0:
            assert not create.done(), create.result().text
            await asyncio.sleep(0)
        health = await world.client.get("/healthz")
        assert health.status_code == 200
        assert not create.done(), "the check held the event loop"
        answer = await create
        assert answer.status_code == 413, answer.text
        assert "nothing was stored" in answer.json()["error"]["message"]
        assert world.rows() == []
    finally:
        await world.close()
