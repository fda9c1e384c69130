"""Bearer-token authentication for the agent API and ``/mcp`` (one check for both), and the
token cache the console shares.

Verified tokens are remembered for a few seconds (by digest, never the token
itself) so that a busy agent does not cost a database read per request;
a token revoked in the database stops working within that window, and an
expired one at its expiry, cached or not. Console sessions are remembered by
token row in the same cache, with the same window.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio
from sqlalchemy.engine import Connection
from starlette.requests import Request

from reconciler.core.errors import AuthenticationFailed, ReconcilerError
from reconciler.core.principal import Principal
from reconciler.runtime import Runtime
from reconciler.storage.tokens import authenticate, digest, principal_by_id

CACHE_SECONDS = 5.0
CACHE_LIMIT = 10_000

T = TypeVar("T")


async def cached_principal(
    runtime: Runtime, key: str | None, lookup: Callable[[Connection], Principal]
) -> Principal:
    """``lookup`` on a read connection, unless ``key`` was verified in the last few seconds.

    A lookup that raises (unknown or revoked) is never remembered.
    """
    cache = runtime.token_cache
    if key is not None:
        hit = cache.get(key)
        if hit is not None and hit[1] > time.monotonic():
            expires = hit[0].expires_at
            if expires is not None and expires <= runtime.clock.now():
                raise AuthenticationFailed("the bearer token has expired")
            return hit[0]

    def _lookup() -> Principal:
        with runtime.db.read() as conn:
            return lookup(conn)

    found = await runtime.db.run(_lookup)
    if key is not None:
        if len(cache) >= CACHE_LIMIT:
            cache.clear()
        cache[key] = (found, time.monotonic() + CACHE_SECONDS)
    return found


async def principal(request: Request) -> Principal:
    runtime: Runtime = request.app.state.runtime
    return await principal_for(runtime, request.headers.get("authorization"))


async def principal_for(runtime: Runtime, header: str | None) -> Principal:
    """Who sends this ``Authorization`` header, or ``AuthenticationFailed``."""
    key = digest(header) if header else None
    now = runtime.clock.now()
    return await cached_principal(runtime, key, lambda conn: authenticate(conn, header, now))


async def session_principal(runtime: Runtime, token_id: int) -> Principal:
    """The principal of the token a console session was signed in with, while that token
    is still valid (``AuthenticationFailed`` once it is not), cached by token row."""
    return await cached_principal(
        runtime,
        f"console:{token_id}",
        lambda conn: principal_by_id(conn, token_id, runtime.clock.now()),
    )


async def until_refused(runtime: Runtime, header: str | None) -> str:
    """Returns, with the reason, once the token in ``header`` stops working (revoked, expired).

    Storage trouble proves nothing about the token: the check is tried again next time.
    """
    while True:
        await anyio.sleep(runtime.token_recheck_seconds)
        try:
            await principal_for(runtime, header)
        except AuthenticationFailed as exc:
            return exc.message
        except ReconcilerError:
            continue


async def while_authorized(runtime: Runtime, header: str | None, work: Awaitable[T]) -> T:
    """``work``'s answer, unless its token stops working first: then ``work`` is cancelled
    and ``AuthenticationFailed`` (401) says why. ``work``'s own errors pass unchanged."""
    job = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(until_refused(runtime, header))
    try:
        await asyncio.wait((job, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (job, watcher):
            task.cancel()
        await asyncio.gather(job, watcher, return_exceptions=True)
    if job.done() and not job.cancelled():
        return job.result()
    raise AuthenticationFailed(f"{watcher.result()}; the request was ended while it waited")
