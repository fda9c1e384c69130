"""Building operation rows for tests that exercise storage directly."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from reconciler.core import ids, records
from reconciler.core.canonical import request_fingerprint
from reconciler.core.records import OperationRecord
from reconciler.core.states import State
from reconciler.storage.database import Database
from reconciler.storage.journal import Journal
from reconciler.storage.tables import ESCALATIONS


def new_operation(now: datetime, **overrides: Any) -> OperationRecord:
    request = overrides.pop("request", {"report": "q3"})
    provider = overrides.pop("provider", "sim")
    values: dict[str, Any] = {
        "id": ids.operation_id(now),
        "provider": provider,
        "caller": "agent-1",
        "request": request,
        "request_fingerprint": request_fingerprint(provider, request),
        "idempotency_token": ids.idempotency_token(),
        "trace_id": ids.trace_id(),
        "state": State.CREATE_PENDING.value,
        "created_at": now,
        "updated_at": now,
        "create_deadline_at": now + timedelta(seconds=120),
        "deadline_at": now + timedelta(seconds=2400),
        "max_status_requests": 12,
        "max_transport_failures": 3,
        "create_attempts": 0,
        "status_requests_used": 0,
        "transport_failures_used": 0,
        "rate_limited_count": 0,
        "poll_attempt": 0,
        "completion_round": 0,
        "completion_pending": False,
        "version": 1,
        "history_seq": 0,
        "history_head": "",
    }
    values.update(overrides)
    return records.new_operation(**values)


def insert_operation(
    db: Database, journal: Journal, now: datetime, **overrides: Any
) -> OperationRecord:
    op = new_operation(now, **overrides)
    with db.write() as conn:
        return journal.insert(conn, op, actor="test", cause="test:create", now=now)


def seed_finished(
    db: Database, journal: Journal, count: int, done_at: datetime, **overrides: Any
) -> list[str]:
    """``count`` operations that ended ``succeeded`` at ``done_at`` with nothing left to do
    (what retention may prune), written in one transaction; their ids, oldest first."""
    ops = [
        new_operation(
            done_at,
            state=State.SUCCEEDED.value,
            done_at=done_at + timedelta(microseconds=i),
            remote_job_id=f"job-{i}",
            next_poll_at=None,
            **overrides,
        )
        for i in range(count)
    ]
    with db.write() as conn:
        for op in ops:
            journal.insert(conn, op, actor="test", cause="test:seed", now=done_at)
    return [op.id for op in ops]


def insert_escalation(
    db: Database, op_id: str, escalation_id: int, reason: str, *, decided: bool, at: datetime
) -> None:
    """An escalation row of ``op_id`` (the operation names it in its ``escalation_id``), for
    reads that look at an operation's last escalation."""
    with db.write() as conn:
        conn.execute(
            sa.insert(ESCALATIONS).values(
                id=escalation_id,
                operation_id=op_id,
                reason=reason,
                message="m",
                options=[],
                created_at=at,
                decided_at=at if decided else None,
                decided_by="operator:ana" if decided else None,
                decision={"action": "extend"} if decided else None,
            )
        )
