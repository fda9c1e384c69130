"""Schema upgrades through Alembic, on the service's own engine."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from reconciler.storage.database import Database

SCRIPTS = Path(__file__).parent / "migrations"


def alembic_config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(SCRIPTS))
    return cfg


def upgrade(db: Database, revision: str = "head") -> None:
    cfg = alembic_config()
    # Migrations run outside the BEGIN IMMEDIATE hook: Alembic manages its own transaction.
    engine = sa.create_engine(db.url) if db.sqlite else db.engine
    try:
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)
    finally:
        if engine is not db.engine:
            engine.dispose()


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def current_revision(db: Database) -> str | None:
    with db.read_engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def is_current(db: Database) -> bool:
    return current_revision(db) == head_revision()
