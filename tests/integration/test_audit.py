"""`reconciler audit verify` on an intact history and after tampering directly in SQL."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import sqlalchemy as sa

from reconciler.core.clock import ManualClock
from reconciler.core.records import OperationRecord
from reconciler.core.states import State
from reconciler.storage import audit
from reconciler.storage.database import Database
from reconciler.storage.journal import Journal
from reconciler.storage.tables import HISTORY
from tests.support import forked
from tests.support.factories import insert_operation

pytestmark = pytest.mark.both_backends

KEY = b"audit-test-key"


def _story(db: Database, journal: Journal, clock: ManualClock) -> OperationRecord:
    op = insert_operation(db, journal, clock.now())
    for to in (State.ACCEPTED, State.OBSERVING, State.RESULT_COLLECTING, State.SUCCEEDED):
        clock.advance(5)
        with db.write() as conn:
            op = journal.transition(
                conn,
                op,
                to,
                actor="worker",
                cause="story",
                now=clock.now(),
                detail={"step": to.value},
            )
    return op


def _entry_ids(db: Database, op_id: str) -> list[int]:
    with db.read() as conn:
        return [
            r.id
            for r in conn.execute(
                sa.select(HISTORY.c.id)
                .where(HISTORY.c.operation_id == op_id)
                .order_by(HISTORY.c.seq)
            )
        ]


def _cli_verify(db_url: str, key: str | None) -> subprocess.CompletedProcess[str]:
    env = {"RECONCILER_DATABASE_URL": db_url, "PATH": "/usr/bin:/bin"}
    if key:
        env["RECONCILER_AUDIT_KEY"] = key
    return forked.run(["audit", "verify"], env, Path(__file__).parent)


@pytest.fixture
def story(db: Database, clock: ManualClock) -> tuple[Journal, OperationRecord, OperationRecord]:
    journal = Journal(key=KEY)
    first = _story(db, journal, clock)
    second = _story(db, journal, clock)
    return journal, first, second


def test_intact_history_verifies(db: Database, db_url: str, story: object) -> None:
    assert audit.verify(db, KEY).ok
    result = _cli_verify(db_url, KEY.decode())
    assert result.returncode == 0, result.stderr
    assert "audit ok: 2 operations, 10 history entries" in result.stdout


def test_wrong_key_fails(db: Database, story: object) -> None:
    assert not audit.verify(db, b"another key").ok


def _tamper_and_check(
    db: Database, db_url: str, statement: str, params: dict[str, object], expect_entry: int | None
) -> None:
    with db.engine.begin() as conn:
        conn.execute(sa.text(statement), params)
    report = audit.verify(db, KEY)
    assert report.fault is not None
    if expect_entry is not None:
        assert report.fault.entry_id == expect_entry
    result = _cli_verify(db_url, KEY.decode())
    assert result.returncode == 1
    assert "audit FAILED" in result.stderr
    if expect_entry is not None:
        assert f"history entry {expect_entry} " in result.stderr


def test_edited_field_is_named(
    db: Database, db_url: str, story: tuple[Journal, OperationRecord, OperationRecord]
) -> None:
    _, op, _ = story
    target = _entry_ids(db, op.id)[2]
    _tamper_and_check(
        db,
        db_url,
        "UPDATE history SET cause = 'nothing to see' WHERE id = :id",
        {"id": target},
        target,
    )


def test_edited_detail_is_named(
    db: Database, db_url: str, story: tuple[Journal, OperationRecord, OperationRecord]
) -> None:
    _, op, _ = story
    target = _entry_ids(db, op.id)[1]
    _tamper_and_check(
        db,
        db_url,
        "UPDATE history SET actor = 'someone else' WHERE id = :id",
        {"id": target},
        target,
    )


def test_deleted_middle_entry_is_detected(
    db: Database, db_url: str, story: tuple[Journal, OperationRecord, OperationRecord]
) -> None:
    _, op, _ = story
    entries = _entry_ids(db, op.id)
    # The entry after the gap is the first one that no longer fits.
    _tamper_and_check(
        db, db_url, "DELETE FROM history WHERE id = :id", {"id": entries[2]}, entries[3]
    )


def test_deleted_newest_entries_are_detected(
    db: Database, db_url: str, story: tuple[Journal, OperationRecord, OperationRecord]
) -> None:
    _, op, _ = story
    entries = _entry_ids(db, op.id)
    _tamper_and_check(
        db,
        db_url,
        "DELETE FROM history WHERE id IN (:a, :b)",
        {"a": entries[-1], "b": entries[-2]},
        entries[-3],
    )


def test_swapped_entries_are_detected(
    db: Database, db_url: str, story: tuple[Journal, OperationRecord, OperationRecord]
) -> None:
    _, op, _ = story
    a, b = _entry_ids(db, op.id)[1:3]
    # Swap the two rows' positions in the chain (seq), keeping everything else.
    with db.engine.begin() as conn:
        conn.execute(sa.text("UPDATE history SET seq = -1 WHERE id = :a"), {"a": a})
        conn.execute(sa.text("UPDATE history SET seq = 2 WHERE id = :b"), {"b": b})
    _tamper_and_check(db, db_url, "UPDATE history SET seq = 3 WHERE id = :a", {"a": a}, b)


def test_rewritten_head_is_detected(
    db: Database, db_url: str, story: tuple[Journal, OperationRecord, OperationRecord]
) -> None:
    _, _, op = story
    _tamper_and_check(
        db, db_url, "UPDATE operations SET history_head = 'x' WHERE id = :id", {"id": op.id}, None
    )
