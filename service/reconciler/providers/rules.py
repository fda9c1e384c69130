"""The keys real APIs need beyond the simulator: values set into a call's body, answers
that mean something (a duplicate, "no such job", a refused cancel), lookup matches,
static and per-call headers and failed-line tests of JSONL results.

Guarantee: each is checked at load as far as a file can be: templates use only the
placeholders the call can fill, a set pointer cannot replace the whole body or
collide with another, a header (static or per call) can never carry a credential
(those come from ``[auth]`` and the environment), and a line test has exactly one test.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import Field, PlainValidator, model_validator

from reconciler.core.credentials import credential_like_value, secret_like_name
from reconciler.core.errors import PointerSyntaxError
from reconciler.providers.base import FileTable
from reconciler.providers.fields import (
    PointerText,
    Text,
    as_tuple,
    check_template,
    problem,
)
from reconciler.providers.pointer import MISSING, Pointer
from reconciler.providers.state_table import Scalar, json_equal
from reconciler.providers.templates import REQUEST_FIELDS, template_fields, value_fields


def quoted(key: str) -> str:
    """A table key as TOML writes it when it is not a bare key (pointers, header names)."""
    bare = key and all(ch.isalnum() or ch in "_-" for ch in key)
    return key if bare else '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'


def member_pointer(text: Any, key: str) -> Pointer:
    try:
        pointer = Pointer.parse(text)
    except PointerSyntaxError as exc:
        raise problem(exc.message, key) from None
    if not pointer.tokens:
        raise problem("the whole document cannot be set; name a member such as /model", key)
    return pointer


def template_names(
    value: Any, key: str, allowed: frozenset[str] = REQUEST_FIELDS
) -> frozenset[str]:
    """Placeholders used by the strings of a JSON value (nested ones too), all in ``allowed``."""
    if isinstance(value, str):
        return check_template(value, allowed, key)
    if isinstance(value, list):
        return frozenset().union(*(template_names(v, key, allowed) for v in value))
    if isinstance(value, dict):
        return frozenset().union(*(template_names(v, key, allowed) for v in value.values()))
    if isinstance(value, dt.date | dt.time):
        raise problem("TOML dates and times are not JSON values; write a string", key)
    if isinstance(value, float) and not math.isfinite(value):
        raise problem("inf and nan are not JSON values", key)
    return frozenset()


def _looks_like_a_credential(pointer: Pointer, value: Any) -> bool:
    # A literal (not a template) under a credential-like name: a secret pasted into the file.
    name = pointer.tokens[-1].lower()
    words = ("key", "token", "secret", "password", "credential")
    literal = isinstance(value, str) and not template_fields(value)
    return literal and any(word in name for word in words)


@dataclass(frozen=True)
class SetRule:
    """``set``: a value written at ``pointer`` into a call's body before it is sent."""

    pointer: Pointer
    value: Any  # JSON; strings (also nested ones) are templates

    @property
    def fields(self) -> frozenset[str]:
        return value_fields(self.value)


def set_rules(allowed: frozenset[str]) -> PlainValidator:
    """The ``set`` table of a call whose templates may use ``allowed``."""

    def check(value: Any) -> tuple[SetRule, ...]:
        if not isinstance(value, dict):
            raise problem('expected a table of JSON pointer = value, e.g. "/model" = "x"')
        rules: list[SetRule] = []
        for text, item in value.items():
            key = quoted(text)
            pointer = member_pointer(text, key)
            template_names(item, key, allowed)
            if _looks_like_a_credential(pointer, item):
                # The value is not echoed: it may be the credential itself.
                raise problem(
                    "looks like a credential; credentials come from [auth] and the "
                    "environment, never from the file",
                    key,
                )
            for other in rules:
                shorter, longer = sorted((other.pointer.tokens, pointer.tokens), key=len)
                if longer[: len(shorter)] == shorter:
                    raise problem(f"overlaps {other.pointer.text}: set each member once", key)
            rules.append(SetRule(pointer, item))
        return tuple(rules)

    return PlainValidator(check)


def _match(value: Any) -> tuple[tuple[Pointer, str], ...]:
    if not isinstance(value, dict) or not value:
        raise problem('expected a table of pointer = template, e.g. "/metadata/key" = ...')
    pairs: list[tuple[Pointer, str]] = []
    for text, template in value.items():
        key = quoted(text)
        try:
            pointer = Pointer.parse(text)
        except PointerSyntaxError as exc:
            raise problem(exc.message, key) from None
        if not isinstance(template, str) or not template:
            raise problem("expected a non-empty string (a value template)", key)
        check_template(template, REQUEST_FIELDS, key)
        pairs.append((pointer, template))
    return tuple(pairs)


