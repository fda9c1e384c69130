"""Whether an agent's create waits for its job id (``server.create_wait_seconds``).

The wait is worth its time only when the job id comes within it: the answer then
carries it, and the agent need not ask again. When the job ids of this process's
creates stop coming in time (the provider's share full, a backlog of creates), each wait
is spent in full and the agent learns nothing more for it; a create then answers at
once. Which it is, is learned from this process's own recent waits: once more than
half of the last ``WINDOW`` ended without the job id, creates answer at once, and one in
``PROBE_EVERY`` still waits, so that job ids coming in time again are seen.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

WINDOW = 16
PROBE_EVERY = 8


@dataclass
class CreateWaits:
    """The outcomes of the last ``WINDOW`` waits (True: the job id came within it)."""

    recent: deque[bool] = field(default_factory=lambda: deque(maxlen=WINDOW))
    skipped: int = 0  # creates answered at once since the last wait

    def should_wait(self) -> bool:
        misses = sum(1 for came in self.recent if not came)
        if misses * 2 <= WINDOW:
            return True
        self.skipped += 1
        if self.skipped >= PROBE_EVERY:
            self.skipped = 0
            return True
        return False

    def saw(self, came: bool) -> None:
        """One wait ended: with the job id (``came``) or without it."""
        self.recent.append(came)
