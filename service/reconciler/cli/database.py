"""``reconciler db upgrade``, ``reconciler db prune`` and ``reconciler audit verify``
(``commands.database``: every other command that reads or writes records opens the
database through ``current``, refused with one line when its schema is behind)."""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from dataclasses import replace

from reconciler.cli.durations import parse_duration
from reconciler.commands import database
from reconciler.config import Settings
from reconciler.core.clock import SystemClock, isoformat
from reconciler.core.ids import worker_id
from reconciler.core.retention import RetentionPolicy, cutoffs
from reconciler.storage.pruner import LeaseHeld


def db_upgrade(args: argparse.Namespace, settings: Settings) -> int:
    with database.opened(settings.database_url) as db:
        print(f"database at revision {database.upgrade(db)}")
    return 0


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
    with database.current(settings.database_url) as db:
        if args.dry_run:
            removed = database.count_prunable(db, limits)
            verb = "would remove"
        else:
            who = f"cli:{getpass.getuser()}@{worker_id(os.uname().nodename, os.getpid())}"
            try:
                removed = database.prune(
                    db,
                    limits,
                    now=clock.now,
                    owner=who[:100],
                    key=database.audit_key(settings),
                    batch_size=kept.batch_size,
                    lease_seconds=settings.scheduler.lease_seconds,
                )
            except LeaseHeld as exc:
                print(f"prune not started: {exc}; run it again after that sweep", file=sys.stderr)
                return 1
            verb = "removed"
    print(f"{verb}, operations finished before {isoformat(limits.operations)}:")
    for line in database.removed_lines(removed):
        print(f"  {line}")
    return 0


def audit_verify(args: argparse.Namespace, settings: Settings) -> int:
    with database.opened(settings.database_url) as db:
        report = database.audit(db, database.audit_key(settings))
    if report.fault is not None:
        print(f"audit FAILED: {report.fault.describe()}", file=sys.stderr)
        return 1
    print(f"audit ok: {report.operations} operations, {report.entries} history entries intact")
    if report.retention is not None:
        print(report.retention.describe())
    return 0
