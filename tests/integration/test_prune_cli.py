"""``reconciler db prune`` and ``reconciler audit verify`` after it, on both backends.

The command runs in this process (``cli_here``: the same parser and handlers); its
input errors are one line and a non-zero exit, a dry run counts without deleting, and
a real run prints what it removed per table, which ``audit verify`` then reports.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from reconciler.storage import retention
from reconciler.storage.database import Database
from reconciler.storage.journal import Journal
from tests.support.factories import insert_operation, seed_finished
from tests.support.process import cli_here, service_config

pytestmark = pytest.mark.both_backends

LONG_AGO = datetime(2025, 1, 1, tzinfo=UTC)


@pytest.fixture
def config(tmp_path: Path, db_url: str) -> Path:
    path, _ = service_config(tmp_path, db_url, "http://127.0.0.1:9", retention={"batch_size": 7})
    return path


def _count(db: Database, table: str) -> int:
    with db.read() as conn:
        return int(conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one())


@pytest.mark.parametrize(
    ("argument", "problem"),
    [
        ("30", "--older-than must be a whole number with a unit"),
        ("0d", "--older-than must be a whole number with a unit"),
        ("5w", "--older-than must be a whole number with a unit"),
        ("99999d", "--older-than may be at most 3660 days"),
    ],
)
def test_a_duration_without_a_unit_or_out_of_bounds_is_refused_by_name(
    config: Path, argument: str, problem: str
) -> None:
    done = cli_here(config, "db", "prune", "--older-than", argument)
    assert done.returncode != 0
    assert problem in done.stderr and "Traceback" not in done.stderr
    assert done.stdout == ""


def test_dry_run_counts_and_prune_removes_then_audit_says_so(config: Path, db: Database) -> None:
    journal = Journal()
    old = seed_finished(db, journal, 20, LONG_AGO)
    recent = seed_finished(db, journal, 3, datetime.now(UTC) - timedelta(days=1))
    in_flight = insert_operation(db, journal, LONG_AGO)  # create_pending since 2025

    dry = cli_here(config, "db", "prune", "--older-than", "30d", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "would remove" in dry.stdout
    assert "  operations: 20\n" in dry.stdout and "  history: 20\n" in dry.stdout
    assert "  operation_payloads: 20\n" in dry.stdout
    assert _count(db, "operations") == 24 and _count(db, "tombstones") == 0

    done = cli_here(config, "db", "prune", "--older-than", "30d")
    assert done.returncode == 0, done.stderr
    assert "removed" in done.stdout and "  operations: 20\n" in done.stdout
    assert _count(db, "operations") == 4 and _count(db, "history") == 4
    with db.read() as conn:
        left = {row[0] for row in conn.execute(sa.text("SELECT id FROM operations"))}
        stones = {row[0] for row in conn.execute(sa.text("SELECT operation_id FROM tombstones"))}
        log = retention.retention_log(conn)
    assert left == {*recent, in_flight.id} and stones == set(old)
    assert [r["seq"] for r in log] == [1, 2, 3]  # 20 in batches of 7
    assert sum(r["operations"] for r in log) == 20

    verified = cli_here(config, "audit", "verify")
    assert verified.returncode == 0, verified.stderr
    assert "audit ok: 4 operations, 4 history entries intact" in verified.stdout
    assert "retention removed 20 operations (20 history entries)" in verified.stdout

    again = cli_here(config, "db", "prune", "--older-than", "30d")
    assert again.returncode == 0 and "  operations: 0\n" in again.stdout


def test_prune_waits_its_turn_while_a_sweep_holds_the_lease(config: Path, db: Database) -> None:
    seed_finished(db, Journal(), 2, LONG_AGO)
    now = datetime.now(UTC)
    with db.write() as conn:
        assert retention.take_lease(
            conn, retention.SWEEP_LEASE, "replica-2", now, now + timedelta(minutes=5)
        )
    held = cli_here(config, "db", "prune", "--older-than", "30d")
    assert held.returncode == 1
    assert "a retention sweep by replica-2 holds the lease" in held.stderr
    assert _count(db, "operations") == 2
