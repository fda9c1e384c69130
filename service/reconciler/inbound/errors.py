"""Error answers: every one is JSON ``{"error": {"code", "message"}}``, status decided here.

Guarantee: bad input gets a 4xx that says what to fix, never a 500; a bug is
a 500 with no internals, logged as an error with the operation it concerns.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from reconciler.core import errors

log = logging.getLogger("reconciler.http")

# By family (see the tree in ``reconciler.core.errors``); the most specific class wins.
STATUS: dict[type[errors.ReconcilerError], int] = {
    errors.PayloadTooLarge: 413,
    errors.UnsupportedMediaType: 415,
    errors.InvalidRequest: 400,
    errors.AuthenticationFailed: 401,
    errors.PermissionDenied: 403,
    errors.Gone: 410,
    errors.NotFound: 404,
    errors.Conflict: 409,
    errors.QuotaExceeded: 429,
    # Never sent (nobody is listening); decided here so the answer is not a 500.
    errors.ClientDisconnected: 400,
    # Contention that outlasted the retries is the database's state, not the caller's.
    errors.StorageError: 503,
    errors.RemoteError: 503,
    errors.Bug: 500,
}


class _AsciiJSON(JSONResponse):
    """Error bodies in ASCII JSON: a message that quotes the caller's text renders anyway."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def error_response(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    return _AsciiJSON(
        {"error": {"code": code, "message": message}}, status_code=status, headers=headers
    )


def status_for(exc: errors.ReconcilerError) -> int:
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return 500


async def on_domain_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, errors.ReconcilerError)
    status = status_for(exc)
    if isinstance(exc, errors.Bug):
        log.error(
            "bug: %s",
            exc.message,
            extra={"path": request.url.path, "operation_id": request.path_params.get("op_id")},
            exc_info=exc,
        )
        return error_response(500, "internal", "internal error; the details are in the server log")
    if isinstance(exc, errors.ClientDisconnected):
        log.info("client disconnected: %s", exc.message, extra={"path": request.url.path})
        runtime = getattr(request.app.state, "runtime", None)
        if runtime is not None:
            family = "webhook" if request.url.path.startswith("/webhooks/") else "api"
            runtime.metrics.client_disconnects.labels(family).inc()
        return error_response(status, exc.code, exc.message)
    if status >= 500:
        runtime = getattr(request.app.state, "runtime", None)
        if runtime is not None:  # one outage, not a line per request
            runtime.request_failures.failed(
                "request failed: %s", exc.message, path=request.url.path
            )
        else:
            log.warning("request failed: %s", exc.message, extra={"path": request.url.path})
    headers = None
    if status == 401 and not isinstance(exc, errors.SignatureRejected):
        headers = {"WWW-Authenticate": "Bearer"}
    if status == 503:
        headers = {"Retry-After": "1"}
    if isinstance(exc, errors.QuotaExceeded) and exc.retry_after_seconds is not None:
        headers = {"Retry-After": str(exc.retry_after_seconds)}
    return error_response(status, exc.code, exc.message, headers)


_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 400: "invalid_request"}


async def on_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = _HTTP_CODES.get(exc.status_code, "http_error")
    message = exc.detail if isinstance(exc.detail, str) else "request failed"
    if exc.status_code == 404:
        message = f"no route for {request.method} {request.url.path}"
    elif exc.status_code == 405:
        message = f"{request.method} is not allowed on {request.url.path}"
    return error_response(exc.status_code, code, message, dict(exc.headers or {}) or None)


async def on_unexpected(request: Request, exc: Exception) -> Response:
    log.error("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(500, "internal", "internal error; the details are in the server log")


HANDLERS = {
    errors.ReconcilerError: on_domain_error,
    HTTPException: on_http_error,
    Exception: on_unexpected,
}
