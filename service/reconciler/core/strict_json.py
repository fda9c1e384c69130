"""Strict JSON parsing: UTF-8, bounded depth and number size, errors that say what is wrong.

Guarantee: bad input gets a clear 400, never a 500 or a parser recursing without end.
A JSON escape can spell a lone surrogate (``"\ud800"``), which no database and no
UTF-8 encoder accepts, or a NUL (``"\u0000"``), which PostgreSQL's text and jsonb
refuse: ``require_text`` finds either anywhere in a parsed value (member names too)
and ``require_field_text`` in one value (a path or query parameter, a CLI argument),
naming the field, before any lookup or write. ``parse_request_json`` is the parser of
every body a client sends us: it also refuses duplicate member names, since two
parsers that read one body differently (first wins, last wins) are how request
smuggling starts. ``shown`` caps a caller's value quoted back in an error.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from itertools import accumulate
from typing import Any

from reconciler.core.errors import InvalidRequest

MAX_JSON_DEPTH = 64
MAX_INT_DIGITS = 40


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"integer with more than {MAX_INT_DIGITS} digits")
    return int(text)


def _depth_by_scan(raw: str) -> bool:
    """Whether ``raw`` nests at most ``MAX_JSON_DEPTH`` deep, read a character at a time."""
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


_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def _depth_ok(raw: str) -> bool:
    """``_depth_by_scan``'s answer, in C loops where no string holds an escaped quote.

    A result document has hundreds of brackets, and the scan costs ~100 us of CPU on
    every 4 KB of them. Without ``\\"`` every quote opens or closes a string, so the
    text between them is all there is outside strings; its brackets' running sum is
    the depth.
    """
    if '\\"' in raw:
        return _depth_by_scan(raw)
    outside = "".join(raw.split('"')[0::2]).encode("utf-8", "surrogatepass")
    brackets = outside.translate(None, _NOT_BRACKETS)
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0) <= MAX_JSON_DEPTH


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400 parses as infinity, which JSON cannot say
        raise ValueError(f"number {text[:40]} is out of range")
    return value


# One decoder for every call: json.loads with hooks builds a new decoder each time.
_DECODER = json.JSONDecoder(
    parse_int=_parse_int, parse_float=_parse_float, parse_constant=_reject_constant
)


# The C scanner behind ``parse_json``: reads one value at an index (``(value, end)``), so a
# caller reading many small documents (JSON Lines) pays for no decode set-up per value.
scan_value = _DECODER.scan_once  # type: ignore[attr-defined]


def _unique_members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    members = dict(pairs)
    if len(members) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"member name '{shown(key)}' appears twice in one object")
            seen.add(key)
    return members


_REQUEST_DECODER = json.JSONDecoder(
    parse_int=_parse_int,
    parse_float=_parse_float,
    parse_constant=_reject_constant,
    object_pairs_hook=_unique_members,
)


def parse_json(body: bytes, what: str = "body") -> Any:
    """Decode UTF-8 JSON with bounded depth and integer size; errors say what is wrong."""
    return _decode(_DECODER, body, what)


def parse_request_json(body: bytes, what: str = "body") -> Any:
    """``parse_json`` for what a client sends us: a member name twice in one object is refused."""
    return _decode(_REQUEST_DECODER, body, what)


def _decode(decoder: json.JSONDecoder, body: bytes, what: str) -> Any:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidRequest(f"{what} is not valid UTF-8") from None
    if not text.strip():
        raise InvalidRequest(f"{what} is empty; send a JSON object")
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH and not _depth_ok(text):
        raise InvalidRequest(f"{what} nests deeper than {MAX_JSON_DEPTH} levels")
    try:
        return decoder.decode(text)
    except (ValueError, RecursionError) as exc:
        raise InvalidRequest(f"{what} is not valid JSON: {exc}") from None


MAX_SHOWN = 80


def shown(value: str, limit: int = MAX_SHOWN) -> str:
    """``value`` for an error message, cut to ``limit`` characters (with its length)."""
    if len(value) <= limit:
        return value
    return f"{value[:limit]}... ({len(value)} characters)"


def is_storable(value: str) -> bool:
    """Whether both backends can store ``value``: UTF-8 text without a NUL character."""
    return "\x00" not in value and is_text(value)


def _unstorable(value: str) -> str:
    if "\x00" in value:
        return "holds a NUL character (\\u0000), which the database cannot store"
    return (
        "is not valid Unicode text (it holds a lone surrogate such as \\ud800, "
        "which UTF-8 cannot encode)"
    )


def require_field_text(field: str, value: str) -> None:
    """Refuse one value (a path or query parameter, an argument) that cannot be stored."""
    if not is_storable(value):
        raise InvalidRequest(f"'{field}' {_unstorable(value)}; send text")


def is_text(value: str) -> bool:
    """Whether ``value`` is Unicode text UTF-8 can encode (no lone surrogate)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _pointer_token(key: str) -> str:
    # Shown escaped: the key itself may be the invalid text.
    shown = json.dumps(key)[1:-1]
    return shown.replace("~", "~0").replace("/", "~1")