def _header_pairs(value: Any, allowed: frozenset[str]) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, dict):
        raise problem('expected a table of header = value, e.g. { "anthropic-version" = "..." }')
    seen: set[str] = set()
    pairs: list[tuple[str, str]] = []
    for name, text in value.items():
        key = quoted(name)
        if (
            not isinstance(name, str)
            or not name
            or len(name) > 100
            or not all(ch.isalnum() or ch in "!#$%&'*+.^_`|~-" for ch in name)
        ):
            raise problem("is not a valid HTTP header name", key)
        if secret_like_name(name):
            # The value is not echoed: it may be the credential itself.
            raise problem(
                "headers in a provider file are never secrets; a credential header comes "
                'from [auth] (type = "header", name = ..., value_env = ...)',
                key,
            )
        if name.lower() in seen:
            raise problem("given twice (header names ignore case)", key)
        if not isinstance(text, str) or any(not ch.isprintable() for ch in text):
            raise problem("expected a string of printable characters", key)
        check_template(text, allowed, key)
        why = credential_like_value(text, name)
        if why is not None:
            # Nor is it echoed here.
            raise problem(
                f"headers in a provider file are never credentials, and this value {why}; "
                "a credential comes from [auth] and the environment",
                key,
            )
        seen.add(name.lower())
        pairs.append((name, text))
    return tuple(pairs)


def _static_headers(value: Any) -> tuple[tuple[str, str], ...]:
    return _header_pairs(value, frozenset())


def call_headers(allowed: frozenset[str]) -> PlainValidator:
    """A call's own ``headers``: like the static ones, and their values are templates."""
    return PlainValidator(lambda value: _header_pairs(value, allowed))


Match = Annotated[tuple[tuple[Pointer, str], ...], PlainValidator(_match)]
StaticHeaders = Annotated[tuple[tuple[str, str], ...], PlainValidator(_static_headers)]
HeaderPairs = tuple[tuple[str, str], ...]


def _scalar(value: Any) -> Scalar:
    if isinstance(value, str | int | float | bool):
        return value
    raise problem("expected a string, number or boolean")


def _scalars(value: Any) -> tuple[Scalar, ...]:
    if not isinstance(value, list) or not value:
        raise problem("expected a non-empty list")
    return tuple(_scalar(v) for v in value)


def _present(value: Any) -> bool:
    if not isinstance(value, bool):
        raise problem("expected true or false")
    return value


class LineTest(FileTable):
    """``[result] failed_lines``: one test on a JSONL line; any match makes the line failed."""

    pointer: PointerText
    present: Annotated[bool, PlainValidator(_present)] | None = None
    equals: Annotated[Scalar, PlainValidator(_scalar)] | None = None
    in_: Annotated[tuple[Scalar, ...], PlainValidator(_scalars)] | None = Field(
        default=None, alias="in"
    )

    @model_validator(mode="after")
    def _one_test(self) -> LineTest:
        given = [k for k in ("present", "equals", "in_") if getattr(self, k) is not None]
        if len(given) != 1:
            raise problem("give exactly one of present, equals, in")
        return self

    def matches(self, line: Any) -> bool:
        value = self.pointer.resolve(line)
        if self.present is not None:
            return (value is not MISSING and value is not None) is self.present
        expected = (self.equals,) if self.equals is not None else self.in_ or ()
        return any(json_equal(value, e) for e in expected)


def _statuses(lowest: int) -> PlainValidator:
    def check(value: Any) -> tuple[int, ...]:
        if not isinstance(value, list) or not value:
            raise problem("expected a non-empty list of HTTP status codes, e.g. [409]")
        for code in value:
            if isinstance(code, bool) or not isinstance(code, int) or not lowest <= code <= 599:
                raise problem(f"expected HTTP status codes ({lowest} to 599)")
        return tuple(value)

    return PlainValidator(check)


class AnswerRule(FileTable):
    """An answer the provider file gives a meaning: ``[create] duplicate`` ("this key already
    made a job"), ``[lookup]``/``[status] not_found`` ("no such job", for APIs that say so
    with something other than 404)."""

    status: Annotated[tuple[int, ...], _statuses(400)]
    body_contains: Text | None = None

    def matches(self, http_status: int | None, body: bytes | None) -> bool:
        if http_status not in self.status:
            return False
        if self.body_contains is None:
            return True
        return self.body_contains in (body or b"").decode("utf-8", errors="replace")


class RefusalRule(AnswerRule):
    """``[cancel] refused``: an answer that means the provider did not take the cancel, also
    where its status says otherwise (a 200 whose body says no)."""

    status: Annotated[tuple[int, ...], _statuses(200)]


LineTests = Annotated[tuple[LineTest, ...], as_tuple("inline tables such as { pointer = ... }")]
