"""The transition table itself: shape and the pure check."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reconciler.core.errors import IllegalTransition
from reconciler.core.states import (
    END_STATES,
    REOPENABLE,
    REOPENING,
    TRANSITIONS,
    State,
    awaits_decision,
    check_transition,
    is_done,
)


def test_every_state_has_a_row() -> None:
    assert set(TRANSITIONS) == set(State)


def test_end_states_have_no_way_out_except_operator_reopening() -> None:
    for end in END_STATES:
        for to in TRANSITIONS[end]:
            assert (end, to) in REOPENING


def test_escalated_is_not_an_end_state() -> None:
    assert State.ESCALATED not in END_STATES
    assert TRANSITIONS[State.ESCALATED]


def test_every_state_is_reachable_from_create_pending() -> None:
    seen = {State.CREATE_PENDING}
    frontier = [State.CREATE_PENDING]
    while frontier:
        for nxt in TRANSITIONS[frontier.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                frontier.append(nxt)
    assert seen == set(State)


@pytest.mark.parametrize(
    ("frm", "to"),
    [
        (State.OBSERVING, State.SUCCEEDED),  # progress 100 is not success: collect first
        (State.CREATE_PENDING, State.OBSERVING),  # no job id yet
        (State.CANCELLING, State.OBSERVING),
        (State.SUCCEEDED, State.FAILED),
        (State.FAILED, State.OBSERVING),
        (State.CREATE_PENDING, State.RESULT_COLLECTING),
        (State.RESULT_COLLECTING, State.OBSERVING),
        (State.CANCELLED, State.CANCEL_REQUESTED),
    ],
)
def test_forbidden_transitions_raise(frm: State, to: State) -> None:
    with pytest.raises(IllegalTransition, match=f"{frm.value} -> {to.value}"):
        check_transition(frm, to)


def test_sending_cancel_is_not_cancelled() -> None:
    # The cancel call moves to `cancelling`; only the provider's word makes it `cancelled`.
    assert State.CANCELLING in TRANSITIONS[State.CANCEL_REQUESTED]
    assert State.CANCELLED in TRANSITIONS[State.CANCELLING]


@given(state=st.sampled_from(list(State)), is_open=st.booleans())
def test_done_and_awaiting_a_decision_never_hold_together(state: State, is_open: bool) -> None:
    done, waiting = is_done(state, is_open), awaits_decision(state, is_open)
    assert not (done and waiting)
    assert done <= (state in END_STATES)  # done only in an end state
    # An end state is done unless the open escalation's decision may still reopen it.
    assert done is (state in END_STATES and not (is_open and state in REOPENABLE))
