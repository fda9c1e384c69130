"""Operations as agents and operators see them, read together with their escalations.

The one builder of the Operation shape that the API, MCP, the console, the CLI
and agent callbacks return (``core.views`` renders; this reads what it needs).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.engine import Connection

from reconciler.core.views import operation_view
from reconciler.storage.escalations import escalations_for
from reconciler.storage.models import Operation


def operation_views(
    conn: Connection, ops: Sequence[Operation], now: datetime
) -> list[dict[str, Any]]:
    escalations = escalations_for(conn, [op.escalation_id for op in ops if op.escalation_id])
    return [operation_view(op, now, escalations.get(op.escalation_id or -1)) for op in ops]


def view_of(conn: Connection, op: Operation, now: datetime) -> dict[str, Any]:
    return operation_views(conn, [op], now)[0]
