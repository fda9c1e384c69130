"""Validating what agents send, with messages that say what to fix.

Pure: a parsed JSON value in, a typed request out (or ``InvalidRequest``). The shapes
are the wire models (``reconciler.wire``), which word every refusal; what depends on
the running service (its providers, the callback URL's address) is checked here, after
the shape.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Mapping
from typing import Any

from reconciler.core.errors import InvalidRequest
from reconciler.core.strict_json import require_text
from reconciler.providers.call_request import set_conflict
from reconciler.providers.spec import ProviderSpec
from reconciler.wire import (
    CancelOperation,
    CreateOperation,
    OperationFilter,
    validated,
)


def parse_create(
    body: Any, known_providers: Mapping[str, object], check_callback: Callable[[str], object]
) -> CreateOperation:
    if isinstance(body, dict):
        require_text(body)
    return admit_create(validated(CreateOperation, body), known_providers, check_callback)


def admit_create(
    req: CreateOperation,
    known_providers: Mapping[str, object],
    check_callback: Callable[[str], object],
) -> CreateOperation:
    """What only the running service can check of a well-formed create: its provider and
    the callback URL's address."""
    if req.provider not in known_providers:
        known = ", ".join(sorted(known_providers)) or "none configured"
        raise InvalidRequest(f"unknown provider '{req.provider}'; known providers: {known}")
    if req.callback_url is not None:
        check_callback(req.callback_url)
    return req


def check_provider_request(request: Any, spec: ProviderSpec) -> None:
    """What the provider file asks of a create's request: its ``request_schema``, and no
    field the service sets itself (``create.set``: the agent cannot override it)."""
    if spec.request_schema is not None:
        spec.request_schema.check(request)
    conflict = set_conflict(request, spec.create.set)
    if conflict is not None:
        raise InvalidRequest(conflict)


def parse_cancel(body: Any) -> CancelOperation:
    if body is None:
        return CancelOperation()
    if isinstance(body, dict):
        require_text(body)
    return validated(CancelOperation, body)


def parse_list(values: Mapping[str, Any], what: str = "field") -> OperationFilter:
    """Filters and paging from JSON-typed values (MCP arguments, or converted query text)."""
    require_text(dict(values))
    return validated(OperationFilter, dict(values), unknown=what)


def parse_list_params(params: Mapping[str, str]) -> OperationFilter:
    """The same from URL query text: ``limit`` digits, ``done`` and ``awaiting_decision``
    true|false."""
    values: dict[str, Any] = dict(params)
    if "limit" in params:
        raw = params["limit"]
        values["limit"] = int(raw) if raw.isascii() and raw.isdigit() else -1
    words = {"true": True, "false": False}
    for flag in ("done", "awaiting_decision"):
        if flag in params:
            if params[flag] not in words:
                raise InvalidRequest(f"'{flag}' must be true or false")
            values[flag] = words[params[flag]]
    return parse_list(values, "query parameter")


HISTORY_CURSOR = "seq:"
BAD_HISTORY_CURSOR = "cursor is not valid; pass the next_cursor of a previous history page"


def history_cursor(seq: int | None) -> str | None:
    """The cursor that continues a history page after entry ``seq`` (None at the end)."""
    if seq is None:
        return None
    return base64.urlsafe_b64encode(f"{HISTORY_CURSOR}{seq}".encode()).decode().rstrip("=")


def _history_after(raw: str | None) -> int:
    if raw is None:
        return 0
    try:
        text = base64.urlsafe_b64decode((raw + "=" * (-len(raw) % 4)).encode()).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise InvalidRequest(BAD_HISTORY_CURSOR) from None
    number = text.removeprefix(HISTORY_CURSOR)
    if not text.startswith(HISTORY_CURSOR) or not (number.isascii() and number.isdigit()):
        raise InvalidRequest(BAD_HISTORY_CURSOR)
    return int(number[:18])


def parse_history_params(params: Mapping[str, str], most: int) -> tuple[int, int]:
    """``(limit, after_seq)`` from ``?limit=&cursor=`` of a history request."""
    require_text(dict(params))
    extra = sorted(set(params) - {"limit", "cursor"})
    if extra:
        raise InvalidRequest(f"unknown query parameter(s): {', '.join(extra)}")
    raw_limit = params.get("limit", str(most))
    if not (raw_limit.isascii() and raw_limit.isdigit()) or not 1 <= int(raw_limit[:9]) <= most:
        raise InvalidRequest(f"'limit' must be a whole number from 1 to {most}")
    return int(raw_limit), _history_after(params.get("cursor"))
