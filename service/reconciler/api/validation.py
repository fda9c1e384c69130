"""Validating what agents send, with messages that say what to fix.

Pure: a parsed JSON value in, a typed request out (or ``InvalidRequest``).
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from reconciler.core.canonical import canonical_json
from reconciler.core.errors import InvalidRequest
from reconciler.core.operator_decision import DecisionRequest
from reconciler.core.states import State
from reconciler.core.strict_json import require_text
from reconciler.core.vocabulary import DecisionAction
from reconciler.providers.create_set import set_conflict
from reconciler.providers.spec import ProviderSpec
from reconciler.storage.operations import MAX_PAGE

MAX_KEY_LENGTH = 200
MAX_METADATA_BYTES = 16_384
MAX_CANCEL_REASON = 500
DEFAULT_PAGE = 50
LIST_FIELDS = {"state", "provider", "done", "limit", "cursor"}

CREATE_FIELDS = {
    "provider",
    "request",
    "idempotency_key",
    "callback_url",
    "deadline_seconds",
    "max_status_requests",
    "metadata",
}


@dataclass(frozen=True)
class CreateRequest:
    provider: str
    request: Any
    idempotency_key: str | None
    callback_url: str | None
    deadline_seconds: float | None
    max_status_requests: int | None
    metadata: dict[str, Any] | None


def _object(body: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(body, dict):
        raise InvalidRequest(f"{what} must be a JSON object, got {_kind(body)}")
    return body


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _unknown(body: Mapping[str, Any], allowed: set[str]) -> None:
    extra = sorted(set(body) - allowed)
    if extra:
        raise InvalidRequest(
            f"unknown field(s): {', '.join(extra)}; allowed: {', '.join(sorted(allowed))}"
        )


def _string(body: Mapping[str, Any], name: str, *, required: bool, max_len: int) -> str | None:
    value = body.get(name)
    if value is None:
        if required:
            raise InvalidRequest(f"'{name}' is required")
        return None
    if not isinstance(value, str):
        raise InvalidRequest(f"'{name}' must be a string, got {_kind(value)}")
    if not value.strip():
        raise InvalidRequest(f"'{name}' must not be empty")
    if len(value) > max_len:
        raise InvalidRequest(f"'{name}' must be at most {max_len} characters")
    return value


def _positive_number(body: Mapping[str, Any], name: str, *, integer: bool) -> float | int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequest(f"'{name}' must be a number, got {_kind(value)}")
    if integer and not (isinstance(value, int) or float(value).is_integer()):
        raise InvalidRequest(f"'{name}' must be a whole number")
    if not math.isfinite(value) or value <= 0:
        raise InvalidRequest(f"'{name}' must be greater than 0")
    return int(value) if integer else float(value)


def parse_create(
    body: Any, known_providers: Mapping[str, object], check_callback: Callable[[str], object]
) -> CreateRequest:
    data = _object(body, "the request body")
    require_text(data)
    _unknown(data, CREATE_FIELDS)
    provider = _string(data, "provider", required=True, max_len=100)
    assert provider is not None
    if provider not in known_providers:
        known = ", ".join(sorted(known_providers)) or "none configured"
        raise InvalidRequest(f"unknown provider '{provider}'; known providers: {known}")
    if "request" not in data:
        raise InvalidRequest("'request' is required: the JSON body of the provider's create call")
    request = _object(data["request"], "'request'")
    key = _string(data, "idempotency_key", required=False, max_len=MAX_KEY_LENGTH)
    callback = _string(data, "callback_url", required=False, max_len=2048)
    if callback is not None:
        check_callback(callback)
    deadline = _positive_number(data, "deadline_seconds", integer=False)
    budget = _positive_number(data, "max_status_requests", integer=True)
    metadata = data.get("metadata")
    if metadata is not None:
        metadata = dict(_object(metadata, "'metadata'"))
        if len(canonical_json(metadata).encode()) > MAX_METADATA_BYTES:
            raise InvalidRequest(f"'metadata' must be at most {MAX_METADATA_BYTES} bytes as JSON")
    return CreateRequest(
        provider=provider,
        request=dict(request),
        idempotency_key=key,
        callback_url=callback,
        deadline_seconds=float(deadline) if deadline is not None else None,
        max_status_requests=int(budget) if budget is not None else None,
        metadata=metadata,
    )


def check_provider_request(req: CreateRequest, spec: ProviderSpec) -> None:
    """What the provider file asks of ``request``: its ``request_schema``, and no field the
    service sets itself (``create.set``: the agent cannot override it)."""
    if spec.request_schema is not None:
        spec.request_schema.check(req.request)
    conflict = set_conflict(req.request, spec.create.set)
    if conflict is not None:
        raise InvalidRequest(conflict)


@dataclass(frozen=True)
class CancelRequest:
    reason: str | None


def parse_cancel(body: Any) -> CancelRequest:
    if body is None:
        return CancelRequest(reason=None)
    data = _object(body, "the request body")
    require_text(data)
    _unknown(data, {"reason"})
    return CancelRequest(reason=_string(data, "reason", required=False, max_len=MAX_CANCEL_REASON))


def parse_decision(body: Any) -> DecisionRequest:
    data = _object(body, "the request body")
    require_text(data)
    _unknown(data, {"action", "extra_seconds", "extra_status_requests"})
    action_text = _string(data, "action", required=True, max_len=20) or ""
    try:
        action = DecisionAction(action_text)
    except ValueError:
        allowed = ", ".join(a.value for a in DecisionAction)
        raise InvalidRequest(f"'action' must be one of: {allowed}") from None
    extra_seconds = _positive_number(data, "extra_seconds", integer=False)
    extra_requests = _positive_number(data, "extra_status_requests", integer=True)
    if action is not DecisionAction.EXTEND and (extra_seconds or extra_requests):
        raise InvalidRequest("'extra_seconds' and 'extra_status_requests' apply only to 'extend'")
    return DecisionRequest(
        action=action,
        extra_seconds=float(extra_seconds) if extra_seconds is not None else None,
        extra_status_requests=int(extra_requests) if extra_requests is not None else None,
    )


@dataclass(frozen=True)
class ListQuery:
    state: State | None = None
    provider: str | None = None
    done: bool | None = None
    limit: int = DEFAULT_PAGE
    cursor: str | None = None


def parse_list(values: Mapping[str, Any], what: str = "field") -> ListQuery:
    """Filters and paging from JSON-typed values (MCP arguments, or converted query text)."""
    require_text(dict(values))
    _unknown_list(values, what)
    state = None
    if values.get("state") is not None:
        try:
            state = State(values["state"])
        except (ValueError, TypeError):
            raise InvalidRequest(
                f"'state' must be one of: {', '.join(s.value for s in State)}"
            ) from None
    done = values.get("done")
    if done is not None and not isinstance(done, bool):
        raise InvalidRequest(f"'done' must be true or false, got {_kind(done)}")
    limit = values.get("limit", DEFAULT_PAGE)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        raise InvalidRequest(f"'limit' must be a whole number from 1 to {MAX_PAGE}")
    for name in ("provider", "cursor"):
        if values.get(name) is not None and not isinstance(values[name], str):
            raise InvalidRequest(f"'{name}' must be a string, got {_kind(values[name])}")
    return ListQuery(
        state=state,
        provider=values.get("provider"),
        done=done,
        limit=limit,
        cursor=values.get("cursor"),
    )


def _unknown_list(values: Mapping[str, Any], what: str) -> None:
    extra = sorted(set(values) - LIST_FIELDS)
    if extra:
        raise InvalidRequest(f"unknown {what}(s): {', '.join(extra)}")


def parse_list_params(params: Mapping[str, str]) -> ListQuery:
    """The same from URL query text: ``limit`` digits, ``done`` true|false."""
    _unknown_list(params, "query parameter")
    values: dict[str, Any] = dict(params)
    if "limit" in params:
        raw = params["limit"]
        values["limit"] = int(raw) if raw.isascii() and raw.isdigit() else -1
    if "done" in params:
        words = {"true": True, "false": False}
        if params["done"] not in words:
            raise InvalidRequest("'done' must be true or false")
        values["done"] = words[params["done"]]
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
