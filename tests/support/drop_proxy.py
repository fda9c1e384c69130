"""A reverse proxy on loopback that can lose a create's answer on its way back.

Between the service and a real provider (Ray's Jobs API), it forwards every request
as it is. When armed, the next request that matches is forwarded too, so the provider
acts on it, and the provider's answer is then thrown away: the client sees its
connection closed before a complete answer, exactly as when a network drops it.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from reconciler.demo.sim.responses import DroppedResponse
from tests.support import loopback
from tests.support.servers import serve_asgi

# Hop-by-hop and framing headers: the proxy's own connection sets them.
_SKIPPED = {"host", "connection", "keep-alive", "transfer-encoding", "content-length"}


@dataclass(frozen=True)
class Forwarded:
    method: str
    path: str
    status: int
    dropped: bool


@dataclass
class DropProxy:
    upstream: str
    forwarded: list[Forwarded] = field(default_factory=list)
    _armed: tuple[str, str] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def drop_next(self, method: str, path: str) -> None:
        """Forward the next ``method path`` request, then lose the provider's answer."""
        with self._lock:
            self._armed = (method, path)

    def _take(self, method: str, path: str) -> bool:
        with self._lock:
            if self._armed == (method, path):
                self._armed = None
                return True
            return False

    def seen(self, method: str, path: str) -> list[Forwarded]:
        with self._lock:
            return [f for f in self.forwarded if (f.method, f.path) == (method, path)]

    def app(self) -> Starlette:
        client: httpx.AsyncClient | None = None

        @asynccontextmanager
        async def lifespan(_: Starlette) -> AsyncIterator[None]:
            nonlocal client
            async with loopback.async_client(base_url=self.upstream, timeout=60) as client:
                yield

        async def forward(request: Request) -> Response:
            assert client is not None
            headers = {k: v for k, v in request.headers.items() if k.lower() not in _SKIPPED}
            answer = await client.request(
                request.method,
                request.url.path,
                params=request.query_params,
                content=await request.body(),
                headers=headers,
            )
            drop = self._take(request.method, request.url.path)
            with self._lock:
                self.forwarded.append(
                    Forwarded(request.method, request.url.path, answer.status_code, drop)
                )
            if drop:
                return DroppedResponse()
            kept = {
                k: v
                for k, v in answer.headers.items()
                if k.lower() not in _SKIPPED | {"content-encoding"}
            }
            return Response(answer.content, status_code=answer.status_code, headers=kept)

        methods = ["GET", "POST", "PUT", "DELETE", "PATCH"]
        return Starlette(
            routes=[Route("/{path:path}", forward, methods=methods)], lifespan=lifespan
        )


@contextmanager
def drop_proxy(upstream: str) -> Iterator[tuple[DropProxy, str]]:
    """The proxy in front of ``upstream``; yields it and its ``http://127.0.0.1:<port>``."""
    proxy = DropProxy(upstream)
    with serve_asgi(proxy.app()) as url:
        yield proxy, url
