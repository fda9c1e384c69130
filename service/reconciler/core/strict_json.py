"""Strict JSON parsing: UTF-8, bounded depth and integer size, errors that say what is wrong.

Guarantee: bad input gets a clear 400, never a 500 or a parser recursing without end.
"""

from __future__ import annotations

import json
from typing import Any

from reconciler.errors import InvalidRequest

MAX_JSON_DEPTH = 64
MAX_INT_DIGITS = 40


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"integer with more than {MAX_INT_DIGITS} digits")
    return int(text)


def _depth_ok(raw: str) -> bool:
    """Cheap pre-check so absurd nesting is refused before the parser recurses."""
    depth = 0
    in_string = False
    escaped = False
    for ch in raw:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                return False
        elif ch in "]}":
            depth -= 1
    return True


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


# One decoder for every call: json.loads with hooks builds a new decoder each time.
_DECODER = json.JSONDecoder(parse_int=_parse_int, parse_constant=_reject_constant)


def parse_json(body: bytes, what: str = "body") -> Any:
    """Decode UTF-8 JSON with bounded depth and integer size; errors say what is wrong."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidRequest(f"{what} is not valid UTF-8") from None
    if not text.strip():
        raise InvalidRequest(f"{what} is empty; send a JSON object")
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH and not _depth_ok(text):
        raise InvalidRequest(f"{what} nests deeper than {MAX_JSON_DEPTH} levels")
    try:
        return _DECODER.decode(text)
    except (ValueError, RecursionError) as exc:
        raise InvalidRequest(f"{what} is not valid JSON: {exc}") from None