def _strings(value: Any) -> Iterator[tuple[str, str, bool]]:
    """Every string in ``value`` (member names too) with its JSON pointer; depth is bounded."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            yield path, item, False
        elif isinstance(item, dict):
            for key, child in item.items():
                where = f"{path}/{_pointer_token(str(key))}"
                yield where, str(key), True
                stack.append((child, where))
        elif isinstance(item, list):
            stack.extend((child, f"{path}/{i}") for i, child in enumerate(item))


def escaped(text: str, limit: int = MAX_SHOWN) -> str:
    """``text`` with every character no database can store, and every other control
    character, written as a visible escape (``\\u0000``, ``\\ud800``); cut to about
    ``limit`` characters around the first such escape."""
    first = next((i for i, ch in enumerate(text) if not _plain(ch)), 0)
    start = max(0, first - limit // 2)
    window = text[start : start + limit]
    shown = "".join(ch if _plain(ch) else f"\\u{ord(ch):04x}" for ch in window)
    return ("…" if start else "") + shown + ("…" if start + limit < len(text) else "")


def _plain(ch: str) -> bool:
    code = ord(ch)
    return code >= 0x20 and code != 0x7F and not 0xD800 <= code <= 0xDFFF


# What no encoder can write (a lone surrogate) or no database can store (NUL); in JSON text
# written with ensure_ascii=False a NUL is the escape ``\\u0000``.
_UNSHOWABLE = re.compile("[\x00\ud800-\udfff]")
_UNSHOWABLE_JSON = re.compile(r"[\ud800-\udfff]|\\u0000")
# One encoder for every check (``json.dumps`` with options builds a new one each call).
_AS_TEXT = json.JSONEncoder(ensure_ascii=False, default=str, check_circular=False)


def visible(value: Any) -> Any:
    """``value`` with each NUL and lone surrogate in its strings (member names too) written
    as a visible escape (``\\u0000``, ``\\ud800``): what every door shows of stored text, so
    no answer fails to encode. The same object when there is none (the common case, found
    by one encoding of the value rather than a walk)."""
    if isinstance(value, str):
        return _UNSHOWABLE.sub(_escape_match, value) if _UNSHOWABLE.search(value) else value
    if not isinstance(value, dict | list | tuple):
        return value
    text = json.dumps(value, ensure_ascii=False, default=str, check_circular=False)
    if _UNSHOWABLE_JSON.search(text) is None:
        return value
    return _rebuilt(value)


def _rebuilt(value: Any) -> Any:
    if isinstance(value, str):
        return _UNSHOWABLE.sub(_escape_match, value)
    if isinstance(value, dict):
        return {_rebuilt(k) if isinstance(k, str) else k: _rebuilt(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_rebuilt(v) for v in value]
    return value


def _escape_match(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def _surely_storable(value: Any) -> bool:
    """True when every string in ``value`` can be stored, found by one encoding of it (the
    usual case) rather than a walk; False means only "walk to find out"."""
    if isinstance(value, str):
        return is_storable(value)
    return _UNSHOWABLE_JSON.search(_AS_TEXT.encode(value)) is None


def first_unstorable(value: Any) -> tuple[str, str] | None:
    """The first string (member names too) no database can store, as (its JSON pointer,
    the string escaped); None when every string can be stored."""
    if _surely_storable(value):
        return None
    for path, text, _ in _strings(value):
        if not is_storable(text):
            return path or "/", escaped(text)
    return None


def require_text(body: Any) -> None:
    """Refuse text no database can store (NUL, a lone surrogate) anywhere in a body, by field."""
    if _surely_storable(body):
        return
    for path, text, is_name in _strings(body):
        if is_storable(text):
            continue
        field, _, rest = path.lstrip("/").partition("/")
        where = f"'{field}'" + (f" at /{rest}" if rest else "")
        what = "a member name" if is_name else "a string"
        raise InvalidRequest(
            f"{where}: {what} {_unstorable(text)}; send text, or base64 for binary data"
        )
