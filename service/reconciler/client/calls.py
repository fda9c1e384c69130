"""The agent API's calls as values, and its answers mapped back to the error tree.

Pure: the sync and async clients only send what a ``Call`` describes and hand
the answer to ``decode``. Guarantee: an error answer raises the class of its
``error.code`` (``reconciler.core.errors``), a 5xx or an unreadable answer
``ServiceError``; a call is marked idempotent only when sending it twice cannot
make a second job, which is what allows a retry after a connection error.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import quote

from reconciler.client.model import (
    HistoryPage,
    Operation,
    Page,
    Provider,
    providers_from_json,
)
from reconciler.core import errors

T = TypeVar("T")

DEFAULT_WAIT_STEP = 60.0  # the service's default cap on one long-poll
USER_AGENT = "reconciler-client"

# error.code → class; codes not listed fall back on the HTTP status family.
_CODES: dict[str, type[errors.ReconcilerError]] = {
    cls.code: cls
    for cls in (
        errors.InvalidRequest,
        errors.PayloadTooLarge,
        errors.AuthenticationFailed,
        errors.PermissionDenied,
        errors.NotFound,
        errors.Gone,
        errors.Conflict,
        errors.IdempotencyConflict,
        errors.DecisionNotAllowed,
    )
}
_STATUSES: dict[int, type[errors.ReconcilerError]] = {
    401: errors.AuthenticationFailed,
    403: errors.PermissionDenied,
    404: errors.NotFound,
    410: errors.Gone,
    409: errors.Conflict,
    413: errors.PayloadTooLarge,
}


# A history is paged by the service; a client follows at most this many pages.
MAX_HISTORY_PAGES = 10_000


@dataclass(frozen=True)
class Call(Generic[T]):
    method: str
    path: str
    parse: Callable[[Any], T]
    params: Mapping[str, str] | None = None
    body: Any = None
    has_body: bool = False
    idempotent: bool = True
    timeout: float | None = None  # overrides the client's default for this call


def _segment(op_id: str) -> str:
    if not isinstance(op_id, str) or not op_id:
        raise errors.InvalidRequest("the operation id must be a non-empty string")
    return quote(op_id, safe="")


def _drop_none(values: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def start(
    provider: str,
    request: Mapping[str, Any],
    *,
    idempotency_key: str | None,
    callback_url: str | None,
    deadline_seconds: float | None,
    max_status_requests: int | None,
    metadata: Mapping[str, Any] | None,
) -> Call[Operation]:
    body = _drop_none(
        {
            "provider": provider,
            "request": request,
            "idempotency_key": idempotency_key,
            "callback_url": callback_url,
            "deadline_seconds": deadline_seconds,
            "max_status_requests": max_status_requests,
            "metadata": metadata,
        }
    )
    # Without a key a resend could make a second job; with one it returns the first.
    return Call(
        "POST",
        "/v1/operations",
        Operation.from_json,
        body=body,
        has_body=True,
        idempotent=idempotency_key is not None,
    )


def get(op_id: str) -> Call[Operation]:
    return Call("GET", f"/v1/operations/{_segment(op_id)}", Operation.from_json)


def wait(op_id: str, seconds: float, margin: float) -> Call[Operation]:
    """One long-poll; its HTTP timeout is the wait itself plus ``margin``."""
    return Call(
        "GET",
        f"/v1/operations/{_segment(op_id)}/wait",
        Operation.from_json,
        params={"timeout_seconds": f"{max(0.0, seconds):.3f}"},
        timeout=seconds + margin,
    )


def cancel(op_id: str, reason: str | None) -> Call[Operation]:
    # Recording the intent twice changes nothing: safe to resend.
    return Call(
        "POST",
        f"/v1/operations/{_segment(op_id)}/cancel",
        Operation.from_json,
        body=_drop_none({"reason": reason}),
        has_body=True,
    )


def _flag(value: bool | None) -> str | None:
    return None if value is None else ("true" if value else "false")


def listing(
    *,
    state: str | None,
    provider: str | None,
    done: bool | None,
    limit: int | None,
    cursor: str | None,
    awaiting_decision: bool | None = None,
) -> Call[Page]:
    params = _drop_none(
        {
            "state": state,
            "provider": provider,
            "done": _flag(done),
            "awaiting_decision": _flag(awaiting_decision),
            "limit": None if limit is None else str(limit),
            "cursor": cursor,
        }
    )
    return Call("GET", "/v1/operations", Page.from_json, params=params)


def history(op_id: str, cursor: str | None = None) -> Call[HistoryPage]:
    params = _drop_none({"cursor": cursor})
    path = f"/v1/operations/{_segment(op_id)}/history"
    return Call("GET", path, HistoryPage.from_json, params=params)


def providers() -> Call[list[Provider]]:
    return Call("GET", "/v1/providers", providers_from_json)


def _wait_cap(document: Any) -> float:
    """The ``maximum`` of the wait endpoint's ``timeout_seconds`` in the OpenAPI document."""
    try:
        parameters = document["paths"]["/v1/operations/{op_id}/wait"]["get"]["parameters"]
        for parameter in parameters:
            if parameter.get("name") == "timeout_seconds":
                cap = float(parameter["schema"]["maximum"])
                return cap if cap > 0 else DEFAULT_WAIT_STEP
    except (KeyError, TypeError, ValueError):
        pass
    return DEFAULT_WAIT_STEP


def wait_cap() -> Call[float]:
    return Call("GET", "/openapi.json", _wait_cap)


def error_for(status: int, content: bytes) -> errors.ReconcilerError:
    """The exception an error answer stands for, with the service's own message."""
    code, message = None, None
    try:
        error = json.loads(content).get("error")
        if isinstance(error, dict):
            code, message = error.get("code"), error.get("message")
    except (ValueError, AttributeError):
        pass
    text = message if isinstance(message, str) and message else f"HTTP {status}"
    if status >= 500 or status < 400:
        return errors.ServiceError(f"the service failed: {text}", status)
    cls = _CODES.get(code) if isinstance(code, str) else None
    cls = cls or _STATUSES.get(status, errors.InvalidRequest)
    exc = cls(text)
    if isinstance(code, str):
        exc.code = code  # the service's own word, also for codes this client does not know
    return exc


def decode(call: Call[T], status: int, content: bytes) -> T:
    if not 200 <= status < 300:
        raise error_for(status, content)
    try:
        data = json.loads(content)
    except ValueError:
        raise errors.ServiceError("the service's answer is not JSON", status) from None
    return call.parse(data)
