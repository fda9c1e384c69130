"""An agent's create waits for its job id unless job ids have been coming late for a while."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from reconciler.core.create_wait import PROBE_EVERY, SETTLE_SECONDS, WINDOW, CreateWaits

# Waits ending this far apart: a busy replica's pace.
STEP = 0.01


def late_for(waits: CreateWaits, seconds: float, start: float = 0.0) -> float:
    """Every wait ends without its job id for ``seconds``, counted from when most of the
    window is late; returns the time reached."""
    now = start
    while now - start < seconds + WINDOW // 2 * STEP:
        waits.saw(False, now)
        now += STEP
    return now


def test_creates_wait_while_their_job_ids_come_in_time() -> None:
    waits = CreateWaits()
    for n in range(10 * WINDOW):
        assert waits.should_wait(n * STEP)
        waits.saw(True, n * STEP)


def test_a_few_late_job_ids_keep_the_wait() -> None:
    waits = CreateWaits()
    for n in range(100 * WINDOW):
        assert waits.should_wait(n * STEP)
        waits.saw(n % 4 != 0, n * STEP)  # a quarter late, for 16 s


def test_a_burst_of_late_waits_shorter_than_the_settling_time_keeps_the_wait() -> None:
    # A burst's first waits, late while the service warms up: answering at once would let
    # the burst in faster than its creates run.
    waits = CreateWaits()
    now = late_for(waits, SETTLE_SECONDS - 0.5)
    assert all(waits.should_wait(now) for _ in range(4 * PROBE_EVERY))
    for _ in range(WINDOW):
        waits.saw(True, now)  # the waits' pacing cleared the backlog
    now = late_for(waits, SETTLE_SECONDS - 0.5, start=now)
    assert waits.should_wait(now)  # the late run counts from its own start


def test_once_most_come_late_for_a_while_creates_answer_at_once_and_one_in_eight_waits() -> None:
    waits = CreateWaits()
    now = late_for(waits, SETTLE_SECONDS)
    decided = [waits.should_wait(now) for _ in range(4 * PROBE_EVERY)]
    assert decided.count(True) == 4  # the probes
    assert decided[PROBE_EVERY - 1] and not any(decided[: PROBE_EVERY - 1])


def test_sparse_creates_to_a_hung_provider_answer_at_once_from_the_settling_time() -> None:
    # One create a minute: the window fills with late waits over minutes, not seconds.
    waits = CreateWaits()
    for minute in range(WINDOW // 2 + 1):
        assert waits.should_wait(60.0 * minute)
        waits.saw(False, 60.0 * minute)
    assert waits.should_wait(60.0 * (WINDOW // 2) + SETTLE_SECONDS - 0.1)
    assert not waits.should_wait(60.0 * (WINDOW // 2 + 1))


def test_probes_that_get_their_job_id_bring_the_wait_back() -> None:
    waits = CreateWaits()
    now = late_for(waits, SETTLE_SECONDS)
    decided = []
    for _ in range((WINDOW // 2 + 1) * PROBE_EVERY):
        wait = waits.should_wait(now)
        decided.append(wait)
        if wait:
            waits.saw(True, now)  # each probe gets its job id in time
        now += STEP
    assert not all(decided)  # at once at first, but for the probes
    # Once more than half of the window came in time, every create waits again.
    assert all(waits.should_wait(now) for _ in range(WINDOW))


@given(
    st.lists(st.tuples(st.booleans(), st.floats(0.0, 2.0)), min_size=1, max_size=5 * WINDOW),
    st.floats(0.0, 20.0),
)
def test_it_answers_at_once_exactly_when_most_of_the_window_was_late_for_the_settling_time(
    seen: list[tuple[bool, float]], after: float
) -> None:
    waits = CreateWaits()
    now, window, late_since = 0.0, [], None
    for came, gap in seen:
        now += gap
        waits.saw(came, now)
        window = [*window, came][-WINDOW:]
        if window.count(False) * 2 <= WINDOW:
            late_since = None
        elif late_since is None:
            late_since = now
    now += after
    decided = [waits.should_wait(now) for _ in range(PROBE_EVERY)]
    if late_since is None or now - late_since < SETTLE_SECONDS:
        assert all(decided)
    else:
        assert decided.count(True) == 1  # at once, but for one probe in PROBE_EVERY
