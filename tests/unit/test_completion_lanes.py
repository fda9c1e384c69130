"""Completion lanes: the per-host cap and the claim's choice, as properties."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from reconciler.core.completion_lanes import (
    HOOKS_LANE,
    callback_lane,
    choose,
    first_lane,
    host_cap,
    lane_or_hooks,
)
from reconciler.engine.shares import CALLBACKS, NO_SLOT, Shares

LANES = st.sampled_from([callback_lane(h) for h in ("a.example", "b.example", "127.0.0.2")])


@given(st.integers(1, 500), st.integers(1, 500))
def test_one_host_never_takes_the_pool(total: int, per_host: int) -> None:
    cap = host_cap(total, per_host)
    assert 1 <= cap <= per_host
    if total >= 2:
        assert total - cap >= total // 2 >= 1  # the other hosts keep at least half


@given(
    st.lists(LANES, max_size=60),
    st.dictionaries(LANES, st.integers(0, 4)),
    st.integers(1, 4),
    st.integers(0, 40),
)
def test_the_choice_keeps_every_cap(
    lanes: list[str], used: dict[str, int], cap: int, total_free: int
) -> None:
    candidates = [(f"op{i}", lane) for i, lane in enumerate(lanes)]
    room = {lane: cap - min(n, cap) for lane, n in used.items()}
    chosen = choose(candidates, room, cap, total_free)
    assert len(chosen) <= total_free
    taken = Counter(dict(candidates)[op_id] for op_id in chosen)
    for lane, n in taken.items():
        assert n <= room.get(lane, cap)
    # Earliest first, and nothing passed over that had room when it came up.
    order = [op_id for op_id, _ in candidates]
    assert chosen == sorted(chosen, key=order.index)
    if len(chosen) < total_free:
        for op_id, lane in candidates:
            if op_id not in chosen:
                assert taken[lane] >= room.get(lane, cap)


def test_lanes_start_with_hooks_then_the_callback_host() -> None:
    assert first_lane(True, "a.example") == HOOKS_LANE
    assert first_lane(False, "a.example") == "cb:a.example"
    assert first_lane(False, None) == HOOKS_LANE
    assert lane_or_hooks(None) == HOOKS_LANE
    assert lane_or_hooks("cb:a.example") == "cb:a.example"


@given(st.lists(st.tuples(st.booleans(), LANES), max_size=80))
def test_shares_hold_a_host_to_its_cap_and_the_pool_to_its_size(
    steps: list[tuple[bool, str]],
) -> None:
    shares = Shares({HOOKS_LANE: 2}, callbacks=6, per_host=2)
    held: Counter[str] = Counter()
    for take, lane in steps:
        if take:
            if shares.take(lane):
                held[lane] += 1
        elif held[lane]:
            shares.give(lane)
            held[lane] -= 1
        assert all(shares.used(lane) == n <= shares.host_cap for lane, n in held.items())
        assert shares.free(CALLBACKS) == 6 - sum(held.values()) >= 0
        assert set(shares.full_hosts()) == {lane for lane, n in held.items() if n >= 2}
    assert shares.free(HOOKS_LANE) == 2  # callbacks never touch the hooks' share


def test_while_a_claim_is_in_flight_only_the_claim_takes_slots() -> None:
    """The claim asked for the free slots as they were; a task taking one meanwhile would
    leave a claimed operation without a slot, its step prepared (a provider's: the status
    request charged) and its lease idle until it expired."""
    shares = Shares({"prov": 1, HOOKS_LANE: 1}, callbacks=4, per_host=2)
    lane = callback_lane("a.example")
    shares.claiming = True
    assert not shares.take(lane) and not shares.take(HOOKS_LANE)
    assert not shares.take("prov")  # a task whose create lent its slot back, moving on
    assert not shares.move(NO_SLOT, "prov")
    assert shares.take("prov", claimed=True)
    assert not shares.move("prov", lane)
    assert shares.take(lane, claimed=True) and shares.take(HOOKS_LANE, claimed=True)
    shares.claiming = False
    assert shares.take(lane) and not shares.take(lane)  # the host's two, and no more


def test_full_now_names_each_full_share_and_the_spent_pool() -> None:
    shares = Shares({"prov": 1, HOOKS_LANE: 2}, callbacks=2, per_host=1)
    a, b = callback_lane("a.example"), callback_lane("b.example")
    assert shares.full_now() == frozenset()
    assert shares.take("prov") and shares.take(HOOKS_LANE) and shares.take(a)
    assert shares.full_now() == {"prov", a}  # hooks has one left, b its own slot
    assert shares.take(b)
    assert shares.full_now() == {"prov", a, b, CALLBACKS}
    shares.give(a)
    assert shares.full_now() == {"prov", b}
