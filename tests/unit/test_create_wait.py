"""An agent's create waits for its job id only while job ids come within the wait."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from reconciler.core.create_wait import PROBE_EVERY, WINDOW, CreateWaits


def test_creates_wait_while_their_job_ids_come_in_time() -> None:
    waits = CreateWaits()
    for _ in range(10 * WINDOW):
        assert waits.should_wait()
        waits.saw(True)


def test_a_few_late_job_ids_keep_the_wait() -> None:
    waits = CreateWaits()
    for n in range(10 * WINDOW):
        assert waits.should_wait()
        waits.saw(n % 4 != 0)  # a quarter late


def test_once_most_come_late_creates_answer_at_once_and_one_in_eight_still_waits() -> None:
    waits = CreateWaits()
    for _ in range(WINDOW):
        waits.saw(False)
    decided = [waits.should_wait() for _ in range(4 * PROBE_EVERY)]
    assert decided.count(True) == 4  # the probes
    assert decided[PROBE_EVERY - 1] and not any(decided[: PROBE_EVERY - 1])


def test_probes_that_get_their_job_id_bring_the_wait_back() -> None:
    waits = CreateWaits()
    for _ in range(WINDOW):
        waits.saw(False)
    decided = []
    for _ in range((WINDOW // 2 + 1) * PROBE_EVERY):
        wait = waits.should_wait()
        decided.append(wait)
        if wait:
            waits.saw(True)  # each probe gets its job id in time
    assert not all(decided)  # at once at first, but for the probes
    # Once more than half of the window came in time, every create waits again.
    assert all(waits.should_wait() for _ in range(WINDOW))


@given(st.lists(st.booleans(), min_size=WINDOW, max_size=5 * WINDOW))
def test_it_waits_exactly_when_at_most_half_the_last_window_came_late(seen: list[bool]) -> None:
    waits = CreateWaits()
    for came in seen:
        waits.saw(came)
    late = seen[-WINDOW:].count(False)
    if late * 2 <= WINDOW:
        assert waits.should_wait()
    else:
        # At once, but for one probe in PROBE_EVERY.
        assert [waits.should_wait() for _ in range(PROBE_EVERY)].count(True) == 1
