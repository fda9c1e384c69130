"""A provider's ``request_schema`` in one line for a model: its required fields first.

Pure. ``list_providers`` answers with the schema itself as structured content; its text
names what an agent must put in ``request`` (the required fields with their type, the
allowed values when there are few) and the optional ones by name, so that an agent
reading only the text still starts its first job with a request the schema accepts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

MAX_VALUES = 8
MAX_OPTIONAL = 12


def _values(values: list[Any]) -> str:
    shown = ", ".join(json.dumps(v) if not isinstance(v, str) else v for v in values[:MAX_VALUES])
    return shown + (", ..." if len(values) > MAX_VALUES else "")


def _kind(prop: Any) -> str:
    """What one property must be, briefly: ``one of: a, b``, ``"24h"``, ``string``."""
    if not isinstance(prop, Mapping):
        return "any"
    if "const" in prop:
        return json.dumps(prop["const"])
    if isinstance(prop.get("enum"), list):
        return "one of: " + _values(prop["enum"])
    kind = prop.get("type")
    if isinstance(kind, list):
        kind = " or ".join(str(k) for k in kind)
    if kind == "array" and isinstance(prop.get("items"), Mapping):
        item = _kind(prop["items"])
        return f"array of {item}" if item != "any" else "array"
    text = str(kind) if kind else "any"
    low, high = prop.get("minimum"), prop.get("maximum")
    if low is not None and high is not None:
        text += f" {low}..{high}"
    return text


def _fields(names: list[str], props: Mapping[str, Any]) -> str:
    return ", ".join(f"{name} ({_kind(props.get(name))})" for name in names)


def _alternatives(schema: Mapping[str, Any]) -> list[list[str]]:
    """The required lists of a top-level ``oneOf``/``anyOf`` (one of them must hold)."""
    branches = schema.get("oneOf") or schema.get("anyOf") or []
    found = []
    for branch in branches if isinstance(branches, list) else []:
        if isinstance(branch, Mapping) and isinstance(branch.get("required"), list):
            found.append([str(r) for r in branch["required"]])
    return found


def request_summary(schema: Any) -> str:
    if not isinstance(schema, Mapping):
        return "any JSON object (no request_schema)"
    found = schema.get("properties")
    props: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    required = [str(r) for r in schema.get("required", []) if isinstance(r, str)]
    alternatives = _alternatives(schema)
    parts = [_fields(required, props)] if required else []
    if alternatives:
        parts.append("one of " + " | ".join(_fields(a, props) for a in alternatives))
    text = "required: " + "; and ".join(parts) if parts else "no required fields"
    named = {name for alt in alternatives for name in alt} | set(required)
    optional = [name for name in props if name not in named]
    if optional:
        more = ", ..." if len(optional) > MAX_OPTIONAL else ""
        text += f"; optional: {', '.join(optional[:MAX_OPTIONAL])}{more}"
    if schema.get("additionalProperties") is False:
        text += "; no other fields"
    return text
