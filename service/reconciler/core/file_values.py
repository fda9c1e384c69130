"""What the settings and the provider files share: strict tables, bounded numbers, one line.

Guarantee: a bad value in ``reconciler.toml``, in a ``RECONCILER_*`` variable or in a
provider file stops the start with one line, ``<file or env VAR>: <key>: <problem>``,
in the same words for the same kind of value. ``first_problem`` reads a failed
validation and ``Problem.error`` writes the line; ``config.py`` and
``providers.loader`` both go through them. A problem never echoes the value (it may
be a pasted secret).

A number type carries its ``Bound`` beside its check, so that the configuration page
is tested against the very bound a value is checked with.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

from pydantic import (
    BaseModel,
    ConfigDict,
    PlainValidator,
    ValidationError,
    ValidationInfo,
    model_validator,
)
from pydantic_core import ErrorDetails, PydanticCustomError

from reconciler.core.errors import ConfigError

PROBLEM = "file_problem"  # error type: ctx problem (and key, a sub-key of the failing one)
SECRET = "secret_in_file"  # reported before any other problem of the same table set
LINE = "config_line"  # ctx line: a complete message already naming file and key


def problem(text: str, key: str | None = None) -> PydanticCustomError:
    """A load problem; ``key`` (dotted, may hold ``[i]``) names a part of the failing key."""
    return PydanticCustomError(PROBLEM, "{problem}", {"problem": text, "key": key or ""})


def text_value(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise problem("expected a non-empty string")
    return value


def any_text(value: Any) -> str:
    if not isinstance(value, str):
        raise problem("expected a string")
    return value


@dataclass(frozen=True)
class Bound:
    """Where a number may lie: above ``low`` (``open``), or from it; at most ``high``."""

    low: float
    open: bool = False
    high: float | None = None

    def problem(self, value: float, whole: bool) -> str | None:
        low = f"{self.low:g}"
        if not math.isfinite(value) or (self.open and value <= self.low):
            return f"must be greater than {low}" if self.open else f"must be {low} or more"
        if value < self.low:
            return f"must be at least {low}" if whole else f"must be {low} or more"
        if self.high is not None and value > self.high:
            return f"must be at most {self.high:g}"
        return None

    def __str__(self) -> str:
        if self.high is not None:
            return f"{self.low:g} to {self.high:g}"
        return f"{'>' if self.open else '>='} {self.low:g}"


def number(bound: Bound, unit: str = "") -> Callable[[Any], float]:
    """A number (an integer is one too) within ``bound``; a boolean is not a number."""
    noun = f"a number of {unit}" if unit else "a number"

    def check(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise problem(f"expected {noun}")
        wrong = bound.problem(value, whole=False)
        if wrong:
            raise problem(wrong)
        return float(value)

    return check


def integer(bound: Bound) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise problem("expected an integer")
        wrong = bound.problem(value, whole=True)
        if wrong:
            raise problem(wrong)
        return value

    return check


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise problem("expected true or false")
    return value


POSITIVE = Bound(0, open=True)
NOT_NEGATIVE = Bound(0)
AT_LEAST_ONE = Bound(1)

Text = Annotated[str, PlainValidator(text_value)]
AnyText = Annotated[str, PlainValidator(any_text)]
Seconds = Annotated[float, PlainValidator(number(POSITIVE, "seconds")), POSITIVE]
SecondsOrZero = Annotated[float, PlainValidator(number(NOT_NEGATIVE, "seconds")), NOT_NEGATIVE]
Count = Annotated[int, PlainValidator(integer(AT_LEAST_ONE)), AT_LEAST_ONE]
CountOrZero = Annotated[int, PlainValidator(integer(NOT_NEGATIVE)), NOT_NEGATIVE]
Flag = Annotated[bool, PlainValidator(_flag)]


def bound_of(metadata: list[Any]) -> Bound | None:
    """The bound a field's type declares (``FieldInfo.metadata``), if it is a number."""
    return next((m for m in metadata if isinstance(m, Bound)), None)


