"""TOML text of a parsed table, for ``reconciler providers show``.

Guarantee: ``tomllib.loads(dumps(table)) == table`` for every table ``tomllib`` can
produce (tables, arrays, strings, numbers, booleans, dates and times), so what is
printed is exactly what was loaded.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Mapping
from typing import Any

from reconciler.providers.rules import quoted


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{quoted(str(k))} = {_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"not a TOML value: {type(value).__name__}")


def _table(path: str, table: Mapping[str, Any], lines: list[str]) -> None:
    scalars = [(k, v) for k, v in table.items() if not isinstance(v, Mapping)]
    tables = [(k, v) for k, v in table.items() if isinstance(v, Mapping)]
    if path and (scalars or not tables):
        lines.append(f"[{path}]")
    lines.extend(f"{quoted(str(k))} = {_value(v)}" for k, v in scalars)
    for key, sub in tables:
        if lines and lines[-1] != "":
            lines.append("")
        _table(f"{path}.{quoted(str(key))}" if path else quoted(str(key)), sub, lines)


def dumps(table: Mapping[str, Any]) -> str:
    lines: list[str] = []
    _table("", table, lines)
    return "\n".join(lines) + "\n"
