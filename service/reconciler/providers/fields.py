"""The value types of a provider file, each with the one-line problem it reports.

Guarantee: every value a provider file may hold is checked by exactly one of these
types, and a bad value fails with a problem that says what to write instead, never
echoing a value that could be a pasted secret. ``loader.config_error`` turns the
first failure into ``<file>: providers.<name>.<key>: <problem>``; a failure found
for a sub-key (a summary entry, a header) carries that sub-key in ``key``. The types
a provider file shares with the settings (text, flags, bounded numbers) and the
problem they raise are ``core.file_values``'s, re-exported here.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, Literal, TypeVar
from urllib.parse import urlsplit

from pydantic import BeforeValidator, PlainSerializer, PlainValidator

from reconciler.core.errors import PointerSyntaxError
from reconciler.core.file_values import LINE as LINE
from reconciler.core.file_values import Count as Count
from reconciler.core.file_values import CountOrZero as CountOrZero
from reconciler.core.file_values import Flag as Flag
from reconciler.core.file_values import Seconds as Seconds
from reconciler.core.file_values import SecondsOrZero as SecondsOrZero
from reconciler.core.file_values import Text as Text
from reconciler.core.file_values import problem as problem
from reconciler.core.file_values import text_value as text_value
from reconciler.providers.pointer import MISSING, Pointer
from reconciler.providers.templates import template_fields as template_fields

STATUS_PREFIX = "status:"
HEADER_PREFIX = "header:"
HTTP_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")

ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]{0,127}")
HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,100}")
IMPORT_REF = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")
MAX_DESCRIPTION = 2000

E = TypeVar("E", bound=StrEnum)


def _fraction(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise problem("expected a number")
    if not 0 <= value <= 1:
        raise problem("must be between 0 and 1")
    return float(value)


def parse_pointer(value: Any) -> Pointer:
    try:
        return Pointer.parse(text_value(value))
    except PointerSyntaxError as exc:
        raise problem(exc.message) from None


def _whole_or_pointer(value: Any) -> Pointer:
    if value == "":
        return Pointer.parse("")
    return parse_pointer(value)


def _header(value: Any) -> str:
    if not HEADER_NAME.fullmatch(text_value(value)):
        raise problem("is not a valid HTTP header name")
    return str(value)


def _env_name(value: Any) -> str:
    # The value is not echoed: someone may have pasted the secret itself here.
    if not isinstance(value, str) or not ENV_NAME.fullmatch(value):
        raise problem(
            "must name an environment variable (A-Z, 0-9, _); "
            "do not write the secret itself in the file"
        )
    return value


def _method(value: Any) -> str:
    method = text_value(value).upper()
    if method not in HTTP_METHODS:
        raise problem(f"expected one of {', '.join(HTTP_METHODS)}")
    return method


def _import_ref(value: Any) -> str:
    if not IMPORT_REF.fullmatch(text_value(value)):
        raise problem("expected 'package.module:ClassName'")
    return str(value)


def _description(value: Any) -> str:
    text = text_value(value)
    if not text.strip() or len(text) > MAX_DESCRIPTION:
        raise problem(f"expected 1 to {MAX_DESCRIPTION} characters of text")
    return text


def _base_url(value: Any) -> str:
    text = text_value(value)
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise problem("must be an http:// or https:// URL with a host")
    if parts.username is not None or parts.password is not None:
        raise problem("must not contain credentials; use auth")
    if parts.query or parts.fragment:
        raise problem("must not have a query or fragment")
    return text.rstrip("/")


def choice(kind: type[E], message: str) -> PlainValidator:
    """An enum given by its value; anything else fails with ``message``."""

    def check(value: Any) -> E:
        text = text_value(value)
        try:
            return kind(text)
        except ValueError:
            raise problem(message) from None

    return PlainValidator(check)


def _pointers(value: Any) -> tuple[Pointer, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise problem("expected a list of JSON pointers")
    return tuple(parse_pointer(v) for v in value)


def as_tuple(what: str) -> BeforeValidator:
    """TOML arrays arrive as lists; the models hold tuples (frozen all the way down)."""

    def check(value: Any) -> Any:
        if isinstance(value, tuple):
            return value
        if not isinstance(value, list):
            raise problem(f"expected a list of {what}")
        return tuple(value)

    return BeforeValidator(check)


def as_str(value: Any) -> str:
    return str(value)


_AS_TEXT = PlainSerializer(as_str, return_type=str)

Fraction = Annotated[float, PlainValidator(_fraction)]
PointerText = Annotated[Pointer, PlainValidator(parse_pointer), _AS_TEXT]
# "" is the whole document: an answer that is itself the array of candidates.
DocumentPointer = Annotated[Pointer, PlainValidator(_whole_or_pointer), _AS_TEXT]
PointerList = Annotated[tuple[Pointer, ...], PlainValidator(_pointers)]
HeaderName = Annotated[str, PlainValidator(_header)]
LowerHeaderName = Annotated[str, PlainValidator(lambda v: _header(v).lower())]
EnvName = Annotated[str, PlainValidator(_env_name)]
Method = Annotated[str, PlainValidator(_method)]
ImportRef = Annotated[str, PlainValidator(_import_ref)]
Description = Annotated[str, PlainValidator(_description)]
BaseUrl = Annotated[str, PlainValidator(_base_url)]


# --- templates ---------------------------------------------------------------------------


def check_template(text: str, allowed: frozenset[str], key: str | None = None) -> frozenset[str]:
    """The placeholders of ``text``; a problem when it uses any outside ``allowed``."""
    try:
        fields = [(n, s, c) for _, n, s, c in string.Formatter().parse(text) if n is not None]
    except ValueError as exc:
        raise problem(
            f"not a valid template: {exc} (write {{{{ and }}}} for a brace)", key
        ) from None
    names = frozenset(name for name, _, _ in fields)
    if not names <= allowed or any(spec or conversion for _, spec, conversion in fields):
        placeholders = ", ".join("{" + a + "}" for a in sorted(allowed))
        raise problem(f"only {placeholders} may appear in braces", key)
    return names


def path_template(*allowed: str, needed: str | None = None) -> PlainValidator:
    """A request path under ``base_url``; ``needed`` is a placeholder it must hold."""
    names = frozenset(allowed)

    def check(value: Any) -> str:
        text = text_value(value)
        if not text.startswith("/"):
            raise problem("must start with '/'")
        if "#" in text or any(ch.isspace() or not ch.isprintable() for ch in text):
            raise problem("must not contain '#', spaces or control characters")
        used = check_template(text, names)
        if needed is not None and needed not in used:
            raise problem(f"must contain {{{needed}}}")
        return text

    return PlainValidator(check)


# --- pointers with a source --------------------------------------------------------------


@dataclass(frozen=True)
class SourcedPointer:
    """A pointer into the result document, or (``status:`` prefix) into the final status body."""

    source: Literal["result", "status"]
    pointer: Pointer

    def resolve(self, result: Any, status_body: Any) -> Any:
        return self.pointer.resolve(status_body if self.source == "status" else result)

    def __str__(self) -> str:
        prefix = STATUS_PREFIX if self.source == "status" else ""
        return prefix + self.pointer.text


def _sourced(value: Any, key: str | None = None) -> SourcedPointer:
    if not isinstance(value, str):
        raise problem("expected a JSON pointer (optionally prefixed with 'status:')", key)
    source: Literal["result", "status"] = "result"
    if value.startswith(STATUS_PREFIX):
        source, value = "status", value[len(STATUS_PREFIX) :]
    try:
        return SourcedPointer(source, Pointer.parse(value))
    except PointerSyntaxError as exc:
        raise problem(exc.message, key) from None


def _sourced_list(value: Any) -> tuple[SourcedPointer, ...]:
    if not isinstance(value, list):
        raise problem("expected a list of JSON pointers")
    return tuple(_sourced(v) for v in value)


def _summary(value: Any) -> tuple[tuple[str, SourcedPointer], ...]:
    if not isinstance(value, dict):
        raise problem("expected a table of name = pointer")
    return tuple((name, _sourced(v, str(name))) for name, v in value.items())


Sourced = Annotated[SourcedPointer, PlainValidator(_sourced), _AS_TEXT]
SourcedList = Annotated[tuple[SourcedPointer, ...], PlainValidator(_sourced_list)]
Summary = Annotated[tuple[tuple[str, SourcedPointer], ...], PlainValidator(_summary)]


@dataclass(frozen=True)
class FieldSource:
    """Where a webhook delivery carries a value: a header (``header:NAME``) or a JSON pointer."""

    header: str | None = None
    pointer: Pointer | None = None

    def extract(self, headers: Mapping[str, str], body: Any) -> Any:
        """The value, or ``MISSING``; ``headers`` must be case-insensitive or lower-case keyed."""
        if self.header is not None:
            value = headers.get(self.header)
            return MISSING if value is None else value
        return MISSING if self.pointer is None else self.pointer.resolve(body)

    def __str__(self) -> str:
        return HEADER_PREFIX + self.header if self.header is not None else str(self.pointer)


def _field_source(value: Any) -> FieldSource:
    text = text_value(value)
    if text.startswith(HEADER_PREFIX):
        name = text[len(HEADER_PREFIX) :]
        if not HEADER_NAME.fullmatch(name):
            raise problem("is not a valid header name after 'header:'")
        return FieldSource(header=name.lower())
    return FieldSource(pointer=parse_pointer(text))


def _header_source(value: Any) -> str:
    text = text_value(value)
    name = text[len(HEADER_PREFIX) :] if text.startswith(HEADER_PREFIX) else None
    if name is None or not HEADER_NAME.fullmatch(name):
        raise problem("expected 'header:NAME', the response header that carries the value")
    return name.lower()


FieldSourceText = Annotated[FieldSource, PlainValidator(_field_source), _AS_TEXT]
HeaderSource = Annotated[str, PlainValidator(_header_source)]
