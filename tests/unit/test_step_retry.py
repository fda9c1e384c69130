"""The bounded retry of a step that failed in a way nothing foresaw, as pure values.

``core.step_retry`` decides (retry after a capped, jittered, doubling delay, or give up
and escalate ``internal_error``); ``core.escalation`` offers the options; and
``core.operator_decision`` plans the ``retry`` an operator chooses.
"""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reconciler.core.errors import DecisionNotAllowed
from reconciler.core.escalation import (
    UNKNOWN_PROVIDER,
    facts_for,
    job_may_run,
    options_for,
    render_message,
    resume_state,
)
from reconciler.core.operator_decision import DecisionRequest, plan_decision
from reconciler.core.records import EscalationRecord, OperationRecord
from reconciler.core.states import END_STATES, State, allowed
from reconciler.core.step_retry import (
    GiveUp,
    RetryStep,
    StepRetryPolicy,
    decide,
    escalation_detail,
    exception_name,
    failures_so_far,
    step_of,
)
from reconciler.core.vocabulary import DecisionAction, EscalationReason, StepName
from tests.support.factories import new_operation

NOW = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
policies = st.builds(
    StepRetryPolicy,
    base_seconds=st.floats(0.01, 30),
    max_seconds=st.floats(0.01, 3600),
    jitter_floor=st.floats(0.1, 1),
    max_attempts=st.integers(1, 12),
)


@given(policies, st.integers(-3, 40), st.integers(0, 2**32))
def test_a_failure_retries_later_within_the_cap_or_gives_up(
    policy: StepRetryPolicy, failures: int, seed: int
) -> None:
    decision = decide(policy, failures, random.Random(seed))
    attempt = max(1, failures)
    if attempt >= policy.max_attempts:
        assert decision == GiveUp(attempt)
        return
    assert isinstance(decision, RetryStep) and decision.attempt == attempt
    raw = min(policy.max_seconds, policy.base_seconds * 2 ** (attempt - 1))
    # Never at once, never past the cap, never below the jitter floor.
    assert decision.delay_seconds > 0
    assert policy.jitter_floor * raw - 1e-9 <= decision.delay_seconds <= raw + 1e-9


@given(st.integers(0, 2**32))
def test_the_default_starts_about_a_second_doubles_and_gives_up_at_the_fifth(seed: int) -> None:
    policy, rng = StepRetryPolicy(), random.Random(seed)
    delays = []
    for failures in range(1, 5):
        decision = decide(policy, failures, rng)
        assert isinstance(decision, RetryStep)
        delays.append(decision.delay_seconds)
    assert 0.5 <= delays[0] <= 1.0
    assert [2**i * 0.5 <= d <= 2**i for i, d in enumerate(delays)] == [True] * 4
    assert decide(policy, 5, rng) == GiveUp(5)


def test_the_same_seed_decides_the_same_delay() -> None:
    policy = StepRetryPolicy()
    assert decide(policy, 2, random.Random(3)) == decide(policy, 2, random.Random(3))


@given(st.sampled_from(StepName), st.sampled_from([*StepName, None]), st.integers(0, 99))
def test_only_a_count_kept_for_the_same_step_carries_over(
    step: StepName, kept_for: StepName | None, count: int
) -> None:
    found = failures_so_far(kept_for.value if kept_for else None, count, step)
    assert found == (count if kept_for is step else 0)


def test_each_state_names_the_step_a_worker_runs_in_it() -> None:
    assert step_of(State.CREATE_UNKNOWN) is StepName.CREATE
    assert step_of(State.CANCELLING) is StepName.STATUS_READ
    assert step_of(State.CANCEL_REQUESTED) is StepName.CANCEL
    assert step_of(State.RESULT_COLLECTING) is StepName.COLLECT
    assert all(step_of(s) is StepName.COMPLETE for s in END_STATES)


def test_an_exception_is_named_by_its_type_never_its_message() -> None:
    secret = "https://user:hunter2@example.com/x?sig=abc"
    assert exception_name(ValueError(secret)) == "ValueError"
    assert exception_name(DecisionNotAllowed(secret)) == "reconciler.core.errors.DecisionNotAllowed"
    text = escalation_detail(StepName.COLLECT, 5, exception_name(ValueError(secret)))
    assert "result collection" in text and "5 times" in text and "ValueError" in text
    assert "hunter2" not in text


