"""What the database refuses reaches callers as an error of ``core.errors``, on both backends.

``storage.database.translate_errors`` is the one place a driver's error becomes the
package's: a value the database refuses by its content (``DataError``: a NUL in
PostgreSQL text, a string past SQLite's length limit) is ``UnstorableContent``, so a door
answers 400 and never has to know SQLAlchemy; and the readiness probe's ``SELECT 1`` is
``Database.ping``.
"""

from __future__ import annotations

import logging
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa

from reconciler.commands import webhooks
from reconciler.core.chain import Entry
from reconciler.core.clock import ManualClock
from reconciler.core.errors import StorageUnavailable, UnstorableContent
from reconciler.core.vocabulary import HistoryKind
from reconciler.storage.database import Database
from reconciler.storage.history import history_of
from reconciler.storage.journal import Journal
from reconciler.storage.tables import OPS
from tests.integration.test_webhook_endpoint import event_body, open_endpoint
from tests.support.factories import insert_operation

pytestmark = pytest.mark.both_backends

NOW = datetime(2026, 2, 1, 12, tzinfo=UTC)


def _set_remote_state(db: Database, op_id: str, value: str) -> None:
    with db.write() as conn:
        conn.execute(sa.update(OPS).where(OPS.c.id == op_id).values(remote_state=value))


def _remote_state(db: Database, op_id: str) -> str | None:
    with db.read() as conn:
        found = conn.execute(sa.select(OPS.c.remote_state).where(OPS.c.id == op_id)).scalar()
    return None if found is None else str(found)


def test_a_value_sqlite_refuses_is_unstorable_content(db: Database) -> None:
    if not db.sqlite:
        pytest.skip("SQLite's length limit")
    op = insert_operation(db, Journal(), NOW, remote_state="queued")
    with pytest.raises(UnstorableContent) as refused, db.write() as conn:
        raw = conn.connection.dbapi_connection
        assert isinstance(raw, sqlite3.Connection)
        before = raw.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 1000)
        try:
            conn.execute(sa.update(OPS).where(OPS.c.id == op.id).values(remote_state="q" * 5000))
        finally:
            raw.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, before)
    assert refused.value.code == "content_unstorable"
    assert isinstance(refused.value.__cause__, sa.exc.DataError)
    assert _remote_state(db, op.id) == "queued"  # the transaction wrote nothing


def test_a_value_postgres_refuses_is_unstorable_content(db: Database) -> None:
    if db.sqlite:
        pytest.skip("SQLite stores a NUL in text; PostgreSQL refuses it (a DataError)")
    op = insert_operation(db, Journal(), NOW, remote_state="queued")
    with pytest.raises(UnstorableContent) as refused:
        _set_remote_state(db, op.id, "queued\x00")
    assert refused.value.code == "content_unstorable"
    assert isinstance(refused.value.__cause__, sa.exc.DataError)
    assert _remote_state(db, op.id) == "queued"


def test_a_history_value_too_long_for_its_column_is_refused_never_cut(db: Database) -> None:
    """The row's change and its history entry are one statement on PostgreSQL, with the
    entry's values cast to their columns' types: a cause past its column's length must
    still be refused (a cast to a shorter VARCHAR would cut it, and the chain's hash
    would no longer match the stored text), and nothing of the write is kept."""
    if db.sqlite:
        pytest.skip("SQLite does not enforce VARCHAR lengths")
    journal = Journal()
    op = insert_operation(db, journal, NOW, remote_state="queued")
    entry = Entry(kind=HistoryKind.NOTE, actor="test", cause="c" * 501)
    with pytest.raises(UnstorableContent), db.write() as conn:
        journal.write(conn, op, now=NOW, changes={"remote_state": "running"}, entries=[entry])
    assert _remote_state(db, op.id) == "queued"
    with db.read() as conn:
        assert [h.cause for h in history_of(conn, op.id)] == ["test:create"]


def test_ping_answers_on_a_live_database(db: Database) -> None:
    assert db.ping() is None


def test_ping_of_an_unreachable_database_is_storage_unavailable(tmp_path: Path) -> None:
    gone = Database(f"sqlite:///{tmp_path / 'no-such-directory' / 'db.sqlite'}")
    try:
        with pytest.raises(StorageUnavailable):
            gone.ping()
    finally:
        gone.dispose()


def test_a_webhook_the_database_refuses_is_400_unstorable_and_nothing_is_stored(
    tmp_path: Path,
    db_url: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The command's own check refuses such a job id first; with it out of the way the
    # database's refusal is what answers, and it must be the same 400, never a 503:
    # PostgreSQL refuses a NUL (a DataError, mapped in storage), and no driver can encode
    # a lone surrogate.
    monkeypatch.setattr(webhooks, "_text", lambda value, what: str(value))
    caplog.set_level(logging.WARNING, logger="reconciler.webhooks")
    with open_endpoint(tmp_path, db_url, ManualClock(NOW)) as ep:
        before = ep.snapshot()
        job = "job\ud800" if ep.runtime.db.sqlite else "job\x00"
        body = event_body("evt_refused", job_id=job)
        response = ep.deliver(body, "evt_refused")
        assert response.status_code == 400, response.text
        assert "retry-after" not in response.headers
        assert response.json()["error"]["code"] == "content_unstorable"
        counted = ep.runtime.metrics.registry.get_sample_value(
            "reconciler_webhooks_total", {"provider": "sim", "result": "unstorable"}
        )
        assert counted == 1
        ep.assert_nothing_stored(before)
    assert any("could not be stored" in r.getMessage() for r in caplog.records)
