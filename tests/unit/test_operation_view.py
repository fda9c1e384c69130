"""The Operation as agents read it: one message per state, ``done`` only at the end."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest

from reconciler.core.clock import utc
from reconciler.core.operation_view import message_for, operation_view
from reconciler.core.records import EscalationRecord, OperationRecord
from reconciler.core.states import END_STATES, State
from reconciler.wire import Operation as OperationView
from tests.support.factories import new_operation

NOW = utc(datetime(2025, 3, 8, 14, 22, 11))
# The key set is the wire model's: stated there once.
VIEW_KEYS = frozenset(OperationView.model_fields)
NOT_END = sorted(set(State) - END_STATES, key=lambda s: s.value)


def op_in(state: State, **overrides: Any) -> OperationRecord:
    return new_operation(NOW, state=state.value, **overrides)


def test_every_state_has_its_own_message() -> None:
    messages = {state: message_for(op_in(state)) for state in State}
    assert all(messages.values())
    assert len(set(messages.values())) >= len(END_STATES)
    # Success, partial success, failure, cancellation, timeout...: each end reads differently.
    end_messages = [messages[s] for s in END_STATES]
    assert len(set(end_messages)) == len(END_STATES)


@pytest.mark.parametrize("state", NOT_END, ids=lambda s: s.value)
def test_a_state_before_the_end_says_not_complete_and_how_to_wait(state: State) -> None:
    op = op_in(state)
    message = message_for(op)
    assert "NOT complete" in message
    assert f"GET /v1/operations/{op.id}/wait" in message
    assert "{id}" not in message
    assert "SUCCEEDED" not in message


@pytest.mark.parametrize("state", sorted(END_STATES - {State.SUCCEEDED}, key=lambda s: s.value))
def test_no_other_end_state_reads_as_success(state: State) -> None:
    message = message_for(op_in(state))
    assert "SUCCEEDED" not in message
    assert "Wait with" not in message


def test_end_state_messages_name_what_happened() -> None:
    def text(state: State) -> str:
        return message_for(op_in(state))

    assert "SUCCEEDED" in text(State.SUCCEEDED) and "verified" in text(State.SUCCEEDED)
    assert "FINISHED WITH ERRORS" in text(State.COMPLETED_WITH_ERRORS)
    assert "do not report full success" in text(State.COMPLETED_WITH_ERRORS)
    assert "FAILED" in text(State.FAILED) and "`error`" in text(State.FAILED)
    assert "CANCELLED, confirmed by the provider" in text(State.CANCELLED)
    assert "NOT success" in text(State.RESULT_TIMED_OUT)
    assert "may still be running" in text(State.RESULT_TIMED_OUT)
    assert "could NOT be fetched" in text(State.RESULT_UNAVAILABLE)
    assert "FAILED validation" in text(State.RESULT_VALIDATION_FAILED)
    assert "never confirmed" in text(State.CANCELLATION_UNCONFIRMED)
    assert "NOT a confirmed cancellation" in text(State.CANCELLATION_UNCONFIRMED)


def test_cancel_intent_is_not_cancellation() -> None:
    for state in (State.CANCEL_REQUESTED, State.CANCELLING):
        message = message_for(op_in(state))
        assert "NOT confirmed" in message
        assert "may still finish" in message
        assert "Do not report success or cancellation" in message


def test_create_unknown_tells_the_agent_not_to_resubmit() -> None:
    message = message_for(op_in(State.CREATE_UNKNOWN))
    assert "do not resubmit" in message
    assert "same idempotency key" in message


@pytest.mark.parametrize("state", list(State), ids=lambda s: s.value)
def test_done_is_a_boolean_true_only_in_end_states(state: State) -> None:
    op = op_in(state, next_poll_at=NOW)
    view = operation_view(op, NOW)
    assert view["done"] is (state in END_STATES)
    assert view["state"] == state.value
    assert view["message"] == message_for(op)


def test_escalated_is_not_done_and_carries_the_escalation() -> None:
    escalation = EscalationRecord(
        id=4,
        operation_id="op_x",
        reason="deadline_exceeded",
        message="Operation op_x: waiting stopped.",
        options=["extend", "cancel", "abandon"],
        resume_state=None,
        created_at=NOW,
        decided_at=None,
        decided_by=None,
        decision=None,
    )
    view = operation_view(op_in(State.ESCALATED, escalation_id=4), NOW, escalation)
    assert view["done"] is False
    assert view["escalation"] == {
        "reason": "deadline_exceeded",
        "message": "Operation op_x: waiting stopped.",
        "options": ["extend", "cancel", "abandon"],
        "created_at": "2025-03-08T14:22:11Z",
        "decided": False,
        "decision": None,
    }
    assert operation_view(op_in(State.OBSERVING), NOW)["escalation"] is None


def test_the_view_has_the_spec_shape() -> None:
    op = op_in(
        State.OBSERVING,
        remote_job_id="job_7ad2",
        remote_state="running",
        progress={"completed": 146, "total": 500},
        status_requests_used=3,
        max_status_requests=12,
        next_poll_at=NOW + timedelta(seconds=30),
    )
    view = operation_view(op, NOW)
    assert set(view) >= VIEW_KEYS
    assert view["id"] == op.id
    assert view["provider"] == "sim"
    assert view["remote_job_id"] == "job_7ad2"
    assert view["remote_state"] == "running"
    assert view["progress"] == {
        "completed": 146,
        "total": 500,
        "detail": {"completed": 146, "total": 500},
    }
    assert view["budget"] == {"status_requests_used": 3, "max_status_requests": 12}
    assert view["deadline_at"] == "2025-03-08T15:02:11Z"
    assert view["poll_after_seconds"] == 30
    assert view["result"] is None and view["error"] is None and view["escalation"] is None


@pytest.mark.parametrize(
    ("next_poll_in", "expected"),
    [
        (None, 30.0),  # nothing scheduled: a sensible default
        (10.0, 10.0),
        (2.4, 2.0),  # whole seconds
        (0.2, 1.0),  # never below one second
        (-50.0, 1.0),  # overdue: ask again soon, not "negative"
        (3600.0, 300.0),  # capped at five minutes
    ],
)
def test_poll_after_seconds(next_poll_in: float | None, expected: float) -> None:
    next_poll_at = None if next_poll_in is None else NOW + timedelta(seconds=next_poll_in)
    view = operation_view(op_in(State.OBSERVING, next_poll_at=next_poll_at), NOW)
    assert view["poll_after_seconds"] == expected


@pytest.mark.parametrize("state", sorted(END_STATES, key=lambda s: s.value), ids=lambda s: s.value)
def test_no_poll_after_once_done(state: State) -> None:
    view = operation_view(op_in(state, next_poll_at=NOW + timedelta(seconds=5)), NOW)
    assert view["poll_after_seconds"] is None


# --- a decision pending: not done, and the message says who decides ------------------------

OPTIONS = [
    {
        "action": "extend",
        "description": "extend waiting once by 15 minutes with 4 additional checks",
        "extra_seconds": 900.0,
        "extra_status_requests": 4,
    },
    {"action": "cancel", "description": "cancel at provider (stops future work)"},
    {
        "action": "abandon",
        "description": "abandon (stop waiting; the operation ends as result_timed_out)",
    },
]


def _escalation(
    reason: str, decided: bool, decision: dict[str, Any] | None = None
) -> EscalationRecord:
    return EscalationRecord(
        id=7,
        operation_id="op_x",
        reason=reason,
        message="External job needs a decision",
        options=OPTIONS,
        resume_state=None,
        created_at=NOW,
        decided_at=NOW if decided else None,
        decided_by="operator:ops" if decided else None,
        decision=(decision or {"action": "abandon"}) if decided else None,
    )


REOPENABLE_ENDS = [
    (State.RESULT_TIMED_OUT, "deadline_exceeded"),
    (State.CANCELLATION_UNCONFIRMED, "cancellation_unconfirmed"),
]


@pytest.mark.parametrize(("state", "reason"), REOPENABLE_ENDS, ids=lambda v: str(v))
def test_an_end_a_decision_may_reopen_is_not_done_until_it_is_made(
    state: State, reason: str
) -> None:
    op = op_in(state, escalation_id=7, escalation_open=True, done_at=NOW)
    view = operation_view(op, NOW, _escalation(reason, decided=False))
    assert view["done"] is False and view["awaiting_decision"] is True
    message = view["message"]
    assert "NOT done" in message and "SUCCEEDED" not in message
    # Written to the agent: a person decides, it cannot, it tells its user, the wait returns.
    assert "A person, an operator of this service, must decide what happens next" in message
    assert "you cannot decide it" in message and "Tell your user" in message
    assert "extend waiting once by 15 minutes" in message and "abandon (stop waiting" in message
    assert f"GET /v1/operations/{op.id}/wait returns as soon as the decision is made" in message
    assert view["poll_after_seconds"] == 60.0
    assert view["done_at"] is None  # nothing reads as final while a person decides
    # The decision is recorded: nothing more will happen, and the view says so.
    decided = replace(op, escalation_open=False)
    after = operation_view(decided, NOW, _escalation(reason, decided=True))
    assert after["done"] is True and after["awaiting_decision"] is False
    assert after["message"].startswith(
        "An operator decided to stop waiting for the job (abandon): the service no longer "
        "watches it. "
    )
    assert "for good" in after["message"] and "NOT" in after["message"]
    assert "decision is made" not in after["message"]
    assert after["poll_after_seconds"] is None
    assert after["done_at"] == "2025-03-08T14:22:11Z"


@pytest.mark.parametrize(
    ("reason", "decision", "state", "opening"),
    [
        (
            "deadline_exceeded",
            {"action": "extend", "extra_seconds": 900.0, "extra_status_requests": 4},
            State.OBSERVING,
            "An operator decided to extend the waiting by 15 minutes with 4 more status "
            "requests: the service watches the job again. The job has STARTED",
        ),
        (
            "deadline_exceeded",
            {"action": "cancel"},
            State.CANCEL_REQUESTED,
            "An operator decided to cancel the job: the service asks the provider to cancel "
            "it. Cancellation was requested",
        ),
        (
            "create_unknown",
            {"action": "resend", "create_attempts": 2},
            State.CREATE_UNKNOWN,
            "An operator decided to send the job's create call again",
        ),
        (
            "callback_undeliverable",
            {"action": "extend", "extra_seconds": 900.0, "extra_status_requests": 4},
            State.SUCCEEDED,
            "An operator decided to deliver the callback again; the job's outcome stands. "
            "The job SUCCEEDED",
        ),
    ],
)
def test_after_a_decision_the_message_says_what_was_decided_and_what_now(
    reason: str, decision: dict[str, Any], state: State, opening: str
) -> None:
    op = op_in(state, escalation_id=7, escalation_open=False)
    view = operation_view(op, NOW, _escalation(reason, decided=True, decision=decision))
    assert view["message"].startswith(opening), view["message"]


def test_an_escalated_operation_says_who_decides_and_how_to_learn_the_outcome() -> None:
    op = op_in(State.ESCALATED, escalation_id=7, escalation_open=True)
    view = operation_view(op, NOW, _escalation("unknown_state", decided=False))
    assert view["done"] is False and view["awaiting_decision"] is True
    assert "(reason: unknown_state)" in view["message"]
    assert "returns as soon as the decision is made" in view["message"]


def test_an_undeliverable_callback_leaves_the_outcome_done() -> None:
    op = op_in(State.SUCCEEDED, escalation_id=7, escalation_open=True)
    view = operation_view(op, NOW, _escalation("callback_undeliverable", decided=False))
    assert view["done"] is True and view["awaiting_decision"] is False
    assert view["message"].startswith("The job SUCCEEDED")


# --- a refused create: its own outcome ---------------------------------------------------


def test_a_refused_request_says_nothing_ran_and_to_fix_it_with_a_new_key() -> None:
    stored = {
        "code": "request_rejected",
        "http_status": 422,
        "provider_message": "unknown scenario 'bogus'",
        "provider_error": {"error": {"code": "bad_request", "message": "unknown scenario 'bogus'"}},
    }
    view = operation_view(op_in(State.FAILED, error=stored, done_at=NOW), NOW)
    assert view["done"] is True
    message = view["message"]
    assert message.startswith(
        "The provider REFUSED the request (HTTP 422: unknown scenario 'bogus'), so nothing ran."
    )
    assert "Fix `request`" in message and "NEW `idempotency_key`" in message
    assert "Do not resubmit" not in message
    assert view["error"] == {
        "code": "request_rejected",
        "message": "the provider refused the request (HTTP 422): unknown scenario 'bogus'",
        "http_status": 422,
        "provider_message": "unknown scenario 'bogus'",
        "detail": {"provider_error": stored["provider_error"]},
    }


def test_refused_credentials_are_not_the_agents_to_fix() -> None:
    stored = {"code": "authorization_denied", "http_status": 401, "provider_error": None}
    message = message_for(op_in(State.FAILED, error=stored))
    assert "REFUSED this service's credentials" in message and "not your request's fault" in message


def test_a_replayed_start_says_so() -> None:
    view = operation_view(op_in(State.OBSERVING), NOW, replayed=True)
    assert view["replayed"] is True
    assert view["message"].startswith("This is the job started earlier with the same")
    assert operation_view(op_in(State.OBSERVING), NOW)["replayed"] is False
