"""When an outage's repeated failure is worth a log line: pure decisions over a clock value.

An outage makes the same thing fail on every tick, webhook and request. The log should
say it once when it starts, once a minute while it lasts (how many failures it did not
log since the line before), and once when it ends (how long, how many in all): a few
lines per outage of any length, not one per attempt. One throttle per kind of failure,
so that one kind never hides another.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

# Seconds between the lines of one outage.
OUTAGE_LOG_SECONDS = 60.0


class Beat(StrEnum):
    STARTED = "started"
    CONTINUING = "continuing"
    ENDED = "ended"


@dataclass(frozen=True)
class Line:
    """A line to log: which beat of the outage, and its counts."""

    beat: Beat
    seconds: float  # since the outage began
    skipped: int  # failures not logged since the previous line
    failures: int  # failures so far, logged or not


class OutageThrottle:
    """One kind of failure: ``failed``/``succeeded`` answer the line to log, or None."""

    def __init__(self, every: float = OUTAGE_LOG_SECONDS) -> None:
        self.every = every
        self.started_at: float | None = None
        self.logged_at = 0.0
        self.skipped = 0
        self.failures = 0

    @property
    def failing(self) -> bool:
        return self.started_at is not None

    def failed(self, now: float) -> Line | None:
        self.failures += 1
        if self.started_at is None:
            self.started_at = self.logged_at = now
            return Line(Beat.STARTED, 0.0, 0, self.failures)
        if now - self.logged_at < self.every:
            self.skipped += 1
            return None
        line = Line(Beat.CONTINUING, now - self.started_at, self.skipped, self.failures)
        self.logged_at, self.skipped = now, 0
        return line

    def succeeded(self, now: float) -> Line | None:
        if self.started_at is None:
            return None
        line = Line(Beat.ENDED, now - self.started_at, self.skipped, self.failures)
        self.started_at, self.skipped, self.failures = None, 0, 0
        return line