def _op(state: State, **fields: object) -> OperationRecord:
    values: dict[str, object] = {
        "state": state.value,
        "remote_job_id": "job_1",
        "create_deadline_at": NOW,
        "deadline_at": NOW + timedelta(hours=1),
        "escalation_id": 7,
        "step_failures": 5,
        "failed_step": StepName.COLLECT.value,
    }
    return new_operation(NOW, **{**values, **fields})


def _escalation(op, can_cancel: bool = True) -> EscalationRecord:  # type: ignore[no-untyped-def]
    reason = EscalationReason.INTERNAL_ERROR
    facts = facts_for(op, UNKNOWN_PROVIDER.backoff, reason, "it failed", NOW)
    options = options_for(
        reason,
        provider_can_cancel=can_cancel,
        job_id_known=op.remote_job_id is not None,
        job_may_run=job_may_run(State(op.state)),
    )
    return EscalationRecord(
        id=7,
        operation_id=op.id,
        reason=reason.value,
        message=render_message(facts, options),
        options=[{"action": a.value} for a in options],
        resume_state=resume_state(op, reason).value,
        created_at=NOW,
        decided_at=None,
        decided_by=None,
        decision=None,
    )


@pytest.mark.parametrize(
    ("state", "offered"),
    [
        (State.OBSERVING, ["retry", "cancel", "abandon"]),
        (State.CANCEL_REQUESTED, ["retry", "cancel", "abandon"]),
        # The provider reported the end: nothing to cancel.
        (State.RESULT_COLLECTING, ["retry", "abandon"]),
        (State.SUCCEEDED, ["retry", "abandon"]),
    ],
)
def test_internal_error_offers_retry_abandon_and_cancel_while_the_job_may_run(
    state: State, offered: list[str]
) -> None:
    esc = _escalation(_op(state))
    assert [o["action"] for o in esc.options] == offered
    assert "retry the step that failed" in esc.message
    no_cancel = _escalation(_op(state), can_cancel=False)
    assert "cancel" not in [o["action"] for o in no_cancel.options]


@pytest.mark.parametrize(
    "failed_in",
    [State.OBSERVING, State.CANCELLING, State.CANCEL_REQUESTED, State.RESULT_COLLECTING],
)
def test_retry_returns_to_the_state_whose_step_failed_with_a_fresh_count(
    failed_in: State,
) -> None:
    esc = _escalation(_op(failed_in))
    escalated = _op(State.ESCALATED)
    plan = plan_decision(escalated, esc, DecisionRequest(DecisionAction.RETRY), "ops", NOW, 60)
    assert plan.target is failed_in and allowed(State.ESCALATED, failed_in)
    assert plan.changes["step_failures"] == 0 and plan.changes["failed_step"] is None
    assert plan.changes["next_poll_at"] == NOW
    # Not an extension: the deadline and the budgets stay as they were.
    assert not {"deadline_at", "max_status_requests"} & set(plan.changes)


def test_retry_before_the_job_id_is_known_reconciles_the_create() -> None:
    op = _op(State.CREATE_PENDING, remote_job_id=None)
    plan = plan_decision(
        _op(State.ESCALATED, remote_job_id=None),
        _escalation(op),
        DecisionRequest(DecisionAction.RETRY),
        "ops",
        NOW,
        60,
    )
    assert plan.target is State.CREATE_UNKNOWN


def test_retry_of_a_completion_runs_it_again_and_abandon_stops_it() -> None:
    done = _op(State.SUCCEEDED, completion_pending=True, next_poll_at=None)
    esc = _escalation(done)
    retry = plan_decision(done, esc, DecisionRequest(DecisionAction.RETRY), "ops", NOW, 60)
    assert retry.target is None
    assert retry.changes["completion_pending"] is True and retry.changes["next_poll_at"] == NOW
    abandon = plan_decision(done, esc, DecisionRequest(DecisionAction.ABANDON), "ops", NOW, 60)
    assert abandon.target is None
    assert abandon.changes == {"completion_pending": False, "next_poll_at": None}


def test_retry_is_refused_where_it_was_not_offered() -> None:
    op = _op(State.ESCALATED)
    esc = _escalation(_op(State.OBSERVING))
    other = replace(esc, reason="unknown_state", options=[{"action": "extend"}])
    with pytest.raises(DecisionNotAllowed, match="'retry' was not offered"):
        plan_decision(op, other, DecisionRequest(DecisionAction.RETRY), "ops", NOW, 60)
