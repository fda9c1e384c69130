"""Attack (or accident): an idempotent retry that silently drops what it changed.

The same key and request with another callback_url, deadline, budget or metadata is
a 409 naming the field; requests compare as values (``1`` and ``1.0`` are one). The
migration carries stored operations over: payloads moved, fingerprints recomputed.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from alembic import command

from reconciler.core.canonical import fingerprint_json, request_fingerprint
from reconciler.storage import migrate
from reconciler.storage.database import Database
from reconciler.storage.operations import get_operation
from reconciler.storage.payloads import load_request
from tests.support.stack import Stack

JOB = {"scenario": "never_finishes", "webhooks": "never", "n": 1}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"callback_url": "http://127.0.0.1:9/cb"}, "callback_url"),
        ({"deadline_seconds": 10}, "deadline_seconds"),
        ({"max_status_requests": 5}, "max_status_requests"),
        ({"metadata": {"run": 2}}, "metadata"),
    ],
)
def test_a_retry_with_another_term_is_409_naming_it(
    stack: Stack, change: dict[str, object], field: str
) -> None:
    first = stack.create(JOB, idempotency_key="k", metadata={"run": 1})
    assert first.status_code == 202, first.text
    again = stack.create(JOB, idempotency_key="k", **{"metadata": {"run": 1}, **change})
    assert again.status_code == 409, again.text
    assert f"'{field}'" in again.json()["error"]["message"]
    assert first.json()["id"] in again.json()["error"]["message"]


def test_numbers_compare_by_value(stack: Stack) -> None:
    first = stack.create({**JOB, "n": 1, "ratio": 0.5}, idempotency_key="v", metadata={"a": 2})
    assert first.status_code == 202
    same = stack.create(
        {"ratio": 5e-1, "n": 1.0, **{k: JOB[k] for k in ("scenario", "webhooks")}},
        idempotency_key="v",
        metadata={"a": 2.0},
    )
    assert same.status_code == 200 and same.json()["id"] == first.json()["id"]
    assert stack.create({**JOB, "n": 2}, idempotency_key="v").status_code == 409


def test_fingerprints_are_rfc8785_with_exact_integers() -> None:
    assert request_fingerprint("p", {"a": 1}) == request_fingerprint("p", {"a": 1.0})
    assert request_fingerprint("p", {"a": 1e3}) == request_fingerprint("p", {"a": 1000})
    assert request_fingerprint("p", {"a": 2**53}) != request_fingerprint("p", {"a": 2**53 + 1})
    assert fingerprint_json({"b": [1e21, 1.5e-7], "a": "\u00e9"}) == '{"a":"é","b":[1e+21,1.5e-7]}'


def _downgrade(db: Database, revision: str) -> None:
    cfg = migrate.alembic_config()
    engine = sa.create_engine(db.url) if db.sqlite else db.engine
    try:
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, revision)
    finally:
        if engine is not db.engine:
            engine.dispose()


@pytest.mark.both_backends
def test_the_migration_carries_stored_operations_over(empty_db_url: str) -> None:
    db = Database(empty_db_url)
    try:
        migrate.upgrade(db, "0003")
        now = datetime(2026, 6, 1, tzinfo=UTC)
        old_fingerprint = "sha256:" + "0" * 64
        request = {"n": 1.0, "pad": "z" * 5000}
        detail = {
            "deadline_at": (now + timedelta(seconds=600)).isoformat(),
            "max_status_requests": 7,
        }
        with db.engine.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO operations (id, provider, caller, request, request_fingerprint, "
                    "idempotency_token, trace_id, meta, state, created_at, updated_at, "
                    "create_deadline_at, deadline_at, create_attempts, max_status_requests, "
                    "status_requests_used, max_transport_failures, transport_failures_used, "
                    "rate_limited_count, poll_attempt, status_body, result_attempts, result, "
                    "completion_round, completion_pending, version, history_seq, history_head) "
                    "VALUES ('op_old', 'sim', 'agent-1', :request, :fp, 'idem_x', 'tr_x', "
                    ":meta, 'succeeded', :now, :now, :now, :now, 1, 12, 3, 3, 0, 0, 3, "
                    ":status, 1, :result, 1, false, 5, 1, 'h')"
                ),
                {
                    "request": json.dumps(request),
                    "fp": old_fingerprint,
                    "meta": json.dumps({"m": 1}),
                    "status": json.dumps({"state": "succeeded"}),
                    "result": json.dumps({"sha256": "ab"}),
                    "now": now.replace(tzinfo=None),
                },
            )
            conn.execute(
                sa.text(
                    "INSERT INTO history (operation_id, seq, at, kind, actor, cause, detail, "
                    "prev_hash, hash) VALUES ('op_old', 1, :now, 'transition', 'a', 'c', "
                    ":detail, '', 'h')"
                ),
                {"now": now.replace(tzinfo=None), "detail": json.dumps(detail)},
            )
        migrate.upgrade(db)
        with db.read() as conn:
            op = get_operation(conn, "op_old")
            stored = load_request(conn, "op_old")
            columns = {c["name"] for c in sa.inspect(conn).get_columns("operations")}
        assert op is not None and stored == request
        assert (op.meta, op.status_body, op.result) == (
            {"m": 1},
            {"state": "succeeded"},
            {"sha256": "ab"},
        )
        assert op.request_fingerprint == request_fingerprint("sim", {"n": 1, "pad": "z" * 5000})
        assert (op.requested_deadline_seconds, op.requested_max_status_requests) == (600.0, 7)
        assert not {"request", "meta", "status_body", "result"} & columns
        _downgrade(db, "0003")  # and back: the parts return to the row
        with db.read() as conn:
            back = conn.execute(sa.text("SELECT request, meta FROM operations")).one()
        assert json.loads(back[0]) == request if isinstance(back[0], str) else back[0] == request
    finally:
        db.dispose()