class StrictTable(BaseModel):
    """A table of a file: strict, frozen, and every key it may hold is a field.

    Before its fields are read a table runs ``refuse`` (a subclass's check that must
    come first, as a pasted secret), then refuses any key it does not know, naming
    the keys it does. Fields in ``NOT_IN_FILE`` are filled in by the loader.
    """

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, validate_by_name=False)
    NOT_IN_FILE: ClassVar[frozenset[str]] = frozenset()
    NOT_A_TABLE: ClassVar[str] = "expected a table"

    @classmethod
    def file_keys(cls) -> tuple[str, ...]:
        """The keys a file may write in this table (aliases where a field has one)."""
        return tuple(
            f.alias or name for name, f in cls.model_fields.items() if name not in cls.NOT_IN_FILE
        )

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any, info: ValidationInfo) -> Any:
        if isinstance(data, BaseModel):
            return data
        if not isinstance(data, dict):
            raise problem(cls.NOT_A_TABLE)
        cls.refuse(data)
        known = cls.file_keys()
        from_code = info.context is None  # a file is always read with its loader's context
        for key in data:
            if key not in known and not (from_code and key in cls.model_fields):
                raise problem(f"unknown key (known here: {', '.join(sorted(known))})", key)
        return cls.complete(dict(data), info.context or {})

    @classmethod
    def refuse(cls, data: Mapping[str, Any]) -> None:
        """A problem to report before any other of the table's (none by default)."""

    @classmethod
    def complete(cls, data: dict[str, Any], context: Mapping[str, Any]) -> dict[str, Any]:
        """Defaults that depend on other keys of the table, filled in before validation."""
        return data


# --- the one line ------------------------------------------------------------------------


def dotted(loc: tuple[int | str, ...]) -> str:
    """``("hooks", 0, "target")`` as ``hooks[0].target``."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else ("." if text else "") + str(part)
    return text


def key_parts(key: str) -> tuple[str, ...]:
    """The parts of a dotted key whose parts may be quoted (``set."/a.b"``)."""
    parts = re.findall(r'"((?:[^"\\]|\\.)*)"|([^.]+)', key)
    return tuple(q.replace('\\"', '"').replace("\\\\", "\\") if q else bare for q, bare in parts)


def config_line(source: str, key: str, text: str) -> ConfigError:
    """``<file or env VAR>: <key>: <problem>``, the shape of every configuration error."""
    return ConfigError(f"{source}: {key}: {text}" if key else f"{source}: {text}")


@dataclass(frozen=True)
class Problem:
    """The first problem of a failed validation: where (``loc``, then ``sub``) and what."""

    loc: tuple[int | str, ...]
    sub: str  # a part of the key inside the failing value (a summary entry, a header)
    text: str
    line: str | None = None  # already a complete message naming file and key

    @property
    def parts(self) -> tuple[int | str, ...]:
        return self.loc + key_parts(self.sub)

    @property
    def key(self) -> str:
        return ".".join(p for p in (dotted(self.loc), self.sub) if p)

    def error(self, source: str, prefix: str = "", note: str = "") -> ConfigError:
        """The line, with the key under ``prefix`` (``providers.NAME``) and ``note`` after."""
        if self.line is not None:
            return ConfigError(self.line)
        key = ".".join(p for p in (prefix, self.key) if p)
        return config_line(source, key, self.text + note)


def _words(error: ErrorDetails, missing: Mapping[str, str]) -> str:
    ctx = error.get("ctx") or {}
    if "problem" in ctx:
        return str(ctx["problem"])
    kind, loc = error["type"], error["loc"]
    if kind == "missing":
        return missing.get(str(loc[-1]), "required") if loc else "required"
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return "expected a table"
    if kind == "extra_forbidden":
        return "unknown key"
    return str(error["msg"])


def first_problem(exc: ValidationError, missing: Mapping[str, str] | None = None) -> Problem:
    """The problem to report: a pasted secret before anything else, else the first.

    ``missing`` words a required key's problem where "required" alone would not say
    what to write.
    """
    errors = exc.errors(include_url=False)
    first = next((e for e in errors if e["type"] == SECRET), errors[0])
    ctx = first.get("ctx") or {}
    line = str(ctx["line"]) if first["type"] == LINE else None
    return Problem(
        tuple(first["loc"]), str(ctx.get("key") or ""), _words(first, missing or {}), line
    )
