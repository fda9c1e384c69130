"""Operations as agents and operators see them, read together with their escalations.

The one builder of the Operation shape that the API, MCP, the console, the CLI
and agent callbacks return (``core.operation_view`` renders; this reads what it needs).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.engine import Connection

from reconciler.core.operation_view import operation_view
from reconciler.core.records import OperationRecord
from reconciler.storage.database import Database
from reconciler.storage.escalations import escalations_for


def operation_views(
    conn: Connection, ops: Sequence[OperationRecord], now: datetime
) -> list[dict[str, Any]]:
    escalations = escalations_for(conn, [op.escalation_id for op in ops if op.escalation_id])
    return [operation_view(op, now, escalations.get(op.escalation_id or -1)) for op in ops]


def view_of(conn: Connection, op: OperationRecord, now: datetime) -> dict[str, Any]:
    return operation_views(conn, [op], now)[0]


MAX_BATCH = 500


class ViewBatcher:
    """Operation views for many waiting requests built together: one thread hop, a few
    queries. Thousands of long-polls that time out together would otherwise queue one
    read each on the read pool; the requests of one loop turn share one read, so a
    ``/wait`` answers close to its timeout however many wait. Only escalations are read
    (the records are in hand): a batch without one reads nothing.
    """

    def __init__(self, db: Database, now: Callable[[], datetime]) -> None:
        self.db, self.now = db, now
        self._pending: list[tuple[OperationRecord, asyncio.Future[dict[str, Any]]]] = []
        self._draining = False
        self._drainer: asyncio.Task[None] | None = None

    async def view(self, op: OperationRecord) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[dict[str, Any]] = loop.create_future()
        self._pending.append((op, future))
        if not self._draining:
            self._draining = True
            self._drainer = loop.create_task(self._drain())
        return await future

    def _load(self, ops: list[OperationRecord]) -> list[dict[str, Any]]:
        """One view per distinct (operation, version): many may wait on the same one."""
        distinct = list({(op.id, op.version): op for op in ops}.values())
        with self.db.read() as conn:
            views = operation_views(conn, distinct, self.now())
        by_key = {(op.id, op.version): v for op, v in zip(distinct, views, strict=True)}
        return [by_key[(op.id, op.version)] for op in ops]

    def _plain(self, ops: list[OperationRecord]) -> list[dict[str, Any]]:
        """Views of operations without an escalation: nothing to read, built here."""
        now = self.now()
        views: dict[tuple[str, int], dict[str, Any]] = {}
        for op in ops:
            if (op.id, op.version) not in views:
                views[(op.id, op.version)] = operation_view(op, now, None)
        return [views[(op.id, op.version)] for op in ops]

    async def _drain(self) -> None:
        try:
            await asyncio.sleep(0)  # the other waiters timing out this turn join in
            while self._pending:
                batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
                ops = [op for op, _ in batch]
                try:
                    if any(op.escalation_id for op in ops):
                        views = await self.db.run(self._load, ops)
                    else:
                        views = self._plain(ops)
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
