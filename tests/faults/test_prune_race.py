"""A retry that races the prune of its operation starts nothing: it gets the operation
back while the prune is uncommitted, ``410`` once it committed, never a second job.

Two replicas (two ``Database`` objects on one database): one holds a prune batch open,
the operation's row deleted and its tombstone written but not committed; the other
re-sends the operation's key. On PostgreSQL the retry once waited for the prune's delete
on the unique key and, when it committed, found the key free: its snapshot, taken
before, did not see the tombstone. The test holds the prune until the retry either
answered or waits for a lock (``pg_stat_activity``), then commits it: the interleaving
that started a second job is forced, not hoped for. SQLite serialises the two writes.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from reconciler.commands.create import create_operation
from reconciler.core.errors import Gone
from reconciler.core.limits import ProviderLimits
from reconciler.core.principal import Principal
from reconciler.core.records import OperationRecord
from reconciler.storage import retention
from reconciler.storage.database import Database
from reconciler.storage.journal import Journal
from reconciler.wire import CreateOperation, validated
from tests.support.factories import seed_finished
from tests.support.steps import AGENT
from tests.support.waiting import wait_until

pytestmark = pytest.mark.both_backends

LONG_AGO = datetime(2025, 1, 1, tzinfo=UTC)
KEY = "nightly-report"
LIMITS = ProviderLimits(
    deadline_seconds=2400, max_status_requests=12, max_transport_failures=3,
    create_deadline_seconds=120,
)  # fmt: skip


def _waits_for_a_lock(db: Database) -> bool:
    with db.read() as conn:
        return bool(
            conn.execute(
                sa.text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
                )
            ).scalar_one()
        )


def _keyed(db: Database) -> int:
    with db.read() as conn:
        query = sa.text("SELECT count(*) FROM operations WHERE idempotency_key = :k")
        return int(conn.execute(query, {"k": KEY}).scalar_one())


def test_a_retry_racing_the_prune_of_its_operation_starts_no_job(db_url: str) -> None:
    pruning, retrying = Database(db_url), Database(db_url)
    try:
        seed_finished(
            pruning, Journal(), 1, LONG_AGO, caller=AGENT.name, idempotency_key=KEY,
            requested_deadline_seconds=2400, requested_max_status_requests=12,
        )  # fmt: skip
        req = validated(
            CreateOperation,
            {"provider": "sim", "request": {"report": "q3"}, "idempotency_key": KEY},
        )
        answers: list[tuple[OperationRecord, bool] | BaseException] = []

        def retry(who: Principal = AGENT) -> None:
            now = datetime.now(UTC)
            try:
                with retrying.write() as conn:
                    answers.append(create_operation(conn, Journal(), who, req, LIMITS, now))
            except BaseException as exc:  # judged below
                answers.append(exc)

        now = datetime.now(UTC)
        thread = threading.Thread(target=retry)
        with pruning.write() as conn:
            removed = retention.prune_batch(conn, now - timedelta(days=30), now, 10, "t", None)
            assert removed.operations == 1
            thread.start()
            if not pruning.sqlite:
                wait_until(
                    lambda: bool(answers) or _waits_for_a_lock(retrying),
                    30,
                    "the retry to answer or to wait for the prune",
                )
        thread.join(30)
        assert answers, "the retry did not finish"
        answer = answers[0]
        if isinstance(answer, BaseException):
            assert isinstance(answer, Gone), answer  # the prune committed first: 410
        else:
            _, created = answer
            assert not created, "the retry started a second job"
        assert _keyed(retrying) == 0
    finally:
        pruning.dispose()
        retrying.dispose()
