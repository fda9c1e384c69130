"""The audit sees every deletion retention did not make, and the dry run counts what the
prune deletes.

On a copy of a database with prune records the red team deleted the newest record
("audit ok … 13 prunes"), every record ("retention removed nothing", ok), 50 tombstones,
or edited one tombstone's state: ``audit verify`` said ok each time, and a deleted
tombstone let its key start a new job. The log's head is now kept apart (as an
operation's row keeps its history's head) and each record counts and digests the
tombstones it left: each tampering fails verification, naming what is missing. A
tombstone expiry retention makes itself is recorded, and verifies.

``reconciler db prune --dry-run`` counted 0 ``webhook_events`` where the prune removed
every event of the pruned jobs.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from reconciler.core.retention import Cutoffs
from reconciler.storage import audit
from reconciler.storage.database import Database
from reconciler.storage.journal import Journal
from reconciler.storage.pruner import Pruner
from tests.support.factories import seed_finished
from tests.support.process import cli_here, service_config

pytestmark = pytest.mark.both_backends

LONG_AGO = datetime(2025, 1, 1, tzinfo=UTC)
KEY = b"audit-key"
PRUNED = 40  # in four records of 10


def _prune(db: Database, now: datetime, tombstones_before: datetime | None = None) -> None:
    pruner = Pruner(db, lambda: now, "replica", KEY, batch_size=10)
    pruner.run(Cutoffs(now - timedelta(days=30), None, tombstones_before))


def _run(db: Database, *statements: str) -> None:
    with db.write() as conn:
        for statement in statements:
            conn.execute(sa.text(statement))


@pytest.fixture
def pruned(db: Database) -> Database:
    seed_finished(db, Journal(), PRUNED, LONG_AGO)
    _prune(db, datetime.now(UTC))
    report = audit.verify(db, KEY)
    assert report.ok and report.retention is not None
    assert (report.retention.records, report.retention.operations) == (4, PRUNED)
    return db


NEWEST_TEN = (
    "(SELECT operation_id FROM tombstones WHERE record_seq = 4 ORDER BY operation_id LIMIT 5)"
)


@pytest.mark.parametrize(
    ("tampering", "named"),
    [
        (
            ["DELETE FROM retention_log WHERE seq = 4"],
            "retention log: ends at record 3, but its head names record 4: the newest 1 "
            "record was deleted",
        ),
        (
            ["DELETE FROM retention_log"],
            "retention log: holds no record, but its head names record 4: records were deleted",
        ),
        (
            [f"DELETE FROM tombstones WHERE operation_id IN {NEWEST_TEN}"],
            "retention record 4: 5 of the 10 tombstones it left are missing",
        ),
        (
            ["DELETE FROM tombstones"],
            "retention record 1: 10 of the 10 tombstones it left are missing",
        ),
        (
            [f"UPDATE tombstones SET state = 'failed' WHERE operation_id IN {NEWEST_TEN}"],
            "retention record 4: its tombstones do not match their digest",
        ),
        (
            ["DELETE FROM retention_log", "DELETE FROM retention_head"],
            "retention record 1: 10 tombstones name it, but the log holds no such prune",
        ),
    ],
)
def test_each_tampering_fails_verification_naming_what_is_missing(
    pruned: Database, tampering: list[str], named: str
) -> None:
    _run(pruned, *tampering)
    report = audit.verify(pruned, KEY)
    assert not report.ok and report.fault is not None
    assert report.fault.describe().startswith(named), report.fault.describe()


def test_tombstones_retention_expires_are_recorded_and_verify(pruned: Database) -> None:
    later = datetime.now(UTC) + timedelta(days=1)
    _prune(pruned, later, tombstones_before=later)
    with pruned.read() as conn:
        left = conn.execute(sa.text("SELECT count(*) FROM tombstones")).scalar_one()
        expiries = conn.execute(
            sa.text("SELECT count(*) FROM retention_log WHERE expired_of IS NOT NULL")
        ).scalar_one()
    assert (left, expiries) == (0, 4)
    report = audit.verify(pruned, KEY)
    assert report.ok, report.fault
    assert report.retention is not None and report.retention.records == 4


def test_the_dry_run_counts_the_job_events_the_prune_deletes(
    tmp_path: Path, db_url: str, db: Database
) -> None:
    seed_finished(db, Journal(), 20, LONG_AGO)  # jobs job-0 .. job-19 of provider sim
    with db.write() as conn:
        rows = [
            {"e": f"evt-{job}-{n}", "j": f"job-{job}", "at": LONG_AGO}
            for job in range(20)
            for n in range(3)
        ]
        conn.execute(
            sa.text(
                "INSERT INTO webhook_events (provider, event_id, received_at, remote_job_id, "
                "body_sha256, duplicates, conflicts, ignored) "
                "VALUES ('sim', :e, :at, :j, 'x', 0, 0, false)"
            ),
            rows,
        )
    config, _ = service_config(tmp_path, db_url, "http://127.0.0.1:9")
    argv = ("db", "prune", "--older-than", "30d")
    dry = cli_here(config, *argv, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "  webhook_events: 60\n" in dry.stdout, dry.stdout
    done = cli_here(config, *argv)
    assert "  webhook_events: 60\n" in done.stdout, done.stdout
