"""What the command line and the readiness probe do to the database itself: open it
(refused while its schema is behind this version), upgrade the schema, prune finished
operations as the background sweep does, audit the history chains, and write through
the one write path outside a running service."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime

from reconciler.config import Settings
from reconciler.core.errors import ConfigError
from reconciler.core.retention import Cutoffs
from reconciler.storage import audit as chains
from reconciler.storage import migrate
from reconciler.storage.audit import AuditReport
from reconciler.storage.database import Database
from reconciler.storage.journal import Journal
from reconciler.storage.pruner import PRUNED_TABLES, Pruner, dry_run
from reconciler.storage.retention import Removed


@contextmanager
def opened(url: str) -> Iterator[Database]:
    """The database at ``url``, disposed of when the block ends."""
    db = Database(url)
    try:
        yield db
    finally:
        db.dispose()


@contextmanager
def current(url: str) -> Iterator[Database]:
    """``opened``, refused with one clear line when its schema is behind this version:
    what every command that reads or writes records opens."""
    with opened(url) as db:
        if not migrate.is_current(db):
            raise ConfigError(
                "the database schema is not current; run 'reconciler db upgrade' first"
            )
        yield db


def upgrade(db: Database) -> str | None:
    """Bring the schema to this version's head; returns the revision it is at after."""
    migrate.upgrade(db)
    return migrate.current_revision(db)


def schema_behind(db: Database) -> str | None:
    """What is wrong with the schema for this version, said as what to do; None when it
    is at this version's head."""
    now = migrate.current_revision(db)
    head = migrate.head_revision()
    if now == head:
        return None
    return f"schema at {now or 'nothing'}, expected {head}; run 'reconciler db upgrade'"


def audit_key(settings: Settings) -> bytes | None:
    """The key of the history chains' HMAC (``RECONCILER_AUDIT_KEY``), None when unset."""
    key = settings.audit_key()
    return key.reveal().encode("utf-8") if key else None


def journal(settings: Settings) -> Journal:
    """The one write path for a command run outside the service (``reconciler decide``):
    its history chained with the service's key. A completion round it opens is made by
    the service's completion handler, as when no round rows come with the move."""
    return Journal(key=audit_key(settings))


def audit(db: Database, key: bytes | None) -> AuditReport:
    """Every operation's history chain checked against its row, and the retention record."""
    return chains.verify(db, key)


def prune(
    db: Database,
    limits: Cutoffs,
    *,
    now: Callable[[], datetime],
    owner: str,
    key: bytes | None,
    batch_size: int,
    lease_seconds: float,
) -> Removed:
    """Remove what ``limits`` leaves behind, batch by batch under the sweep's lease (as
    the background sweep does); ``LeaseHeld`` when a sweep holds it now."""
    pruner = Pruner(db, now, owner, key, batch_size=batch_size, lease_seconds=lease_seconds)
    return pruner.run(limits)


def count_prunable(db: Database, limits: Cutoffs) -> Removed:
    """What ``prune`` would remove now, counted; nothing is deleted."""
    return dry_run(db, limits)


def removed_lines(removed: Removed) -> list[str]:
    """One line per pruned table, in a fixed order (tables with nothing removed included)."""
    return [f"{table}: {removed.tables.get(table, 0)}" for table in PRUNED_TABLES]
