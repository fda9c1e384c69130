"""Every error answer is JSON ``{"error": {"code", "message"}}``; status codes are decided here."""

from __future__ import annotations

import logging

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from reconciler import errors

log = logging.getLogger("reconciler.http")

STATUS: dict[type[errors.ReconcilerError], int] = {
    errors.PayloadTooLarge: 413,
    errors.InvalidRequest: 400,
    errors.AuthenticationFailed: 401,
    errors.SignatureInvalid: 401,
    errors.PermissionDenied: 403,
    errors.NotFound: 404,
    errors.Conflict: 409,
    errors.IllegalTransition: 409,
    errors.StaleWrite: 409,
    errors.StorageUnavailable: 503,
}


def error_response(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(
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
    if status >= 500:
        log.warning("request failed: %s", exc.message, extra={"path": request.url.path})
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    if status == 503:
        headers = {"Retry-After": "1"}
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
