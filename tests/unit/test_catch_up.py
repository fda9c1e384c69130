"""The catch-up spread (core.catch_up) and the worker's shares (engine.shares): pure values."""

from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reconciler.core.catch_up import (
    PROBE_EVERY_SECONDS,
    Overdue,
    probe_due,
    spread,
    window_seconds,
)
from reconciler.engine.shares import Shares

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _overdue(n: int, interval: float, **kw: object) -> list[Overdue]:
    return [
        Overdue(
            operation_id=f"op_{i:04d}",
            due_at=NOW - timedelta(seconds=60 - i * 0.01),
            interval_seconds=interval,
            deadline_at=kw.get("deadline", NOW + timedelta(hours=1)),  # type: ignore[arg-type]
            not_before=kw.get("not_before"),  # type: ignore[arg-type]
        )
        for i in range(n)
    ]


def test_the_window_is_as_long_as_their_own_cadence_needs() -> None:
    # 300 reads every 6 s were sent at 50/s: spreading them takes 6 s at that rate.
    assert window_seconds(_overdue(300, 6.0), max_rate=100) == pytest.approx(6.0)
    # Capped at max_rate, the window grows with their number.
    assert window_seconds(_overdue(300, 1.0), max_rate=16) == pytest.approx(300 / 16)
    assert window_seconds(_overdue(600, 1.0), max_rate=16) == pytest.approx(600 / 16)


def test_no_second_carries_more_than_the_rate_allows() -> None:
    slots = spread(_overdue(300, 6.0), NOW, random.Random(7), max_rate=100)
    per_second = Counter(int((s.at - NOW).total_seconds()) for s in slots)
    assert len(slots) == 300
    assert max(per_second.values()) <= 51  # 50/s, plus one on a boundary
    # Earliest due first.
    order = [s.operation_id for s in sorted(slots, key=lambda s: s.at)]
    assert order == sorted(order)


def test_retry_after_and_deadline_bound_each_slot() -> None:
    later = NOW + timedelta(seconds=30)
    assert all(
        s.at >= later
        for s in spread(_overdue(10, 6.0, not_before=later), NOW, random.Random(1), max_rate=100)
    )
    soon = NOW + timedelta(seconds=0.5)
    assert all(
        s.at <= soon
        for s in spread(_overdue(100, 6.0, deadline=soon), NOW, random.Random(1), max_rate=100)
    )


def test_shares_never_lend_a_slot_across_providers() -> None:
    shares = Shares({"a": 2, "b": 1})
    assert shares.take("a") and shares.take("a") and not shares.take("a")
    assert shares.take("b") and not shares.move("a", "b")  # b is full: a keeps its slot
    assert shares.give("b") is True  # b was full: its waiting work may be claimed now
    assert shares.move("a", "b") and shares.free("a") == 1 and shares.free("b") == 0
    assert shares.free("unknown") == 0


@given(
    since=st.floats(min_value=0, max_value=3600),
    gap=st.floats(min_value=0, max_value=600),
    after=st.floats(min_value=0.01, max_value=600),
)
def test_a_burst_is_looked_for_before_any_read_is_much_later_than_the_threshold(
    since: float, gap: float, after: float
) -> None:
    """Looked for at ``last`` and not looked for since: every look skipped was within a
    fifth of the threshold (and a second) of the last, so a read not overdue by the
    threshold then is overdue by at most 1.2 times it, and a look is due by then."""
    last = NOW + timedelta(seconds=since)
    now = last + timedelta(seconds=gap)
    every = min(PROBE_EVERY_SECONDS, after / 5)
    due = probe_due(last, now, timedelta(seconds=after))
    if gap >= every + 1e-5:  # timedelta keeps microseconds: clear of the boundary
        assert due
    if gap < every - 1e-5:
        assert not due


def test_the_first_look_and_a_clock_gone_back_look_at_once() -> None:
    assert probe_due(None, NOW, timedelta(seconds=5))
    assert probe_due(NOW, NOW - timedelta(seconds=1), timedelta(seconds=5))
    assert not probe_due(NOW, NOW + timedelta(milliseconds=999), timedelta(seconds=5))
    assert probe_due(NOW, NOW + timedelta(seconds=1), timedelta(seconds=5))
    assert probe_due(NOW, NOW + timedelta(milliseconds=200), timedelta(seconds=1))
