"""``core.log_throttle``: an outage of any length and any failure rate is a few lines."""

from __future__ import annotations

import itertools
import math

from hypothesis import given
from hypothesis import strategies as st

from reconciler.core.log_throttle import Beat, OutageThrottle

GAPS = st.lists(st.floats(0, 30, allow_nan=False), min_size=1, max_size=400)


@given(gaps=GAPS, every=st.floats(1, 120))
def test_lines_are_bounded_by_the_outage_length_and_count_every_failure(
    gaps: list[float], every: float
) -> None:
    throttle = OutageThrottle(every)
    now, lines = 1000.0, []
    for gap in gaps:
        now += gap
        line = throttle.failed(now)
        if line is not None:
            lines.append(line)
    end = throttle.succeeded(now + 1)
    assert end is not None and end.beat is Beat.ENDED
    assert lines[0].beat is Beat.STARTED
    assert all(line.beat is Beat.CONTINUING for line in lines[1:])
    duration = now - (1000.0 + gaps[0])
    assert len(lines) <= 1 + math.floor(duration / every) + 1
    # Each failure is logged or counted in the next line, exactly once.
    assert end.failures == len(gaps)
    assert len(lines) + sum(line.skipped for line in lines) + end.skipped == len(gaps)
    # Lines of one outage are at least ``every`` apart.
    assert all(b.seconds - a.seconds >= every - 1e-9 for a, b in itertools.pairwise(lines))


def test_success_without_an_outage_says_nothing_and_a_new_outage_starts_over() -> None:
    throttle = OutageThrottle(60)
    assert throttle.succeeded(0) is None
    started = throttle.failed(1)
    assert started is not None and started.beat is Beat.STARTED
    assert throttle.failed(2) is None
    ended = throttle.succeeded(3)
    assert ended is not None and (ended.failures, ended.skipped, ended.seconds) == (2, 1, 2)
    again = throttle.failed(4)
    assert again is not None and again.beat is Beat.STARTED and again.failures == 1
