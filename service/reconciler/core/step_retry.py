"""A step that fails in a way nothing foresaw: retried with backoff, a few times, then a person.

Guarantee: an unforeseen failure (a defect, a library's error) never retries at once and
never loops (docs/design.md#unforeseen-failures). Each failure of a step is counted
durably on its operation (``step_failures`` with ``failed_step``: a failure of another
step starts the count again, and a step that finishes clears it). The decision is a
value, as procrastinate's ``RetryStrategy.get_retry_decision`` and Temporal's activity
retry policy make it: the count in, ``RetryStep`` (when, from a capped exponential
backoff with a jitter floor) or ``GiveUp`` out; the worker only persists it, and
``GiveUp`` escalates ``internal_error`` naming the step and the exception's type.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from reconciler.core.backoff import BackoffPolicy
from reconciler.core.states import State
from reconciler.core.vocabulary import StepName

# Where each local state's step is counted (an end state's step is its completion).
_STEP_OF_STATE = {
    State.CREATE_PENDING: StepName.CREATE,
    State.CREATE_UNKNOWN: StepName.CREATE,
    State.OBSERVING: StepName.STATUS_READ,
    State.CANCELLING: StepName.STATUS_READ,
    State.CANCEL_REQUESTED: StepName.CANCEL,
    State.RESULT_COLLECTING: StepName.COLLECT,
}

# What an operator reads: "the status read step failed ...".
STEP_WORDS = {
    StepName.CREATE: "create",
    StepName.STATUS_READ: "status read",
    StepName.CANCEL: "cancel",
    StepName.COLLECT: "result collection",
    StepName.COMPLETE: "completion",
}


@dataclass(frozen=True)
class StepRetryPolicy:
    """About a second, doubling, capped, jittered; ``max_attempts`` failures in all."""

    base_seconds: float = 1.0
    max_seconds: float = 60.0
    jitter_floor: float = 0.5
    max_attempts: int = 5

    @property
    def backoff(self) -> BackoffPolicy:
        return BackoffPolicy(self.base_seconds, self.max_seconds, self.jitter_floor)


@dataclass(frozen=True)
class RetryStep:
    """Run the step again after ``delay_seconds``; ``attempt`` failures are counted now."""

    attempt: int
    delay_seconds: float


@dataclass(frozen=True)
class GiveUp:
    """The retries are spent: ask a person (``internal_error``)."""

    attempt: int


RetryDecision = RetryStep | GiveUp


def step_of(state: State) -> StepName:
    """The step a worker runs on an operation in ``state``."""
    return _STEP_OF_STATE.get(state, StepName.COMPLETE)


def failures_so_far(failed_step: str | None, step_failures: int, step: StepName) -> int:
    """The failures counted for ``step``: a count kept for another step does not carry over."""
    return max(0, step_failures) if failed_step == step.value else 0


def decide(policy: StepRetryPolicy, failures: int, rng: random.Random) -> RetryDecision:
    """What to do after the ``failures``-th failure in a row of one step (1 for the first)."""
    attempt = max(1, failures)
    if attempt >= policy.max_attempts:
        return GiveUp(attempt)
    # The first retry waits about base_seconds: backoff attempt 0 is the base delay.
    return RetryStep(attempt, policy.backoff.delay(attempt - 1, rng))


def exception_name(exc: BaseException) -> str:
    """The exception's type as an operator can look it up; never its message, which may
    quote a URL with a credential, a body or a statement's parameters."""
    kind = type(exc)
    if kind.__module__ in ("builtins", "__main__"):
        return kind.__qualname__
    return f"{kind.__module__}.{kind.__qualname__}"


def escalation_detail(step: StepName, attempt: int, exception: str) -> str:
    """The escalation's detail: which step, how often, and what type of failure."""
    return (
        f"the {STEP_WORDS[step]} step failed {attempt} times in a row with an error the "
        f"service did not foresee ({exception}); its automatic retries are spent"
    )
