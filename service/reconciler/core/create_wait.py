"""Whether an agent's create waits for its job id (``server.create_wait_seconds``).

The wait is worth its time when the job id comes within it: the answer then carries
it, and the agent need not ask again. It also paces the agents: an agent whose create
waits sends its next one only once the job exists, so a burst goes in no faster than
the provider's share takes it. When the job ids of this process's creates stop coming
in time (the provider's share full, a provider that hangs), each wait is spent in full
and the agent learns nothing for it; a create then answers at once.

Not at the first late ones, though. A burst's first waits may end without the job id
while the service warms up; answering at once then lets the burst in faster than its
creates run, and the backlog that makes keeps every later wait late too, for as long as
the burst lasts (measured on PostgreSQL, 1,000 creates 32 at a time: create -> callback
3-6 s instead of 0.75 s). So creates answer at once only once more than half of the last
``WINDOW`` waits have been ending without the job id for ``SETTLE_SECONDS``; while
they do, one in ``PROBE_EVERY`` still waits, so that job ids coming in time again are seen.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

WINDOW = 16
PROBE_EVERY = 8
# How long most waits must have been late before creates answer at once: longer than a
# burst's warm-up, which the waits' own pacing clears in about a second.
SETTLE_SECONDS = 5.0


@dataclass
class CreateWaits:
    """The outcomes of the last ``WINDOW`` waits (True: the job id came within it), and
    since when (a monotonic clock's reading) more than half of them have been late."""

    recent: deque[bool] = field(default_factory=lambda: deque(maxlen=WINDOW))
    late_since: float | None = None
    skipped: int = 0  # creates answered at once since the last wait

    def should_wait(self, now: float) -> bool:
        if self.late_since is None or now - self.late_since < SETTLE_SECONDS:
            return True
        self.skipped += 1
        if self.skipped >= PROBE_EVERY:
            self.skipped = 0
            return True
        return False

    def saw(self, came: bool, now: float) -> None:
        """One wait ended at ``now``: with the job id (``came``) or without it."""
        self.recent.append(came)
        late = sum(1 for came_in_time in self.recent if not came_in_time)
        if late * 2 <= WINDOW:
            self.late_since = None
        elif self.late_since is None:
            self.late_since = now
