"""Reading request bodies with a hard limit, enforced while the body streams in.

Guarantee: an oversized body is refused (413) without being buffered in full,
even from a client that lies in ``Content-Length`` or sends none. A client
that goes away mid-body is ``ClientDisconnected`` (an info line, not an error
with a traceback: anyone can hang up). A body read as JSON must say it is JSON
(``application/json`` or a ``+json`` type; else 415) and is parsed by the one
strict parser of client bodies, ``core.strict_json.parse_request_json``.
"""

from __future__ import annotations

from typing import Any

import anyio
import anyio.to_thread
from starlette.requests import ClientDisconnect, Request

from reconciler.core.errors import (
    ClientDisconnected,
    InvalidRequest,
    PayloadTooLarge,
    UnsupportedMediaType,
)
from reconciler.core.strict_json import parse_request_json

# A body this large takes milliseconds of CPU to parse: long enough, sent by many agents at
# once, to hold up every other request on the loop.
OFF_LOOP_BYTES = 16_384


def too_large(limit: int) -> str:
    return f"body is larger than the limit of {limit} bytes; send a smaller body"


async def read_limited(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise InvalidRequest("Content-Length is not a number") from None
        if size > limit:
            raise PayloadTooLarge(too_large(limit))
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(too_large(limit))
            chunks.append(chunk)
    except ClientDisconnect:
        # The client went away, or the front door cut off a body that arrived too slowly.
        raise ClientDisconnected(f"the client went away after {size} bytes of the body") from None
    return b"".join(chunks)


def is_json_type(content_type: str | None) -> bool:
    """``application/json`` or a structured ``+json`` type, parameters aside."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media == "application/json":
        return True
    return media.startswith("application/") and media.endswith("+json")


def require_json_type(content_type: str | None) -> None:
    if not is_json_type(content_type):
        got = (content_type or "").split(";", 1)[0].strip()[:60] or "none"
        raise UnsupportedMediaType(
            f"Content-Type must be application/json (got {got}); send the body as JSON"
        )


async def read_json(
    request: Request,
    limit: int,
    *,
    optional: bool = False,
    limiter: anyio.CapacityLimiter | None = None,
) -> Any:
    """The body parsed as JSON; ``None`` for an empty body when ``optional``. ``limiter``:
    a body over ``OFF_LOOP_BYTES`` is parsed in a thread it admits, not on the loop."""
    if not optional:  # refused before a byte of it is read
        require_json_type(request.headers.get("content-type"))
    raw = await read_limited(request, limit)
    if optional:
        if not raw.strip():
            return None
        require_json_type(request.headers.get("content-type"))
    if limiter is not None and len(raw) > OFF_LOOP_BYTES:
        return await anyio.to_thread.run_sync(parse_request_json, raw, limiter=limiter)
    return parse_request_json(raw)
