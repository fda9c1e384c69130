"""A provider's ``request_schema``: checked to be a usable JSON Schema at load, applied at intake.

Guarantee: a request that does not match its provider's schema is refused with a
message naming the failing field before anything is stored, and a schema that
could fail at intake (invalid, or with a ``$ref`` this document cannot resolve)
stops the service at start instead. References are resolved inside the schema
only: nothing is fetched from the network.

No request makes the check costly: patterns are matched by RE2 and ``uniqueItems`` by
hashing (``providers.schema_keywords``), a pattern RE2 cannot take stops the service at
start, and a check still running after ``CHECK_SECONDS`` is refused (413). The caller
runs it off the event loop (``commands.agent_actions``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from jsonschema import exceptions as schema_errors
from jsonschema import validators

from reconciler.core.errors import InvalidRequest, PayloadTooLarge, PointerSyntaxError
from reconciler.providers import schema_keywords
from reconciler.providers.pointer import MISSING, Pointer

MAX_MESSAGE = 300
_REF_KEYS = ("$ref", "$dynamicRef")
# The CPU one request's check may take. Five times the slowest honest check measured: a
# 1 MiB anthropic_batches request (8,000 items) takes 0.2 s; a check is a few ms.
CHECK_SECONDS = 1.0


class SchemaProblem(ValueError):
    """Why a schema cannot be used; the loader prefixes file and key."""


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _REF_KEYS and isinstance(value, str):
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item)


def _check_refs(schema: Mapping[str, Any]) -> None:
    for ref in _refs(schema):
        if not ref.startswith("#"):
            raise SchemaProblem(f"$ref {ref!r} points outside the schema; only '#/...' is allowed")
        try:
            target = Pointer.parse(unquote(ref[1:])).resolve(schema)
        except PointerSyntaxError:
            raise SchemaProblem(f"$ref {ref!r} is not a JSON pointer ('#/...')") from None
        if target is MISSING:
            raise SchemaProblem(f"$ref {ref!r} does not resolve inside the schema")


def _check_patterns(schema: Mapping[str, Any]) -> None:
    for where, pattern in schema_keywords.patterns(schema):
        try:
            schema_keywords.regex(pattern)
        except schema_keywords.PatternProblem as exc:
            raise SchemaProblem(
                f"{where}: pattern {pattern!r} cannot be matched in time linear in the "
                f"request ({exc}); lookaround and backreferences are not supported, write "
                "it without them"
            ) from None
    names = schema_keywords.keywords_in(schema)
    if "unevaluatedProperties" in names and "patternProperties" in names:
        raise SchemaProblem(
            "unevaluatedProperties beside patternProperties is not supported (jsonschema "
            "matches those patterns with a backtracking engine); use additionalProperties"
        )


def _where(error: schema_errors.ValidationError) -> str:
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
    missing = _missing(error)
    return "request" + path + (f".{missing}" if missing else "")


def _missing(error: schema_errors.ValidationError) -> str | None:
    """The field a ``required`` failure is about: it is the one to name, not its parent."""
    if error.validator != "required" or not isinstance(error.instance, dict):
        return None
    wanted = error.validator_value if isinstance(error.validator_value, list) else []
    return next((str(name) for name in wanted if name not in error.instance), None)


def _short(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 1] + "…"


def _draft(schema: Mapping[str, Any]) -> Any:
    """The validator class of the draft ``$schema`` names (2020-12 when it names none)."""
    if "$schema" not in schema:
        return validators.Draft202012Validator
    named = schema["$schema"]
    found = validators.validator_for(schema, default=None) if isinstance(named, str) else None
    if found is None:
        raise SchemaProblem(f"$schema {named!r} is not a JSON Schema draft this service knows")
    return found


@dataclass(frozen=True)
class RequestSchema:
    """A compiled JSON Schema for the ``request`` of one provider's operations."""

    provider: str
    schema: Mapping[str, Any]
    _validator: Any = field(repr=False, compare=False)

    @classmethod
    def compile(cls, provider: str, schema: Any) -> RequestSchema:
        """Check ``schema`` (the draft its ``$schema`` names, else 2020-12); ``SchemaProblem``."""
        if not isinstance(schema, dict):
            raise SchemaProblem("expected a table (a JSON Schema object)")
        validator_class = _draft(schema)
        try:
            validator_class.check_schema(schema)
        except schema_errors.SchemaError as exc:
            where = "/".join(str(p) for p in exc.absolute_path) or "the top level"
            raise SchemaProblem(
                f"not a valid JSON Schema at {where}: {_short(exc.message)}"
            ) from None
        _check_refs(schema)
        _check_patterns(schema)
        validator = schema_keywords.bounded_class(validator_class)(schema)
        try:
            with schema_keywords.within(CHECK_SECONDS):
                schema_errors.best_match(validator.iter_errors({}))
        except (schema_keywords.OutOfTime, RecursionError):
            raise SchemaProblem(
                "refers to itself without end (a $ref cycle that checks the same value "
                "again); every request would fail its check"
            ) from None
        return cls(provider, schema, validator)

    def check(self, request: Any, seconds: float = CHECK_SECONDS) -> None:
        """Raise ``InvalidRequest`` naming the failing field when ``request`` does not match,
        ``PayloadTooLarge`` when it takes longer than ``seconds`` to tell."""
        try:
            with schema_keywords.within(seconds):
                error = schema_errors.best_match(self._validator.iter_errors(request))
        except (schema_keywords.OutOfTime, RecursionError):
            raise PayloadTooLarge(
                f"the request takes more than {seconds:g} s of CPU to check against the "
                f"request_schema of provider '{self.provider}'; send a smaller or simpler "
                "request; nothing was stored"
            ) from None
        if error is None:
            return
        where = _where(error)
        if _missing(error) is not None:
            raise InvalidRequest(
                f"'{where}' is required by the request_schema of provider '{self.provider}' "
                "(list_providers or GET /v1/providers shows the schema); nothing was stored"
            )
        raise InvalidRequest(
            f"'{where}' does not match the request_schema of provider "
            f"'{self.provider}': {_short(error.message)} (list_providers or GET /v1/providers "
            "shows the schema); nothing was stored"
        )
