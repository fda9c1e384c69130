"""A completion step that failed: again later, or give up (``core.completion_retry``)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from reconciler.core.completion_retry import (
    MIN_RETRY_DELAY,
    CompletionRetryPolicy,
    GiveUpStep,
    RetryStepAt,
    after_failure,
)

NOW = datetime(2025, 4, 18, 10, 20, tzinfo=UTC)
POLICY = CompletionRetryPolicy(base_seconds=2.0, max_seconds=300.0, max_attempts=8)


@given(
    attempts=st.integers(1, 12),
    permanent=st.booleans(),
    asked=st.one_of(st.none(), st.integers(0, 100_000)),
    seed=st.integers(0, 2**32),
)
def test_a_failed_step_runs_again_after_a_bounded_wait_until_its_attempts_are_spent(
    attempts: int, permanent: bool, asked: int | None, seed: int
) -> None:
    retry_after = None if asked is None else str(asked)
    rng = random.Random(seed)
    decision = after_failure(
        attempts, permanent=permanent, retry_after=retry_after, now=NOW, policy=POLICY, rng=rng
    )
    if permanent or attempts >= POLICY.max_attempts:
        assert decision == GiveUpStep()
    else:
        assert isinstance(decision, RetryStepAt)
        wait = decision.at - NOW
        assert wait >= MIN_RETRY_DELAY  # a new signed timestamp, never a replay
        if asked is not None:
            assert wait >= min(timedelta(seconds=asked), timedelta(hours=6))
        assert wait <= max(timedelta(seconds=POLICY.max_seconds), timedelta(hours=6))
    # Every failure takes one draw, whatever was decided: a seeded run stays reproducible.
    same = random.Random(seed)
    same.random()
    assert rng.random() == same.random()
