"""Where the tools' work is done: in this process (``/mcp``), or by a running service (stdio).

Both answer with the Operation as the HTTP API shows it (a JSON object) and
raise the ``reconciler.core.errors`` families, so the tool layer above them is one
piece of code. ``LocalBackend`` calls ``commands.agent_actions`` (the HTTP routes' own
actions) for one authenticated principal; ``RemoteBackend`` calls the HTTP API
through ``reconciler.client`` with the token it was started with.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

from reconciler.client import AsyncClient
from reconciler.commands import agent_actions
from reconciler.core.principal import Principal
from reconciler.runtime import Runtime
from reconciler.wire import CreateOperation, OperationFilter

View = dict[str, Any]


class Backend(Protocol):
    async def start(self, body: CreateOperation) -> View: ...

    async def get(self, op_id: str) -> View: ...

    async def wait(self, op_id: str, timeout: float) -> View: ...

    async def cancel(self, op_id: str) -> View: ...

    async def list(self, query: OperationFilter) -> View: ...

    async def providers(self) -> View: ...

    def now(self) -> datetime:
        """The time the views are read against (a task's next poll is counted from it)."""
        ...


class LocalBackend:
    def __init__(
        self, runtime: Runtime, who: Principal, headers: Mapping[str, str] | None = None
    ) -> None:
        self.rt, self.who, self.headers = runtime, who, headers

    async def start(self, body: CreateOperation) -> View:
        op, created = await agent_actions.start_validated(self.rt, self.who, body, self.headers)
        return await agent_actions.render(self.rt, op, replayed=not created)

    async def get(self, op_id: str) -> View:
        return await agent_actions.render(
            self.rt, await agent_actions.load_visible(self.rt, op_id, self.who)
        )

    async def wait(self, op_id: str, timeout: float) -> View:
        deadline = asyncio.get_running_loop().time() + timeout
        return await agent_actions.render(
            self.rt, await agent_actions.wait_until(self.rt, op_id, self.who, deadline)
        )

    async def cancel(self, op_id: str) -> View:
        return await agent_actions.render(
            self.rt, await agent_actions.cancel(self.rt, self.who, op_id, None)
        )

    async def list(self, query: OperationFilter) -> View:
        return await agent_actions.page(self.rt, self.who, query)

    async def providers(self) -> View:
        return await agent_actions.providers(self.rt, self.who)

    def now(self) -> datetime:
        return self.rt.clock.now()


class RemoteBackend:
    def __init__(self, client: AsyncClient) -> None:
        self.client = client

    async def start(self, body: CreateOperation) -> View:
        # The service validates it again at its own door: the same model, the same words.
        args = body.model_dump(exclude_none=True)
        op = await self.client.start(args.pop("provider"), args.pop("request"), **args)
        return dict(op.raw)

    async def get(self, op_id: str) -> View:
        return dict((await self.client.get(op_id)).raw)

    async def wait(self, op_id: str, timeout: float) -> View:
        return dict((await self.client.wait(op_id, max_wait=timeout)).raw)

    async def cancel(self, op_id: str) -> View:
        return dict((await self.client.cancel(op_id)).raw)

    async def list(self, query: OperationFilter) -> View:
        page = await self.client.list(
            state=query.state.value if query.state else None,
            provider=query.provider,
            done=query.done,
            awaiting_decision=query.awaiting_decision,
            limit=query.limit,
            cursor=query.cursor,
        )
        return {
            "operations": [dict(op.raw) for op in page.operations],
            "next_cursor": page.next_cursor,
        }

    async def providers(self) -> View:
        return {"providers": [dict(p.raw) for p in await self.client.providers()]}

    def now(self) -> datetime:
        return datetime.now(UTC)
