"""How a joined transaction's writes are grouped into lanes (``pipelined.lanes``): a lane
runs its writes one after another, the lanes beside each other."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from reconciler.storage.pipelined import lanes


@given(st.lists(st.sampled_from(["", "a", "b", "c"]), max_size=40).map(sorted))
def test_each_operation_gets_one_lane_of_its_writes_in_order(keys: list[str]) -> None:
    grouped = lanes(keys)
    # Every write once, in its order.
    assert [i for lane in grouped for i in lane] == list(range(len(keys)))
    # One key a lane, and never two lanes of one key.
    lane_keys = [{keys[i] for i in lane} for lane in grouped]
    assert all(len(k) == 1 for k in lane_keys)
    assert len(grouped) == len(set(keys))


def test_the_writes_over_many_rows_share_the_first_lane() -> None:
    assert lanes(["", "", "a", "b", "b"]) == [[0, 1], [2], [3, 4]]
