"""What this process has seen of its database's writes: readiness, and our own outages.

Guarantee: our outage is known as ours. Every write transaction reports
here how it ended; ``/readyz`` turns 503 while writes fail (disk full,
read-only file, a lock held past the bound, an unreachable server) and
back when they succeed, and the engine asks which outages overlapped a
window before it blames a provider for that window.

The log names the condition once per outage: a WARNING when writes start failing
(``disk full``, ``read-only``, ``locked``, ``unreachable``), another if the cause
changes, and one line when they succeed again. These are expected conditions of a
database, not the service's errors.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum


class WriteFailure(StrEnum):
    DISK_FULL = "disk_full"
    READ_ONLY = "read_only"
    LOCKED = "locked"
    UNREACHABLE = "unreachable"


log = logging.getLogger("reconciler.storage.availability")

# Failures that a committed transaction which changed nothing does not disprove: taking
# the write lock proves the lock is free and the server reachable, not that pages fit.
_NEEDS_A_REAL_WRITE = frozenset({WriteFailure.DISK_FULL, WriteFailure.READ_ONLY})
# A failure is forgotten this long after the last one if no write was tried since.
FAILURE_MEMORY = timedelta(seconds=10)
KEPT_OUTAGES = 100
# What each failure means, for the log (never the driver's text: it may quote a statement).
MEANINGS = {
    WriteFailure.DISK_FULL: "disk full: the database cannot grow; free space on its volume",
    WriteFailure.READ_ONLY: "the database file or volume is read-only",
    WriteFailure.LOCKED: "the database is locked or busy past the write bound",
    WriteFailure.UNREACHABLE: "the database is unreachable",
}
# Driver texts of a full disk: SQLite's SQLITE_FULL and PostgreSQL's ENOSPC (SQLSTATE 53100).
_DISK_FULL_TEXTS = ("database or disk is full", "no space left on device", "disk full")


def classify(exc: BaseException) -> WriteFailure:
    """Why a write failed, from the driver error behind ``StorageUnavailable``."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, sqlite3.Error):
            code = getattr(cause, "sqlite_errorcode", None)
            if code == sqlite3.SQLITE_FULL:
                return WriteFailure.DISK_FULL
            if code == sqlite3.SQLITE_READONLY:
                return WriteFailure.READ_ONLY
            if code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
                return WriteFailure.LOCKED
        if getattr(cause, "sqlstate", None) == "53100":  # PostgreSQL disk_full
            return WriteFailure.DISK_FULL
        if any(t in str(cause).lower() for t in _DISK_FULL_TEXTS):
            return WriteFailure.DISK_FULL
        cause = cause.__cause__ or getattr(cause, "orig", None)
    text = str(exc).lower()
    if "busy" in text or "locked" in text or "did not complete" in text or "queue" in text:
        return WriteFailure.LOCKED
    return WriteFailure.UNREACHABLE


def explain(exc: BaseException) -> str:
    """The failure behind a storage error, in words fit for the log."""
    return MEANINGS[classify(exc)]


@dataclass(frozen=True)
class Outage:
    """A stretch during which every write of this process failed."""

    started_at: datetime
    ended_at: datetime
    failure: WriteFailure

    @property
    def seconds(self) -> float:
        return (self.ended_at - self.started_at).total_seconds()


class Availability:
    """Thread-safe; written by the writer threads, read by the loop and the engine."""

    def __init__(self, now: Callable[[], datetime] | None = None) -> None:
        self._now = now or (lambda: datetime.now(UTC))
        self._lock = threading.Lock()
        self._failing_since: datetime | None = None
        self._last_failure: tuple[datetime, WriteFailure] | None = None
        self._outages: deque[Outage] = deque(maxlen=KEPT_OUTAGES)
        self._on_recovery: list[Callable[[], None]] = []

    def on_recovery(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (on the writer's thread) each time writes succeed after failing."""
        self._on_recovery.append(callback)

    def failed(self, failure: WriteFailure) -> None:
        now = self._now()
        with self._lock:
            before = self._last_failure[1] if self._last_failure is not None else None
            if self._failing_since is None:
                self._failing_since = now
            self._last_failure = (now, failure)
        if before is not failure:
            log.warning(
                "database writes are failing: %s",
                MEANINGS[failure],
                extra={"failure": failure.value},
            )

    def succeeded(self, *, changed: bool) -> None:
        """A write transaction committed (``changed``: it wrote rows)."""
        with self._lock:
            last = self._last_failure
            if last is None:
                return
            if not changed and last[1] in _NEEDS_A_REAL_WRITE:
                return
            assert self._failing_since is not None
            outage = Outage(self._failing_since, self._now(), last[1])
            self._outages.append(outage)
            self._failing_since = None
            self._last_failure = None
        log.info(
            "database writes succeed again after %.1f s (%s)",
            outage.seconds,
            outage.failure.value,
            extra={"failure": outage.failure.value},
        )
        for callback in self._on_recovery:
            callback()

    def readiness(self) -> tuple[bool, str]:
        with self._lock:
            last = self._last_failure
        if last is None:
            return True, "ready"
        at, failure = last
        if self._now() - at > FAILURE_MEMORY:
            return True, "ready"
        return False, f"writes are failing: {failure.value} since {at.isoformat()}"

    def outages_between(self, start: datetime, end: datetime) -> list[Outage]:
        """Outages (ended or still going) that overlap ``[start, end]``."""
        with self._lock:
            found = [o for o in self._outages if o.started_at < end and o.ended_at > start]
            if self._failing_since is not None and self._failing_since < end:
                failure = self._last_failure[1] if self._last_failure else WriteFailure.UNREACHABLE
                found.append(Outage(self._failing_since, self._now(), failure))
        return found
