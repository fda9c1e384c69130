"""A record is read with its parts: on PostgreSQL in the row's own statement.

The parts (``storage.payloads``) live beside the row. A claim or a lookup reads them with
it: PostgreSQL in the same statement (one round trip a claim, not two), SQLite with a
second one. Either way the record is the same: every part but the request.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from reconciler.core.principal import Principal
from reconciler.core.vocabulary import Scope
from reconciler.storage import leases, payloads
from reconciler.storage import operations as store
from reconciler.storage.database import Database
from reconciler.storage.journal import Journal
from tests.support.factories import insert_operation
from tests.support.statements import recording

pytestmark = pytest.mark.both_backends

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
PARTS = {
    "meta": {"team": "finance"},
    "status_body": {"state": "done", "n": [1, 2.5]},
    "result": {"rows": 3, "url": "https://example.com/r"},
}


def _seed(db: Database) -> str:
    op = insert_operation(
        db, Journal(), NOW, idempotency_key="key-1", next_poll_at=NOW - timedelta(seconds=1)
    )
    with db.write() as conn:
        payloads.store(conn, op.id, PARTS)
    return op.id


def _parts(op: store.OperationRecord) -> dict[str, object]:
    return {"meta": op.meta, "status_body": op.status_body, "result": op.result}


def test_every_read_of_a_record_carries_its_parts_but_the_request(db: Database) -> None:
    op_id = _seed(db)
    with db.write() as conn:
        claimed = leases.claim_records(conn, "w1", NOW, 30.0, 10)
        by_id = store.load_records(conn, [op_id], lock=True)
    with db.read() as conn:
        unlocked = store.get_operation(conn, op_id)
        by_key, stone = store.find_key(conn, "agent-1", "key-1")
        assert stone is None
        page = store.list_operations(
            conn, Principal("ops", Scope.OPERATOR), state=None, provider=None, limit=5, cursor=None
        )
        request = payloads.load_request(conn, op_id)
    records = [claimed[0][0], *by_id, unlocked, by_key, *page.items]
    assert len(records) == 5
    for record in records:
        assert record is not None and record.id == op_id
        assert _parts(record) == PARTS
    assert request == {"report": "q3"}
    # The request is read only for the create step that sends it: PostgreSQL's claim reads
    # it in its statement for an operation whose create is pending; any other read leaves
    # it out, and the step reads it when its record has none (``load_request``).
    assert claimed[0][0].request == (None if db.sqlite else request)
    assert all(record is not None and record.request is None for record in records[1:])


def test_a_claim_reads_no_part_in_a_statement_of_its_own_on_postgres(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    _seed(db)
    with recording(monkeypatch) as ran, db.write() as conn:
        claimed = leases.claim_records(conn, "w1", NOW, 30.0, 10)
    assert [op.meta for op, _ in claimed] == [PARTS["meta"]]
    own = [sql for sql, _ in ran if sql.lstrip().startswith("SELECT operation_id, name, value")]
    assert len(own) == (1 if db.sqlite else 0)
