"""A completion step (a hook, the agent's callback) that failed: again later, or give up.

Pure, as ``core.step_retry`` is for the steps before it: the failed attempt in, a
``RetryStepAt`` (capped exponential backoff with jitter, never less than the receiver's
``Retry-After`` up to a ceiling) or a ``GiveUpStep`` out; ``engine.steps.complete`` only
writes it, and a step that gives up escalates ``callback_undeliverable`` while the
operation's outcome stands (docs/design.md#agent-callbacks).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta

from reconciler.core.backoff import BackoffPolicy, parse_retry_after

# A receiver may ask for a long pause, but not one that outlives every deadline.
DEFAULT_RETRY_AFTER_CEILING = timedelta(hours=6)
# A receiver tells a retry from a replayed capture by the signed timestamp, which counts
# whole seconds: a retry sent within the second of the attempt before would carry the
# same webhook-id and timestamp, and a replay guard would refuse it for good.
MIN_RETRY_DELAY = timedelta(seconds=1)
JITTER_FLOOR = 0.5


@dataclass(frozen=True)
class CompletionRetryPolicy:
    """``max_attempts`` attempts of one step in all, ``base_seconds`` doubling to a cap."""

    base_seconds: float
    max_seconds: float
    max_attempts: int

    @property
    def backoff(self) -> BackoffPolicy:
        return BackoffPolicy(self.base_seconds, self.max_seconds, JITTER_FLOOR)


@dataclass(frozen=True)
class RetryStepAt:
    """Run the step again at ``at``."""

    at: datetime


@dataclass(frozen=True)
class GiveUpStep:
    """The step failed for good (a permanent failure, or its attempts spent)."""


CompletionRetry = RetryStepAt | GiveUpStep


def next_attempt_delay(
    attempt: int,
    retry_after_raw: str | None,
    now: datetime,
    policy: BackoffPolicy,
    rng: random.Random,
    ceiling: timedelta = DEFAULT_RETRY_AFTER_CEILING,
) -> timedelta:
    """Delay before the next attempt; ``attempt`` is 0 after the first failure.

    Capped exponential backoff with jitter, never less than the receiver's
    ``Retry-After`` (seconds or HTTP-date) up to ``ceiling``, and never less than
    ``MIN_RETRY_DELAY``.
    """
    delay = max(timedelta(seconds=policy.delay(attempt, rng)), MIN_RETRY_DELAY)
    asked = parse_retry_after(retry_after_raw, now)
    if asked is not None:
        delay = max(delay, min(asked, ceiling))
    return delay


def after_failure(
    attempts: int,
    *,
    permanent: bool,
    retry_after: str | None,
    now: datetime,
    policy: CompletionRetryPolicy,
    rng: random.Random,
) -> CompletionRetry:
    """What follows the failure of a step's ``attempts``-th attempt (1 for the first)."""
    # Drawn whatever is decided: every failure takes one draw of the randomness, so a
    # seeded run does not depend on which attempt gave up.
    delay = next_attempt_delay(attempts - 1, retry_after, now, policy.backoff, rng)
    if permanent or attempts >= policy.max_attempts:
        return GiveUpStep()
    return RetryStepAt(now + delay)
