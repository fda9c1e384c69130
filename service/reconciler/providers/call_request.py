"""The one request builder: a call's table (``[create]``, ``[lookup]``, ``[status]``,
``[cancel]``, ``[result]``) and the call's values in, the request's method, path, headers
and body out.

Every call is built the same way: the path template filled with percent-encoded values;
the body (the agent's request for create, an empty object for the other calls) with the
table's ``set`` rules written into it, and for a lookup paged in the body the next
page's cursor; the table's own ``headers`` filled; ``Content-Type: application/json``
when a body is sent and neither the call nor the provider's static headers name another.

Guarantee: the agent cannot override what the service sets. A request that already
holds a set pointer of the create (or holds a non-object where one must be created) is
refused at intake (``set_conflict``), naming the pointer, before anything is stored; at
send time the rules are written into a copy. A value a call cannot carry (an empty or
``..`` path segment, a header value that is not printable ASCII, a placeholder with no
value) refuses the call (``UnsafePathValue``): nothing is sent. Pure.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from reconciler.core.errors import UnsafePathValue
from reconciler.providers.paths import encode_path_value
from reconciler.providers.pointer import MISSING, Pointer
from reconciler.providers.rules import HeaderPairs, SetRule
from reconciler.providers.sections import CallTable
from reconciler.providers.templates import JOB_ID, Values, compiled, render

JSON = "application/json"
CONTENT_TYPE = "content-type"


@dataclass(frozen=True, slots=True)
class CallRequest:
    """A request ready to send under the provider's ``base_url``."""

    method: str
    path: str  # filled and percent-encoded; may carry a query
    headers: HeaderPairs  # the call's own, filled, Content-Type included when there is a body
    content: bytes | None


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


def apply_set(request: Any, rules: Sequence[SetRule], values: Values) -> Any:
    """A copy of ``request`` with every rule written; the request is not changed.

    Intake has refused a create request that conflicts (``set_conflict``); a stored
    request from before the rule existed is written over rather than refused at send time.
    """
    if not rules:
        return request
    body: dict[str, Any] = copy.deepcopy(request) if isinstance(request, dict) else {}
    for rule in rules:
        write(body, rule.pointer, render(rule.value, values))
    return body


def write(body: dict[str, Any], pointer: Pointer, value: Any) -> None:
    """``value`` at ``pointer`` in ``body``, making the objects on the way."""
    if not pointer.tokens:
        return  # "" (the whole document) is never a member to set
    node = body
    for token in pointer.tokens[:-1]:
        child = node.get(token)
        if not isinstance(child, dict):
            child = {}
            node[token] = child
        node = child
    node[pointer.tokens[-1]] = value


def fill_path(template: str, values: Values, *, keep_slashes: bool = False) -> str:
    """A path template filled with percent-encoded values (``keep_slashes``: a job id's ``/``
    stays a segment separator)."""

    def encode(value: str, name: str) -> str:
        return encode_path_value(value, name, keep_slashes=keep_slashes and name == JOB_ID)

    return compiled(template).fill(values, encode)


def _header_value(name: str, template: str, values: Values) -> str:
    value = compiled(template).fill(values)
    if not (value.isascii() and value.isprintable()):
        raise UnsafePathValue(f"the {name} header's value is not printable ASCII once filled")
    return value


def build_request(
    table: CallTable,
    path: str,
    values: Values,
    *,
    request: Any = None,
    typed: bool = False,
    keep_slashes: bool = False,
    page: tuple[Pointer, Any] | None = None,
) -> CallRequest:
    """The request ``table`` describes, for ``path`` (its path, or another of its templates).

    ``request``: the create's body as the agent gave it (None for the other calls, whose
    body starts empty). ``typed``: the provider's static headers name a Content-Type
    already. ``page``: a body-paged lookup's cursor and where it goes. Raises
    ``UnsafePathValue`` for a value the call cannot carry, ``ValueError``/``TypeError`` for
    a body that is not JSON.
    """
    filled = fill_path(path, values, keep_slashes=keep_slashes)
    body = apply_set(request, table.set, values)
    if page is not None:
        body = body if isinstance(body, dict) else {}
        write(body, page[0], page[1])
    headers = [(name, _header_value(name, text, values)) for name, text in table.headers]
    content = None
    if body is not None:
        content = json.dumps(body, separators=(",", ":"), allow_nan=False).encode()
        if not typed and all(name.lower() != CONTENT_TYPE for name, _ in headers):
            headers.insert(0, ("Content-Type", JSON))
    return CallRequest(table.method, filled, tuple(headers), content)
