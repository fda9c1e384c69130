"""Provider ``description`` and ``request_schema``: checked at load, applied to requests."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from reconciler.core.errors import ConfigError, InvalidRequest
from reconciler.providers.loader import load_providers
from reconciler.providers.request_schema import RequestSchema
from reconciler.providers.spec import INLINE_SOURCE

MINIMAL: dict[str, Any] = {
    "base_url": "http://127.0.0.1:9000",
    "create": {"path": "/v1/jobs", "job_id": "/job_id", "idempotency_header": "Idempotency-Key"},
    "status": {"path": "/v1/jobs/{job_id}", "state": "/state"},
    "states": {"pending": ["running"], "success": ["done"]},
}

SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["report"],
    "properties": {
        "report": {"type": "string", "enum": ["q1", "q2", "q3", "q4"]},
        "rows": {"type": "array", "items": {"$ref": "#/$defs/row"}},
    },
    "$defs": {"row": {"type": "object", "required": ["id"]}},
}


def _inline(**extra: Any) -> dict[str, Any]:
    return load_providers(None, {"acme": {**MINIMAL, **extra}}, {})


def _inline_error(**extra: Any) -> str:
    with pytest.raises(ConfigError) as caught:
        _inline(**extra)
    message = caught.value.message
    assert "\n" not in message
    assert message.startswith(f"{INLINE_SOURCE}: providers.acme.")
    return message


def test_both_keys_are_optional() -> None:
    spec = _inline()["acme"]
    assert spec.description is None and spec.request_schema is None


def test_a_provider_file_with_both_keys_loads(tmp_path: Path) -> None:
    directory = tmp_path / "providers"
    directory.mkdir()
    (directory / "acme.toml").write_text(
        textwrap.dedent(
            """\
            [providers.acme]
            base_url = "http://127.0.0.1:9000"
            description = "Quarterly exports. Takes 1 to 5 minutes."
            [providers.acme.request_schema]
            type = "object"
            required = ["report"]
            properties.report = { type = "string", enum = ["q1", "q2"] }
            [providers.acme.create]
            path = "/v1/jobs"
            job_id = "/job_id"
            idempotency = "none"
            [providers.acme.status]
            path = "/v1/jobs/{job_id}"
            state = "/state"
            [providers.acme.states]
            pending = ["running"]
            success = ["done"]
            """
        )
    )
    spec = load_providers(directory, {}, {})["acme"]
    assert spec.description == "Quarterly exports. Takes 1 to 5 minutes."
    assert spec.request_schema is not None
    assert spec.request_schema.schema["required"] == ["report"]
    spec.request_schema.check({"report": "q1"})


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        (5, "description: expected a non-empty string"),
        ("", "description: expected a non-empty string"),
        ("   ", "description: expected 1 to 2000 characters"),
        ("x" * 2001, "description: expected 1 to 2000 characters"),
    ],
)
def test_description_errors(value: Any, fragment: str) -> None:
    assert fragment in _inline_error(description=value)


@pytest.mark.parametrize(
    ("schema", "fragment"),
    [
        ("object", "request_schema: expected a table"),
        ({"type": "objekt"}, "request_schema: not a valid JSON Schema at type"),
        ({"properties": {"a": {"minLength": -1}}}, "not a valid JSON Schema at properties/a"),
        ({"$schema": "http://example.com/mine"}, "is not a JSON Schema draft this service knows"),
        ({"$schema": 4}, "is not a JSON Schema draft this service knows"),
        ({"$ref": "https://example.com/schema.json"}, "points outside the schema"),
        ({"$ref": "#/$defs/missing"}, "does not resolve inside the schema"),
        ({"items": {"$ref": "#anchor"}}, "is not a JSON pointer"),
    ],
)
def test_request_schema_errors(schema: Any, fragment: str) -> None:
    assert fragment in _inline_error(request_schema=schema)


def test_an_older_draft_is_honoured() -> None:
    schema = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object"}
    spec = _inline(request_schema=schema)["acme"]
    assert spec.request_schema is not None
    with pytest.raises(InvalidRequest):
        spec.request_schema.check([])


@pytest.mark.parametrize(
    ("request_", "fragment"),
    [
        ({}, "'request.report' is required by the request_schema of provider 'acme'"),
        ({"report": "q5"}, "'request.report' does not match"),
        ({"report": "q1", "rows": [{"id": 1}, {}]}, "'request.rows[1].id' is required"),
        ({"report": 3}, "'request.report'"),
        ({"report": "q1", "rows": [{}]}, "'request.rows[0].id' is required"),
    ],
)
def test_a_mismatch_names_the_failing_field(request_: Any, fragment: str) -> None:
    schema = RequestSchema.compile("acme", SCHEMA)
    with pytest.raises(InvalidRequest) as caught:
        schema.check(request_)
    assert fragment in caught.value.message
    assert "\n" not in caught.value.message


def test_a_matching_request_passes() -> None:
    RequestSchema.compile("acme", SCHEMA).check({"report": "q3", "rows": [{"id": 1}]})
