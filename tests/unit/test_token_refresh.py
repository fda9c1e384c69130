"""When an expiring credential is fetched again: before it expires, never per call, and a
failing source is asked again only after a growing pause."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from reconciler.core.token_refresh import (
    MAX_RETRY_SECONDS,
    MIN_MARGIN_SECONDS,
    refresh_at,
    retry_delay,
)

ISSUED = datetime(2026, 12, 6, 5, 0, tzinfo=UTC)


@given(st.floats(min_value=0.0, max_value=10 * 86400.0, allow_nan=False))
def test_a_token_is_fetched_again_within_its_life_and_not_before_half_of_it(life: float) -> None:
    due = refresh_at(ISSUED, life)
    assert due is not None
    lived = (due - ISSUED).total_seconds()
    assert life / 2 - 1e-6 <= lived <= life
    if life >= 2 * MIN_MARGIN_SECONDS:
        assert life - lived >= MIN_MARGIN_SECONDS  # at least a minute to spare


def test_an_hour_long_token_is_fetched_again_six_minutes_early() -> None:
    assert refresh_at(ISSUED, 3600) == ISSUED + timedelta(seconds=3240)
    assert refresh_at(ISSUED, 300) == ISSUED + timedelta(seconds=240)
    assert refresh_at(ISSUED, None) is None  # no life said: used until a 401


@given(st.integers(min_value=0, max_value=10_000))
def test_a_failing_source_waits_longer_each_time_up_to_five_minutes(failures: int) -> None:
    delay = retry_delay(failures)
    assert 0 <= delay <= MAX_RETRY_SECONDS
    assert retry_delay(failures + 1) >= delay
    assert (delay == 0) == (failures == 0)
