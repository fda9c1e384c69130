"""Bearer-token authentication for the agent API."""

from __future__ import annotations

from starlette.requests import Request

from reconciler.runtime import Runtime
from reconciler.tokens import Principal, authenticate


async def principal(request: Request) -> Principal:
    runtime: Runtime = request.app.state.runtime
    header = request.headers.get("authorization")

    def _lookup() -> Principal:
        with runtime.db.read() as conn:
            return authenticate(conn, header)

    return await runtime.db.run(_lookup)
