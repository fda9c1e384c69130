"""The one place a failed validation of a wire model becomes a message that says what to fix.

As ``providers.loader.config_error`` does for provider files: the first problem,
named by its field, in the words the API has always used ("'provider' must be a
string, got a number"). Unknown fields are reported all at once, with the allowed
ones, before any other problem.
"""

from __future__ import annotations

import types
import typing
from enum import Enum
from typing import Any

from annotated_types import Ge, Le
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from reconciler.core.errors import InvalidRequest
from reconciler.wire.fields import PROBLEM

# A required field's problem when "is required" alone would not say what to send.
_MISSING = {"request": "is required: the JSON body of the provider's create call"}
_OBJECT = ("dict_type", "model_type", "model_attributes_type")
_NUMBER = ("float_type", "int_type", "int_from_float", "float_parsing", "int_parsing")
_SHORT = ("string_too_short", "string_pattern_mismatch")


def kind(value: Any) -> str:
    """What a JSON value is, in words."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _enum_of(annotation: Any) -> type[Enum] | None:
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, typing.Annotated):
        for arg in typing.get_args(annotation):
            found = _enum_of(arg)
            if found is not None:
                return found
    return None


def _range(model: type[BaseModel], name: str) -> str | None:
    field = model.model_fields.get(name)
    if field is None:
        return None
    low = next((m.ge for m in field.metadata if isinstance(m, Ge)), None)
    high = next((m.le for m in field.metadata if isinstance(m, Le)), None)
    if low is None or high is None:
        return None
    return f"must be a whole number from {low} to {high}"


def _choice(model: type[BaseModel], name: str, value: Any) -> str:
    if not isinstance(value, str):
        return f"must be a string, got {kind(value)}"
    if not value.strip():
        return "must not be empty"
    field = model.model_fields.get(name)
    enum = _enum_of(field.annotation) if field is not None else None
    allowed = [str(e.value) for e in enum] if enum is not None else []
    return f"must be one of: {', '.join(allowed)}"


def _number(value: Any) -> str:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return "must be a whole number"
    return f"must be a number, got {kind(value)}"


def _bound(model: type[BaseModel], name: str, kind_: str, ctx: dict[str, Any], value: Any) -> str:
    bounds = _range(model, name) if isinstance(value, int) else None
    if bounds is not None:
        return bounds
    words = {
        "greater_than_equal": ("at least", "ge"),
        "less_than_equal": ("at most", "le"),
        "greater_than": ("greater than", "gt"),
        "less_than": ("less than", "lt"),
    }
    word, key = words[kind_]
    return f"must be {word} {ctx.get(key)}"


_BOUNDS = ("greater_than_equal", "less_than_equal", "greater_than", "less_than")


def _problem(error: ErrorDetails, model: type[BaseModel], name: str) -> str:
    kind_, ctx, value = error["type"], error.get("ctx") or {}, error.get("input")
    if kind_ == PROBLEM:
        return str(ctx["problem"])
    if kind_ == "missing" or (value is None and kind_ == "string_type"):
        return _MISSING.get(name, "is required")
    simple = {
        "string_type": f"must be a string, got {kind(value)}",
        "string_too_long": f"must be at most {ctx.get('max_length')} characters",
        "bool_type": f"must be true or false, got {kind(value)}",
    }
    if kind_ in simple:
        return simple[kind_]
    if kind_ in _SHORT:
        return "must not be empty"
    if kind_ in _OBJECT:
        return f"must be a JSON object, got {kind(value)}"
    if kind_ in ("enum", "literal_error"):
        return _choice(model, name, value)
    if kind_ in _NUMBER:
        return _number(value)
    if kind_ in _BOUNDS:
        return _bound(model, name, kind_, ctx, value)
    return str(error["msg"])


def invalid_request(
    exc: ValidationError,
    model: type[BaseModel],
    *,
    what: str = "the request body",
    unknown: str = "field",
) -> InvalidRequest:
    """The first problem of ``exc`` (a validation of ``model``) as one ``InvalidRequest``.

    ``what`` names the whole value when it is not an object; ``unknown`` is the word
    for an unknown member ("field", "argument", "query parameter").
    """
    errors = exc.errors(include_url=False)
    extra = sorted(str(e["loc"][0]) for e in errors if e["type"] == "extra_forbidden")
    if extra:
        allowed = sorted(f.alias or name for name, f in model.model_fields.items())
        return InvalidRequest(
            f"unknown {unknown}(s): {', '.join(extra)}; allowed: {', '.join(allowed)}"
        )
    first = errors[0]
    if not first["loc"]:
        if first["type"] == PROBLEM:
            return InvalidRequest(str((first.get("ctx") or {})["problem"]))
        return InvalidRequest(f"{what} must be a JSON object, got {kind(first.get('input'))}")
    name = str(first["loc"][0])
    return InvalidRequest(f"'{name}' {_problem(first, model, name)}")


M = typing.TypeVar("M", bound=BaseModel)


def validated(
    model: type[M],
    value: Any,
    *,
    what: str = "the request body",
    unknown: str = "field",
    context: dict[str, Any] | None = None,
) -> M:
    """``value`` as ``model``, or the ``InvalidRequest`` that says what to fix."""
    try:
        return model.model_validate(value, context=context)
    except ValidationError as exc:
        raise invalid_request(exc, model, what=what, unknown=unknown) from None
