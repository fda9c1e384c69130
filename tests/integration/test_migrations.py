"""Migrations build the schema from nothing, and the models agree with it."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from reconciler.storage import migrate
from reconciler.storage.database import Database
from reconciler.storage.models import TABLES
from tests.support import forked

pytestmark = pytest.mark.both_backends


def test_upgrade_from_empty_and_models_match(empty_db_url: str) -> None:
    db = Database(empty_db_url)
    try:
        assert migrate.current_revision(db) is None
        assert not migrate.is_current(db)
        migrate.upgrade(db)
        assert migrate.is_current(db)
        with db.engine.connect() as conn:
            diff = compare_metadata(
                MigrationContext.configure(conn, opts={"compare_type": True}), TABLES
            )
        assert diff == []
        migrate.upgrade(db)  # idempotent
        with db.read() as conn:
            tables = set(sa.inspect(conn).get_table_names())
        assert {
            "operations",
            "history",
            "api_tokens",
            "webhook_events",
            "escalations",
            "completion_steps",
            "alembic_version",
        } <= tables
    finally:
        db.dispose()


def test_cli_db_upgrade(empty_db_url: str) -> None:
    result = forked.run(
        ["db", "upgrade"],
        {"RECONCILER_DATABASE_URL": empty_db_url, "PATH": "/usr/bin:/bin"},
        Path.cwd(),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert f"revision {migrate.head_revision()}" in result.stdout
