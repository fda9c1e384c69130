"""The worker's slots, split into bounded shares: one per provider, hooks, callback hosts.

Guarantee: a party that hangs fills only its own share. Each provider's work
(create, lookup, status, cancel, result) runs in that provider's share; hooks
run in a share of their own; each callback receiver host has its own share
(``host_cap`` slots) inside a callback pool that one host can never fill
(``core.completion_lanes``). The claim asks for no more operations of a share
than it has free slots and leaves out every host whose share is full, so the
worker never holds work it cannot start while another share's work waits.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from reconciler.core.completion_lanes import (
    HOOKS_LANE,
    full,
    host_cap,
    is_callback_lane,
    lane_or_hooks,
)
from reconciler.core.records import OperationRecord
from reconciler.core.states import END_STATES, State

# The claim's key for "any callback host with a free slot"; a claimed operation then runs
# in its own host's share. Neither key can be a provider's name (those have no colon).
CALLBACKS = ":callbacks"
HOOKS = HOOKS_LANE
# A task's share once it lent its slot back (``Flow.lend``): it holds none until it moves.
NO_SLOT = ""


def completing(op: OperationRecord) -> bool:
    return bool(op.completion_pending) and State(op.state) in END_STATES


def share_of(op: OperationRecord) -> str:
    """Which share an operation's next step runs in (the claim uses the same rule)."""
    if completing(op):
        return lane_or_hooks(op.completion_lane)
    return str(op.provider)


class Shares:
    """Free-slot accounting per share, on the event loop only (no locking).

    ``capacities`` are the fixed shares (providers, hooks); ``callbacks`` is the pool of
    callback slots, of which one host takes at most ``host_cap(callbacks, per_host)``.
    """

    def __init__(
        self, capacities: Mapping[str, int], *, callbacks: int = 0, per_host: int = 1
    ) -> None:
        self._capacity = dict(capacities)
        self._used = dict.fromkeys(capacities, 0)
        self._pool = callbacks
        self.host_cap = host_cap(callbacks, per_host) if callbacks > 0 else 0
        self._hosts: dict[str, int] = {}
        # While a claim is in flight it asks for the free slots as they were; a task taking
        # one meanwhile (a completion's, or a provider's after a create lent its slot back)
        # could leave a claimed operation with no slot, its step prepared and its lease
        # idle until it expired. So only the claim's own take may, of any share.
        self.claiming = False

    def __iter__(self) -> Iterator[str]:
        """The fixed shares, then the callback pool (claimed as one, see ``CALLBACKS``)."""
        yield from self._capacity
        if self._pool > 0:
            yield CALLBACKS

    def pool_free(self) -> int:
        return self._pool - sum(self._hosts.values())

    def free(self, key: str) -> int:
        if key == CALLBACKS:
            return self.pool_free()
        if is_callback_lane(key):
            return min(self.host_cap - self._hosts.get(key, 0), self.pool_free())
        if key not in self._capacity:
            return 0
        return self._capacity[key] - self._used[key]

    def full_now(self) -> frozenset[str]:
        """The shares with no free slot as of now: fixed ones by name, callback hosts by lane
        (every host's, once the pool itself is used up: ``CALLBACKS`` then stands for them).

        A snapshot the loop hands to a write on the writer thread, which must not read the
        live counts; it may be stale by the time the write commits (see ``engine.flow``).
        """
        names = [key for key in self._capacity if self.free(key) <= 0]
        if self._pool > 0 and self.pool_free() <= 0:
            names.append(CALLBACKS)
        names.extend(self.full_hosts())
        return frozenset(names)

    def used(self, key: str) -> int:
        if is_callback_lane(key):
            return self._hosts.get(key, 0)
        return self._used.get(key, 0)

    def full_hosts(self) -> list[str]:
        """Callback hosts with no slot of their own left: the claim leaves them out."""
        return list(full(self._hosts, self.host_cap))

    def host_room(self) -> dict[str, int]:
        """Free slots of each host with deliveries running (others have ``host_cap``)."""
        return {lane: self.host_cap - n for lane, n in self._hosts.items()}

    def take(self, key: str, *, claimed: bool = False) -> bool:
        """One slot of ``key``; ``claimed``: for an operation the claim just leased."""
        if key == CALLBACKS or self.free(key) <= 0:
            return False
        if self.claiming and not claimed:
            return False
        if is_callback_lane(key):
            self._hosts[key] = self._hosts.get(key, 0) + 1
        else:
            self._used[key] += 1
        return True

    def _drop(self, key: str) -> None:
        if is_callback_lane(key):
            left = self._hosts[key] - 1
            if left:
                self._hosts[key] = left
            else:
                del self._hosts[key]
        else:
            self._used[key] -= 1

    def give(self, key: str) -> bool:
        """Free one slot; True when the share was full (work may be waiting for it)."""
        was_full = self.free(key) == 0
        self._drop(key)
        return was_full

    def move(self, frm: str, to: str) -> bool:
        """Hand a running operation to another share if it has room (else it stays put);
        from ``NO_SLOT`` it only takes one."""
        if frm == to:
            return True
        if frm == NO_SLOT:
            return self.take(to)
        if not self.take(to):
            return False
        self._drop(frm)
        return True


__all__ = ["CALLBACKS", "HOOKS", "NO_SLOT", "Shares", "completing", "share_of"]
