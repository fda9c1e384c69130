"""``reconciler db upgrade`` and ``reconciler audit verify``, and the database every other
command that reads or writes records opens: refused with one line when its schema is
behind this version."""

from __future__ import annotations

import argparse
import sys

from reconciler.config import Settings
from reconciler.core.errors import ConfigError
from reconciler.storage import audit, migrate
from reconciler.storage.database import Database


def db_upgrade(args: argparse.Namespace, settings: Settings) -> int:
    db = Database(settings.database_url)
    try:
        migrate.upgrade(db)
        print(f"database at revision {migrate.current_revision(db)}")
    finally:
        db.dispose()
    return 0


def current_database(settings: Settings) -> Database:
    """The database, refused with a clear line when its schema is behind this version."""
    db = Database(settings.database_url)
    try:
        current = migrate.is_current(db)
    except BaseException:
        db.dispose()
        raise
    if not current:
        db.dispose()
        raise ConfigError("the database schema is not current; run 'reconciler db upgrade' first")
    return db


def audit_verify(args: argparse.Namespace, settings: Settings) -> int:
    db = Database(settings.database_url)
    try:
        key = settings.audit_key()
        report = audit.verify(db, key.reveal().encode("utf-8") if key else None)
    finally:
        db.dispose()
    if report.fault is not None:
        print(f"audit FAILED: {report.fault.describe()}", file=sys.stderr)
        return 1
    print(f"audit ok: {report.operations} operations, {report.entries} history entries intact")
    return 0
