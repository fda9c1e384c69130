"""A provider's ``request_schema`` in words for a model: what is required, then every field.

Pure. ``list_providers`` answers with the schema itself as structured content; its text
names what an agent must put in ``request`` (the required fields) and then every field,
one a line, with its type, its allowed values and the schema's own ``description``, so
that an agent reading only the text knows every knob it may turn. Nothing is cut off:
a field left out of the text is a field an agent cannot know about.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def _value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _kind(prop: Any) -> str:
    """What one property must be: ``one of: a, b``, ``"24h"``, ``number 0..60``, ``string``."""
    if not isinstance(prop, Mapping):
        return "any"
    if "const" in prop:
        return json.dumps(prop["const"])
    if isinstance(prop.get("enum"), list):
        return "one of: " + ", ".join(_value(v) for v in prop["enum"])
    branches = prop.get("anyOf") or prop.get("oneOf")
    if isinstance(branches, list) and branches:
        return " or ".join(_kind(b) for b in branches)
    kind = prop.get("type")
    if isinstance(kind, list):
        kind = " or ".join(str(k) for k in kind)
    if kind == "array" and isinstance(prop.get("items"), Mapping):
        item = _kind(prop["items"])
        return f"array of {item}" if item != "any" else "array"
    if kind == "object" and isinstance(prop.get("properties"), Mapping):
        inner = prop["properties"].items()
        return "object with " + ", ".join(f"{k} ({_kind(v)})" for k, v in inner)
    text = str(kind) if kind else "any"
    low, high = prop.get("minimum"), prop.get("maximum")
    if low is not None and high is not None:
        text += f" {low}..{high}"
    elif low is not None:
        text += f" from {low}"
    elif high is not None:
        text += f" up to {high}"
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


def _properties(schema: Mapping[str, Any]) -> Mapping[str, Any]:
    found = schema.get("properties")
    return found if isinstance(found, Mapping) else {}


def request_summary(schema: Any) -> str:
    """One line: the required fields, and whether fields the schema does not name may come."""
    if not isinstance(schema, Mapping):
        return "any JSON object (no request_schema)"
    props = _properties(schema)
    required = [str(r) for r in schema.get("required", []) if isinstance(r, str)]
    alternatives = _alternatives(schema)
    parts = [_fields(required, props)] if required else []
    if alternatives:
        parts.append("one of " + " | ".join(_fields(a, props) for a in alternatives))
    text = "required: " + "; and ".join(parts) if parts else "no required fields"
    if schema.get("additionalProperties") is False:
        text += "; no other fields"
    return text


def field_lines(schema: Any) -> list[str]:
    """Every field the schema names, one a line: its type and values, then its description."""
    if not isinstance(schema, Mapping):
        return []
    required = {str(r) for r in schema.get("required", []) if isinstance(r, str)}
    lines = []
    for name, prop in _properties(schema).items():
        line = f"{name} ({_kind(prop)}{', required' if name in required else ''})"
        description = prop.get("description") if isinstance(prop, Mapping) else None
        if isinstance(description, str) and description.strip():
            line += f": {' '.join(description.split())}"
        lines.append(line)
    return lines
