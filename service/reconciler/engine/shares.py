"""The worker's slots, split into bounded shares: one per provider, one for completions.

Guarantee: a party that hangs fills only its own share. Each provider's work
(create, lookup, status, cancel, result) runs in that provider's share, and
the completion handlers (hooks and agent callbacks) run in their own; the
claim asks for no more operations of a share than it has free slots, so the
worker never holds work it cannot start while another share's work waits.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from reconciler.core.states import END_STATES, State
from reconciler.storage.models import Operation

# The share key of completion handlers; provider shares are keyed by the provider's name,
# which cannot collide with it (provider names are identifiers without a colon).
COMPLETION = ":completion"


def share_of(op: Operation) -> str:
    """Which share an operation's next step runs in (the claim uses the same rule)."""
    if op.completion_pending and State(op.state) in END_STATES:
        return COMPLETION
    return str(op.provider)


class Shares:
    """Free-slot accounting per share, on the event loop only (no locking)."""

    def __init__(self, capacities: Mapping[str, int]) -> None:
        self._capacity = dict(capacities)
        self._used = dict.fromkeys(capacities, 0)

    def __iter__(self) -> Iterator[str]:
        return iter(self._capacity)

    def free(self, key: str) -> int:
        if key not in self._capacity:
            return 0
        return self._capacity[key] - self._used[key]

    def used(self, key: str) -> int:
        return self._used.get(key, 0)

    def take(self, key: str) -> bool:
        if self.free(key) <= 0:
            return False
        self._used[key] += 1
        return True

    def give(self, key: str) -> bool:
        """Free one slot; True when the share was full (work may be waiting for it)."""
        was_full = self.free(key) == 0
        self._used[key] -= 1
        return was_full

    def move(self, frm: str, to: str) -> bool:
        """Hand a running operation to another share if it has room (else it stays put)."""
        if frm == to:
            return True
        if not self.take(to):
            return False
        self._used[frm] -= 1
        return True
