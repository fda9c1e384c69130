"""``[create.set]``: what the service writes into the agent's request before it is sent.

Guarantee: the agent cannot override what the service sets. A request that already
holds a set pointer (or holds a non-object where one must be created) is refused at
intake, naming the pointer, before anything is stored; at send time the rules are
applied to a copy of the stored request. Templates are filled by plain replacement of
the four known names, so a brace elsewhere in a value is kept as written. Pure.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from reconciler.providers.pointer import MISSING, Pointer
from reconciler.providers.spec import SetRule

TEMPLATE_NAMES = ("idempotency_key", "operation_id", "trace_id", "webhook_url")


def fill(template: str, values: Mapping[str, str | None]) -> str:
    """``template`` with each ``{name}`` of ``TEMPLATE_NAMES`` replaced by its value."""
    text = template
    for name in TEMPLATE_NAMES:
        value = values.get(name)
        if value is not None:
            text = text.replace("{" + name + "}", value)
    return text


def render(value: Any, values: Mapping[str, str | None]) -> Any:
    """A JSON value with every string in it (nested too) filled as a template."""
    if isinstance(value, str):
        return fill(value, values)
    if isinstance(value, list | tuple):
        return [render(v, values) for v in value]
    if isinstance(value, dict):
        return {k: render(v, values) for k, v in value.items()}
    return value


def set_conflict(request: Any, rules: Sequence[SetRule]) -> str | None:
    """Why ``request`` cannot take the rules (a one-line problem naming the pointer), or None."""
    if not rules:
        return None
    if request is not None and not isinstance(request, dict):
        return "'request' must be a JSON object: the provider file sets fields in it"
    for rule in rules:
        node: Any = request or {}
        for depth, token in enumerate(rule.pointer.tokens):
            if not isinstance(node, dict):
                parent = "/" + "/".join(rule.pointer.tokens[:depth])
                return (
                    f"'request' holds a non-object at {parent}, where the service sets "
                    f"{rule.pointer}"
                )
            node = node.get(token, MISSING)
            if node is MISSING:
                break
        else:
            return (
                f"'request' may not hold {rule.pointer}: the service sets it "
                "(see the provider's create.set)"
            )
    return None


def apply_set(request: Any, rules: Sequence[SetRule], values: Mapping[str, str | None]) -> Any:
    """A copy of ``request`` with every rule written; the request is not changed.

    Intake has refused a request that conflicts (``set_conflict``); a stored request
    from before the rule existed is written over rather than refused at send time.
    """
    if not rules:
        return request
    body: dict[str, Any] = copy.deepcopy(request) if isinstance(request, dict) else {}
    for rule in rules:
        _write(body, rule.pointer, render(rule.value, values))
    return body


def _write(body: dict[str, Any], pointer: Pointer, value: Any) -> None:
    if not pointer.tokens:
        return  # "" (the whole document) is never a field to set
    node = body
    for token in pointer.tokens[:-1]:
        child = node.get(token)
        if not isinstance(child, dict):
            child = {}
            node[token] = child
        node = child
    node[pointer.tokens[-1]] = value
