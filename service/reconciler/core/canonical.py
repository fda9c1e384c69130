"""Canonical JSON and the fingerprints made from it.

Two texts, for two jobs. ``canonical_json`` is the stable text the history hash
chain covers: it must never change, or every stored chain would stop
verifying. ``fingerprint_json`` decides whether two requests are the same
request, so it compares values, not spellings: RFC 8785 (JCS) ordering and
number forms, so ``1``, ``1.0`` and ``1e0`` are one number. Integers are kept
exact (JCS would round them to a double and call ``2**53`` and ``2**53 + 1``
one request); every other number is written as ECMAScript writes the double.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

# One encoder for every call: json.dumps with options builds a new encoder each time, and
# this runs for every history entry.
_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)
_STRING = json.JSONEncoder(ensure_ascii=False)
# Doubles hold every integer up to this exactly; an integral float inside it is that integer.
_EXACT_INTEGERS = 2**53


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, UTF-8 kept as is: one text per JSON value."""
    return _CANONICAL.encode(value)


def es_number(value: float) -> str:
    """A finite double as ECMAScript's Number::toString writes it (RFC 8785, section 3.2.2.3)."""
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError("NaN and infinities are not JSON numbers")
    if value == 0:
        return "0"
    if value < 0:
        return "-" + es_number(-value)
    mantissa, _, exponent = repr(value).partition("e")  # repr: the shortest round-trip digits
    whole, _, fraction = mantissa.partition(".")
    digits = (whole + fraction).lstrip("0")
    significant = digits.rstrip("0")
    k = len(significant)
    # value = significant x 10^(n - k)
    n = int(exponent or 0) - len(fraction) + (len(digits) - k) + k
    if k <= n <= 21:
        return significant + "0" * (n - k)
    if 0 < n <= 21:
        return significant[:n] + "." + significant[n:]
    if -6 < n <= 0:
        return "0." + "0" * (-n) + significant
    sign = "+" if n - 1 >= 0 else "-"
    head = significant if k == 1 else significant[0] + "." + significant[1:]
    return f"{head}e{sign}{abs(n - 1)}"


def _number(value: int | float) -> str:
    if isinstance(value, int):
        return str(value)
    if value.is_integer() and abs(value) < _EXACT_INTEGERS:
        return str(int(value))
    return es_number(value)


def fingerprint_json(value: Any) -> str:
    """RFC 8785 text of ``value``, integers exact: equal JSON values give equal text."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int | float):
        return _number(value)
    if isinstance(value, str):
        return _STRING.encode(value)
    if isinstance(value, list | tuple):
        return "[" + ",".join(fingerprint_json(item) for item in value) + "]"
    if isinstance(value, dict):
        # RFC 8785 orders members by their names' UTF-16 code units.
        keys = sorted(value, key=lambda k: str(k).encode("utf-16-be"))
        members = (_STRING.encode(str(k)) + ":" + fingerprint_json(value[k]) for k in keys)
        return "{" + ",".join(members) + "}"
    raise TypeError(f"not a JSON value: {type(value).__name__}")


def request_fingerprint(provider: str, request: Any) -> str:
    """SHA-256 of the RFC 8785 text of provider and request (docs/design.md#idempotency-keys)."""
    text = fingerprint_json({"provider": provider, "request": request})
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def same_json(a: Any, b: Any) -> bool:
    """Whether two JSON values are equal as values (numbers by value, keys in any order)."""
    return fingerprint_json(a) == fingerprint_json(b)
