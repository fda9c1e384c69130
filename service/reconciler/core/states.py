"""Local operation states and the only transitions allowed between them.

Guarantee: a transition that is not in the table cannot be stored. The single
write path (``storage.journal``) consults ``check_transition`` before writing.
Remote states are the provider's words and live elsewhere
(``providers.state_table``); these are our own facts.
"""

from __future__ import annotations

from enum import StrEnum

from reconciler.core.errors import IllegalTransition


class State(StrEnum):
    CREATE_PENDING = "create_pending"
    CREATE_UNKNOWN = "create_unknown"
    ACCEPTED = "accepted"
    OBSERVING = "observing"
    CANCEL_REQUESTED = "cancel_requested"
    CANCELLING = "cancelling"
    RESULT_COLLECTING = "result_collecting"
    SUCCEEDED = "succeeded"
    COMPLETED_WITH_ERRORS = "completed_with_errors"
    FAILED = "failed"
    CANCELLED = "cancelled"
    RESULT_TIMED_OUT = "result_timed_out"
    RESULT_UNAVAILABLE = "result_unavailable"
    RESULT_VALIDATION_FAILED = "result_validation_failed"
    CANCELLATION_UNCONFIRMED = "cancellation_unconfirmed"
    ESCALATED = "escalated"


END_STATES: frozenset[State] = frozenset(
    {
        State.SUCCEEDED,
        State.COMPLETED_WITH_ERRORS,
        State.FAILED,
        State.CANCELLED,
        State.RESULT_TIMED_OUT,
        State.RESULT_UNAVAILABLE,
        State.RESULT_VALIDATION_FAILED,
        State.CANCELLATION_UNCONFIRMED,
    }
)
# The ends that leave a usable outcome; every other end is a failure to the agent (the
# answers' isError, the client's ``failed``).
USABLE_ENDS: frozenset[State] = frozenset(
    {State.SUCCEEDED, State.COMPLETED_WITH_ERRORS, State.CANCELLED}
)

S = State

# The spine is create_pending -> accepted -> observing -> result_collecting ->
# succeeded, with the create_unknown detour and the cancel path; every stop
# that needs a person goes through `escalated`, and two end states
# (result_timed_out, cancellation_unconfirmed) can be reopened only by an
# operator's recorded decision (docs/design.md#states).
TRANSITIONS: dict[State, frozenset[State]] = {
    S.CREATE_PENDING: frozenset({S.CREATE_UNKNOWN, S.ACCEPTED, S.FAILED, S.CANCELLED, S.ESCALATED}),
    S.CREATE_UNKNOWN: frozenset({S.ACCEPTED, S.FAILED, S.CANCELLED, S.ESCALATED}),
    S.ACCEPTED: frozenset(
        {S.OBSERVING, S.CANCEL_REQUESTED, S.RESULT_COLLECTING, S.FAILED, S.ESCALATED}
    ),
    S.OBSERVING: frozenset(
        {
            S.RESULT_COLLECTING,
            S.FAILED,
            S.CANCELLED,
            S.CANCEL_REQUESTED,
            S.RESULT_TIMED_OUT,
            S.ESCALATED,
        }
    ),
    S.CANCEL_REQUESTED: frozenset(
        {
            S.OBSERVING,  # the provider refused the cancel: the job goes on
            S.CANCELLING,
            S.CANCELLED,
            S.RESULT_COLLECTING,
            S.FAILED,
            S.CANCELLATION_UNCONFIRMED,
            S.ESCALATED,
        }
    ),
    S.CANCELLING: frozenset(
        {S.CANCELLED, S.RESULT_COLLECTING, S.FAILED, S.CANCELLATION_UNCONFIRMED, S.ESCALATED}
    ),
    S.RESULT_COLLECTING: frozenset(
        {
            S.SUCCEEDED,
            S.COMPLETED_WITH_ERRORS,
            S.RESULT_UNAVAILABLE,
            S.RESULT_VALIDATION_FAILED,
            S.FAILED,
            S.ESCALATED,
        }
    ),
    S.ESCALATED: frozenset(
        {
            S.OBSERVING,
            S.RESULT_COLLECTING,
            S.CREATE_UNKNOWN,
            S.CANCEL_REQUESTED,
            S.CANCELLING,
            S.FAILED,
            S.RESULT_TIMED_OUT,
            S.CANCELLATION_UNCONFIRMED,
        }
    ),
    S.RESULT_TIMED_OUT: frozenset({S.OBSERVING, S.CANCEL_REQUESTED}),
    S.CANCELLATION_UNCONFIRMED: frozenset({S.CANCELLING}),
    S.SUCCEEDED: frozenset(),
    S.COMPLETED_WITH_ERRORS: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
    S.RESULT_UNAVAILABLE: frozenset(),
    S.RESULT_VALIDATION_FAILED: frozenset(),
}

# Leaving an end state is only ever an operator's decision.
REOPENING: frozenset[tuple[State, State]] = frozenset(
    {
        (S.RESULT_TIMED_OUT, S.OBSERVING),
        (S.RESULT_TIMED_OUT, S.CANCEL_REQUESTED),
        (S.CANCELLATION_UNCONFIRMED, S.CANCELLING),
    }
)


def allowed(frm: State, to: State) -> bool:
    return to in TRANSITIONS[frm]


def check_transition(frm: State, to: State) -> None:
    if not allowed(frm, to):
        raise IllegalTransition(f"transition {frm.value} -> {to.value} is not allowed")


# End states that a pending escalation can still reopen (the operator's decision).
REOPENABLE: frozenset[State] = frozenset(frm for frm, _ in REOPENING)


def awaits_decision(state: State, escalation_open: bool) -> bool:
    """Waiting has stopped and the next move is a person's: ``escalated``, or an end
    state that the open escalation's decision may reopen. Any other end state stands,
    even with an escalation open (a callback that could not be delivered)."""
    return state is State.ESCALATED or (escalation_open and state in REOPENABLE)


def is_done(state: State, escalation_open: bool) -> bool:
    """Nothing more will happen without a new request: an end state with no decision
    pending. An end state that the open escalation's decision may still reopen is not
    done until that decision is recorded (docs/design.md#reopening)."""
    return state in END_STATES and not awaits_decision(state, escalation_open)
