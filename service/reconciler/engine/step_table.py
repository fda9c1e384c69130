"""Which step a worker runs on an operation in each local state, and what its span is called."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import NamedTuple

from reconciler.core.states import State
from reconciler.tracing import SpanName

# A step does one unit of work on a leased, freshly loaded operation and writes its outcome.
# A step with a ``prepare`` method may be handed its first write done (``Prep``) as a
# second argument.
Step = Callable[..., Awaitable[None]]
STATUS_READ_STATES = frozenset({State.OBSERVING, State.CANCELLING})
# What a step's span is called, by the state it runs in (a completion is ``COMPLETION``).
SPAN_OF_STATE: dict[State, SpanName] = {
    State.CREATE_PENDING: SpanName.CREATE,
    State.CREATE_UNKNOWN: SpanName.CREATE,
    State.OBSERVING: SpanName.STATUS_READ,
    State.CANCELLING: SpanName.STATUS_READ,
    State.CANCEL_REQUESTED: SpanName.CANCEL,
    State.RESULT_COLLECTING: SpanName.COLLECT,
}


class Steps(NamedTuple):
    """The steps a worker runs; which one runs is decided by ``step_table``."""

    create: Step
    poll: Step
    cancel: Step
    collect: Step
    complete: Step | None


def step_table(steps: Steps) -> dict[State, Step]:
    """The state-to-step table: what a worker does with an operation in each local state.

    States without a step (``accepted`` only passes by, ``escalated`` waits for a person,
    the end states are only completed) are parked until something changes them.
    """
    return {
        State.CREATE_PENDING: steps.create,
        State.CREATE_UNKNOWN: steps.create,
        State.OBSERVING: steps.poll,
        State.CANCELLING: steps.poll,
        State.CANCEL_REQUESTED: steps.cancel,
        State.RESULT_COLLECTING: steps.collect,
    }
