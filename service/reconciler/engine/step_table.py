"""Which step a worker runs on an operation in each local state, and what its span is called."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

from reconciler.core.records import OperationRecord
from reconciler.core.states import END_STATES, State
from reconciler.engine.flow import Preparer
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


@dataclass(frozen=True)
class StepChoice:
    """Which step runs on an operation now: the state's (``step_table``), or the completion
    handler on an end state whose completion is pending."""

    table: Mapping[State, Step]
    completion: Step | None

    @classmethod
    def of(cls, steps: Steps) -> StepChoice:
        return cls(step_table(steps), steps.complete)

    def step_for(self, op: OperationRecord) -> Step | None:
        state = State(op.state)
        # Only an end state is completed: an operator may have reopened one (extend, cancel)
        # before its completion finished, and then the flows own the operation again.
        if op.completion_pending and self.completion is not None and state in END_STATES:
            return self.completion
        return self.table.get(state)

    def preparer(self, op: OperationRecord, now: datetime) -> Preparer | None:
        """The step that will run on ``op`` now, if it can do its first write ahead."""
        if op.next_poll_at is None or op.next_poll_at > now:
            return None
        step = self.step_for(op)
        return step if step is not None and hasattr(step, "prepare") else None
