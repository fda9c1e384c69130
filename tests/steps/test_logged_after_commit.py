"""The log says an operation moved or escalated only once that write committed.

Before: a status answer whose state word held a lone surrogate made the unknown-state
escalation's write fail (the history hash cannot encode it) and roll back, the read was
made again at once, and the log claimed "escalated: unknown_state" for each of the 360
writes that were rolled back. Here escalations are written and undone (a whole
transaction, and a savepoint of a shared one): nothing is said of them; the one that
commits is said once. Each test runs on SQLite and PostgreSQL.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from reconciler.core.escalation import UNKNOWN_PROVIDER
from reconciler.core.records import OperationRecord
from reconciler.core.vocabulary import EscalationReason
from reconciler.storage.database import savepoint
from reconciler.storage.escalations import escalate
from tests.support.steps import StepRig, step_rig

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]


def escalate_in(rig: StepRig, conn: object, op: OperationRecord, detail: str) -> OperationRecord:
    return escalate(
        conn,  # type: ignore[arg-type]
        rig.runtime.journal,
        op,
        UNKNOWN_PROVIDER,
        EscalationReason.UNKNOWN_STATE,
        detail,
        now=rig.clock.now(),
        actor="worker:test",
    )


def said(caplog: pytest.LogCaptureFixture, op_id: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if op_id in r.getMessage()]


async def test_an_escalation_that_rolls_back_is_never_said(
    tmp_path: Path, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with step_rig(tmp_path, db_url) as rig:
        op_id = rig.submit()
        op = await rig.step(op_id)
        db = rig.runtime.db
        caplog.clear()
        # The history entry cannot be hashed (UTF-8 has no lone surrogate): the write fails
        # after the escalation's row was inserted, and the transaction rolls back.
        for _ in range(3):
            with pytest.raises(UnicodeEncodeError), db.write() as conn:
                escalate_in(rig, conn, op, "the state word queued\ud800 is unknown")
        with db.write() as conn, pytest.raises(RuntimeError), savepoint(conn, "joined"):
            escalate_in(rig, conn, op, "unknown")
            raise RuntimeError("the shared transaction's other writes go on")
        assert said(caplog, op_id) == []
        assert rig.row(op_id).state == "observing"

        with db.write() as conn:
            escalate_in(rig, conn, op, "the state word 'weird' is unknown")
        assert said(caplog, op_id) == [
            f"operation {op_id} escalated: unknown_state",
            f"operation {op_id}: observing -> escalated (escalation:unknown_state)",
        ]
