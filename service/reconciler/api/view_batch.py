"""Operation views for many waiting requests built together: one thread hop, a few queries.

Guarantee: a ``/wait`` answers close to its timeout however many wait. Thousands
of long-polls that time out together would otherwise queue one read each on the
read pool; here the requests of one loop turn share one read
(``storage.views.operation_views``), so their answers leave together.
"""

from __future__ import annotations

import asyncio
from typing import Any

from reconciler.runtime import Runtime
from reconciler.storage.models import Operation
from reconciler.storage.views import operation_views

MAX_BATCH = 500


class ViewBatcher:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._pending: list[tuple[Operation, asyncio.Future[dict[str, Any]]]] = []
        self._draining = False
        self._drainer: asyncio.Task[None] | None = None

    async def view(self, op: Operation) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[dict[str, Any]] = loop.create_future()
        self._pending.append((op, future))
        if not self._draining:
            self._draining = True
            self._drainer = loop.create_task(self._drain())
        return await future

    def _load(self, ops: list[Operation]) -> list[dict[str, Any]]:
        """One view per distinct (operation, version): many may wait on the same one."""
        rt = self.runtime
        distinct = list({(op.id, op.version): op for op in ops}.values())
        with rt.db.read() as conn:
            views = operation_views(conn, distinct, rt.clock.now())
        by_key = {(op.id, op.version): v for op, v in zip(distinct, views, strict=True)}
        return [by_key[(op.id, op.version)] for op in ops]

    async def _drain(self) -> None:
        try:
            await asyncio.sleep(0)  # the other waiters timing out this turn join in
            while self._pending:
                batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
                try:
                    views = await self.runtime.db.run(self._load, [op for op, _ in batch])
                except Exception as exc:  # each waiting request raises it
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                for (_, future), view in zip(batch, views, strict=True):
                    if not future.done():
                        future.set_result(view)
        finally:
            self._draining = False
