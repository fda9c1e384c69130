"""Provider tables (the parsed TOML of a ``[providers.NAME]`` section) varied one key at a time."""

from __future__ import annotations

import copy
from typing import Any

from reconciler.providers.pointer import MISSING


def with_key(data: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of ``data`` with one dotted key set, or removed when ``value`` is MISSING."""
    data = copy.deepcopy(data)
    *parents, leaf = path.split(".")
    target = data
    for key in parents:
        target = target.setdefault(key, {})
    if value is MISSING:
        target.pop(leaf, None)
    else:
        target[leaf] = value
    return data
