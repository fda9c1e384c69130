"""JSON Schema keywords at a cost linear in the request, and a time bound on the rest.

jsonschema's own ``pattern`` and ``patternProperties`` match with Python's backtracking
engine (``^(a+)+$`` against 28 ``a`` and a ``!`` is seconds of CPU), and its
``uniqueItems`` compares every pair of items that do not sort (20,000 objects: minutes).
Here patterns are compiled once, at load, by RE2, whose matching is linear in the text
(what RE2 cannot take, lookaround and backreferences, is refused at load), and
``uniqueItems`` puts a canonical form of each item in a set. ``bounded_class`` puts these
in place of jsonschema's in a draft's validator class, with every keyword behind a
clock (the thread's CPU time): a check past its budget raises ``OutOfTime`` within a few
hundred keywords, which bounds what no keyword alone costs (``$ref`` fan-outs over
nested arrays, say).
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Iterator
from functools import cache
from typing import Any

import re2
from jsonschema import validators
from jsonschema.exceptions import ValidationError

# Where the walk for patterns does not look: values that are data, not schemas.
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})
_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a refused pattern is reported once, by the loader
_CANONICAL = json.JSONEncoder(sort_keys=True, ensure_ascii=False, check_circular=False)


class OutOfTime(Exception):
    """The check used up its budget; nothing about the request was decided."""


class PatternProblem(ValueError):
    """A pattern RE2 cannot compile, with RE2's reason."""


class _Budget(threading.local):
    deadline = math.inf
    calls = 0


# A check hands the GIL over every this many keywords (about a millisecond of work): the
# event loop waits for it at every wake-up (each chunk of a body arriving), and a thread
# that never blocks would hold it for the whole switch interval (5 ms) each time.
YIELD_EVERY = 256


_budget = _Budget()


def within(seconds: float) -> _Deadline:
    """``with within(s):`` the keywords checked in this thread raise ``OutOfTime`` once it
    has spent ``s`` seconds of CPU: its own work, not the waits of a busy machine."""
    return _Deadline(seconds)


class _Deadline:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __enter__(self) -> None:
        _budget.deadline = time.thread_time() + self.seconds

    def __exit__(self, *_: object) -> None:
        _budget.deadline = math.inf


@cache
def regex(pattern: str) -> Any:
    """``pattern`` compiled by RE2 (cached: compiled once at load, reused at every check)."""
    try:
        return re2.compile(pattern, _OPTIONS)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        text = reason.decode("utf-8", "replace") if isinstance(reason, bytes) else str(reason)
        raise PatternProblem(text) from None


def patterns(node: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """Every regular expression in a schema (``pattern`` values, ``patternProperties``
    names) with where it is, as ``a/b/c``."""
    if isinstance(node, list):
        for index, item in enumerate(node):
            yield from patterns(item, f"{path}/{index}" if path else str(index))
        return
    if not isinstance(node, dict):
        return
    for key, value in node.items():
        if key in _DATA_KEYWORDS:
            continue
        here = f"{path}/{key}" if path else str(key)
        if key == "pattern" and isinstance(value, str):
            yield here, value
            continue
        if key == "patternProperties" and isinstance(value, dict):
            yield from ((f"{here}/{name}", str(name)) for name in value)
        yield from patterns(value, here)


def keywords_in(node: Any) -> set[str]:
    """The names of every member of every object in a schema, data values aside."""
    found: set[str] = set()
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, value in item.items():
                found.add(str(key))
                if key not in _DATA_KEYWORDS:
                    stack.append(value)
        elif isinstance(item, list):
            stack.extend(item)
    return found


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[Any]:
    if validator.is_type(instance, "string") and regex(pattern).search(instance) is None:
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(
    validator: Any, table: dict[str, Any], instance: Any, schema: Any
) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in table.items():
        compiled = regex(pattern)
        for name, value in instance.items():
            if compiled.search(name) is not None:
                yield from validator.descend(value, subschema, path=name, schema_path=pattern)


def _additional_properties(original: Callable[..., Any]) -> Callable[..., Iterator[Any]]:
    """jsonschema's, except where ``patternProperties`` decides what is additional."""

    def additional(validator: Any, extra: Any, instance: Any, schema: Any) -> Iterator[Any]:
        table = schema.get("patternProperties")
        if not isinstance(table, dict) or not validator.is_type(instance, "object"):
            yield from original(validator, extra, instance, schema) or ()
            return
        named = schema.get("properties", {})
        compiled = [regex(p) for p in table]
        extras = [n for n in instance if n not in named and not any(r.search(n) for r in compiled)]
        if validator.is_type(extra, "object"):
            for name in extras:
                yield from validator.descend(instance[name], extra, path=name)
        elif not extra and extras:
            shown = ", ".join(repr(name) for name in sorted(extras))
            yield ValidationError(
                f"{shown} {'does' if len(extras) == 1 else 'do'} not match any of the "
                f"regexes: {', '.join(repr(p) for p in sorted(table))}"
            )

    return additional


def _integral(value: Any) -> Any:
    """``value`` with each whole float written as an int: JSON Schema's equality holds
    1 and 1.0 equal (and true apart from 1, which the encoder keeps apart)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {key: _integral(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_integral(item) for item in value]
    return value


def _unique_items(validator: Any, unique: Any, instance: Any, schema: Any) -> Iterator[Any]:
    if not unique or not validator.is_type(instance, "array"):
        return
    seen: dict[str, int] = {}
    for index, item in enumerate(instance):
        # A string key: its hash is keyed per process, so no request can make them collide.
        key = _CANONICAL.encode(_integral(item))
        first = seen.setdefault(key, index)
        if first != index:
            yield ValidationError(f"items {first} and {index} are equal; each must differ")
            return


def _timed(keyword: Callable[..., Any]) -> Callable[..., Any]:
    def timed(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
        _budget.calls += 1
        if _budget.calls % YIELD_EVERY == 0:
            time.sleep(0)
            if time.thread_time() > _budget.deadline:
                raise OutOfTime
        return keyword(validator, value, instance, schema)

    return timed


_LINEAR: dict[str, Callable[..., Any]] = {
    "pattern": _pattern,
    "patternProperties": _pattern_properties,
    "uniqueItems": _unique_items,
}


@cache
def bounded_class(validator_class: Any) -> Any:
    """``validator_class`` with the keywords above in place of its own, all of them timed."""
    known = validator_class.VALIDATORS
    keywords = {name: _LINEAR.get(name, check) for name, check in known.items()}
    if "additionalProperties" in known:
        keywords["additionalProperties"] = _additional_properties(known["additionalProperties"])
    timed = {name: _timed(check) for name, check in keywords.items()}
    return validators.extend(validator_class, timed)
