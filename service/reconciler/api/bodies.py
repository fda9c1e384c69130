"""Reading request bodies with a hard limit, enforced while the body streams in.

Guarantee: an oversized body is refused (413) without being buffered in full,
even from a client that lies in ``Content-Length`` or sends none. A client
that goes away mid-body is ``ClientDisconnected`` (an info line, not an error
with a traceback: anyone can hang up). Parsing is ``core.strict_json``.
"""

from __future__ import annotations

from starlette.requests import ClientDisconnect, Request

from reconciler.errors import ClientDisconnected, InvalidRequest, PayloadTooLarge


async def read_limited(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise InvalidRequest("Content-Length is not a number") from None
        if size > limit:
            raise PayloadTooLarge(f"body is larger than the limit of {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"body is larger than the limit of {limit} bytes")
            chunks.append(chunk)
    except ClientDisconnect:
        raise ClientDisconnected(f"the client went away after {size} bytes of the body") from None
    return b"".join(chunks)
