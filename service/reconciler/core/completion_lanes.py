"""Completion lanes: which share of delivery slots a completion's next step runs in.

Guarantee: one receiver cannot hold everyone's slots. Hooks run in a lane of
their own; each callback receiver host has its own lane, capped at a few slots,
inside a global callback pool larger than one host may take. A lane is named by
a plain string stored on the operation (``completion_lane``), so the claim can
leave out every lane that is full; the choice of what to claim among the due
candidates is the pure ``choose`` below.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

HOOKS_LANE = ":hooks"
CALLBACK_PREFIX = "cb:"
CALLBACK_STEP = "callback"


def round_steps(hooks: Sequence[str], has_callback: bool) -> list[str]:
    """A completion round's steps, in the order they run: each hook, then the callback."""
    steps = [f"hook:{name}" for name in hooks]
    if has_callback:
        steps.append(CALLBACK_STEP)
    return steps


def callback_lane(host: str) -> str:
    """The lane of callbacks to ``host`` (the SSRF guard's checked host, lower case)."""
    return f"{CALLBACK_PREFIX}{host}"


def is_callback_lane(lane: str | None) -> bool:
    return lane is not None and lane.startswith(CALLBACK_PREFIX)


def lane_or_hooks(lane: str | None) -> str:
    """The share a stored lane runs in: callbacks by host; anything else (unset) is hooks."""
    return lane if lane is not None and is_callback_lane(lane) else HOOKS_LANE


def first_lane(has_hooks: bool, callback_host: str | None) -> str:
    """Where a completion round starts: its hooks first, else its callback, else nothing to
    run (the hooks lane only closes the round)."""
    if has_hooks or callback_host is None:
        return HOOKS_LANE
    return callback_lane(callback_host)


def host_cap(total: int, per_host: int) -> int:
    """Slots one receiver host may hold: at most ``per_host``, and never so many that the
    other hosts would be left with fewer than half of the pool (at least one)."""
    return max(1, min(per_host, total // 2))


def choose(
    candidates: Sequence[tuple[str, str]],
    free: Mapping[str, int],
    host_free: int,
    total_free: int,
) -> list[str]:
    """The candidates (id, lane), earliest first, to claim now.

    A lane takes at most its free slots (``free``, else ``host_free`` for a lane with
    nothing running), and all of them together at most ``total_free``.
    """
    room = dict(free)
    chosen: list[str] = []
    for op_id, lane in candidates:
        if len(chosen) >= total_free:
            break
        left = room.get(lane, host_free)
        if left <= 0:
            continue
        room[lane] = left - 1
        chosen.append(op_id)
    return chosen


def full(used: Mapping[str, int], cap: int) -> Iterable[str]:
    """The lanes with no slot free."""
    return sorted(lane for lane, n in used.items() if n >= cap)
