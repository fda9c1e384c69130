"""``/readyz`` is one ``SELECT 1`` per probe once the schema was found at head.

Before, every probe built an Alembic migration context (two INFO log lines a probe:
856 pairs in 95 s under a supervisor). The schema is checked until it is found at
head, then again only after a failed probe or every ``SCHEMA_RECHECK_SECONDS``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from starlette.testclient import TestClient

from reconciler.api import health
from reconciler.app import create_app
from reconciler.config import Settings
from reconciler.runtime import Runtime
from tests.support.databases import sqlite_url
from tests.support.stack import CALLBACK_SECRET, SIM_TOKEN, WEBHOOK_SECRET, sim_provider_table

ENVIRON = {
    "SIM_TOKEN": SIM_TOKEN,
    "SIM_WEBHOOK_SECRETS": WEBHOOK_SECRET,
    "RECONCILER_CALLBACK_SECRET": CALLBACK_SECRET,
}


@pytest.fixture
def probed(tmp_path: Path) -> Iterator[tuple[TestClient, Runtime]]:
    empty = tmp_path / "no-provider-files"
    empty.mkdir()
    with sqlite_url(tmp_path) as url:
        settings = Settings(
            database_url=url,
            providers_dir=str(empty),
            providers={"sim": sim_provider_table("http://127.0.0.1:9")},
        )
        runtime = Runtime.build(settings, environ=ENVIRON)
        try:
            yield TestClient(create_app(runtime, background=False)), runtime
        finally:
            runtime.db.dispose()


def _alembic(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("alembic")]


def test_probes_after_the_first_build_no_migration_context(
    probed: tuple[TestClient, Runtime], caplog: pytest.LogCaptureFixture
) -> None:
    client, _ = probed
    caplog.set_level(logging.INFO)
    assert client.get("/readyz").status_code == 200
    first = len(_alembic(caplog))
    assert first >= 1, "the first probe checks the schema (Alembic logs its context)"
    for _ in range(30):
        assert client.get("/readyz").status_code == 200
    assert len(_alembic(caplog)) == first, "a probe built a migration context again"


def test_a_schema_off_head_is_seen_at_the_recheck(
    probed: tuple[TestClient, Runtime], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, runtime = probed
    assert client.get("/readyz").status_code == 200
    with runtime.db.write() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = '0001'"))
    assert client.get("/readyz").status_code == 200  # not rechecked yet: still cached
    monkeypatch.setattr(health, "SCHEMA_RECHECK_SECONDS", 0.0)
    refused = client.get("/readyz")
    assert refused.status_code == 503
    assert "run 'reconciler db upgrade'" in refused.json()["detail"]
