"""``reconciler db upgrade``, ``reconciler db prune`` and ``reconciler audit verify``, and
the database every other command that reads or writes records opens: refused with one
line when its schema is behind this version."""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from dataclasses import replace

from reconciler.cli.durations import parse_duration
from reconciler.config import Settings
from reconciler.core.clock import SystemClock, isoformat
from reconciler.core.errors import ConfigError
from reconciler.core.ids import worker_id
from reconciler.core.retention import RetentionPolicy, cutoffs
from reconciler.storage import audit, migrate
from reconciler.storage.database import Database
from reconciler.storage.pruner import PRUNED_TABLES, LeaseHeld, Pruner, dry_run
from reconciler.storage.retention import removed_lines


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


def _audit_key(settings: Settings) -> bytes | None:
    key = settings.audit_key()
    return key.reveal().encode("utf-8") if key else None


def db_prune(args: argparse.Namespace, settings: Settings) -> int:
    """Prune finished operations older than ``--older-than`` (events and tombstones by their
    configured windows), batch by batch as the sweep does; ``--dry-run`` only counts."""
    older = parse_duration(args.older_than, "--older-than")
    kept = settings.retention
    policy = replace(
        RetentionPolicy.of_days(0, kept.events_days, kept.tombstones_days), operations=older
    )
    clock = SystemClock()
    limits = cutoffs(policy, clock.now())
    db = current_database(settings)
    try:
        if args.dry_run:
            removed = dry_run(db, limits)
            verb = "would remove"
        else:
            who = f"cli:{getpass.getuser()}@{worker_id(os.uname().nodename, os.getpid())}"
            owner = who[:100]
            pruner = Pruner(
                db,
                clock.now,
                owner,
                _audit_key(settings),
                batch_size=kept.batch_size,
                lease_seconds=settings.scheduler.lease_seconds,
            )
            try:
                removed = pruner.run(limits)
            except LeaseHeld as exc:
                print(f"prune not started: {exc}; run it again after that sweep", file=sys.stderr)
                return 1
            verb = "removed"
    finally:
        db.dispose()
    print(f"{verb}, operations finished before {isoformat(limits.operations)}:")
    for line in removed_lines(removed, PRUNED_TABLES):
        print(f"  {line}")
    return 0


def audit_verify(args: argparse.Namespace, settings: Settings) -> int:
    db = Database(settings.database_url)
    try:
        report = audit.verify(db, _audit_key(settings))
    finally:
        db.dispose()
    if report.fault is not None:
        print(f"audit FAILED: {report.fault.describe()}", file=sys.stderr)
        return 1
    print(f"audit ok: {report.operations} operations, {report.entries} history entries intact")
    if report.retention is not None:
        print(report.retention.describe())
    return 0
