"""One status read of an operation, decided as values (``core.poll.plan_read``, ``decide_read``).

``plan_read`` is the one plan the claim's ``prepare`` and the poll step both follow;
``decide_read`` is the decision the step only writes: the job id check, the last look
after a cancel window or an outage of ours, and the cancel window as the window that
runs out in a cancellation watch.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from reconciler.core.lapses import Lapse, held_back, recovery_stop
from reconciler.core.poll import (
    LastLook,
    NoJobId,
    NoRead,
    Read,
    before_request,
    before_send,
    decide,
    decide_read,
    may_stretch,
    plan_read,
)
from reconciler.core.poll_values import (
    Collect,
    Finish,
    Observation,
    PollPolicy,
    Stop,
    Wait,
    record_of,
)
from reconciler.core.records import OperationRecord
from reconciler.core.states import State
from reconciler.core.vocabulary import EscalationReason, RemoteCategory, TransportError
from tests.support.factories import new_operation

R = EscalationReason
NOW = datetime(2025, 4, 18, 10, 20, tzinfo=UTC)
POLICY = PollPolicy(trusted_max_delay_seconds=600.0, final_look_seconds=30.0)
WATCHED = (State.OBSERVING, State.CANCELLING)


def op_in(state: State = State.OBSERVING, **fields: Any) -> OperationRecord:
    values: dict[str, Any] = {
        "state": state.value,
        "remote_job_id": "job_1",
        "created_at": NOW - timedelta(minutes=10),
        "accepted_at": NOW - timedelta(minutes=10),
        "create_deadline_at": NOW - timedelta(minutes=9),
        "deadline_at": NOW + timedelta(minutes=30),
        "status_requests_used": 3,
    }
    return new_operation(NOW, **{**values, **fields})


def answer(**fields: Any) -> Observation:
    values: dict[str, Any] = {
        "at": NOW,
        "http_status": 200,
        "category": RemoteCategory.PENDING,
        "remote_state": "running",
    }
    return Observation(**{**values, **fields})


def seconds(n: int) -> datetime:
    return NOW + timedelta(seconds=n)


ops = st.builds(
    lambda state, deadline, close, used, budget, job, retry: op_in(
        state,
        deadline_at=seconds(deadline),
        cancel_deadline_at=None if close is None else seconds(close),
        status_requests_used=used,
        max_status_requests=budget,
        remote_job_id=job,
        retry_not_before=None if retry is None else seconds(retry),
    ),
    state=st.sampled_from(WATCHED),
    deadline=st.integers(-60, 60),
    close=st.one_of(st.none(), st.integers(-60, 60)),
    used=st.integers(0, 6),
    budget=st.integers(1, 6),
    job=st.sampled_from([None, "", "job_1"]),
    retry=st.one_of(st.none(), st.integers(-60, 60)),
)
answers = st.builds(
    answer,
    http_status=st.sampled_from([200, 200, 200, 404, 429, 500, 503]),
    category=st.sampled_from(list(RemoteCategory)),
    required_fields_ok=st.booleans(),
    job_id_matches=st.sampled_from([None, True, False]),
    job_id=st.sampled_from([None, "job_2"]),
)


# --- the plan -----------------------------------------------------------------------------


@given(op=ops)
def test_the_claim_prepares_exactly_the_ordinary_read_the_step_would_send(
    op: OperationRecord,
) -> None:
    """The guard ``prepare`` had on its own, now read off the plan the step follows."""
    closed = (
        op.state == State.CANCELLING.value
        and op.cancel_deadline_at is not None
        and op.cancel_deadline_at <= NOW
    )
    ordinary = (
        not closed and op.remote_job_id is not None and before_request(record_of(op), NOW) is None
    )
    assert (plan_read(op, NOW) == Read()) is ordinary


@given(op=ops)
def test_a_plan_never_sends_without_a_job_or_past_what_it_may(op: OperationRecord) -> None:
    plan = plan_read(op, NOW)
    if isinstance(plan, Read):
        assert op.remote_job_id is not None
        if plan.last_look:
            assert op.remote_job_id
            # After the cancel window: one look, budget permitting, not while the
            # provider's Retry-After still runs.
            assert op.state == State.CANCELLING.value
            assert op.status_requests_used < op.max_status_requests
            assert op.retry_not_before is None or op.retry_not_before <= NOW
        else:
            assert before_request(record_of(op), NOW) is None
    elif isinstance(plan, NoRead):
        if op.state == State.CANCELLING.value:
            # In a cancellation watch the window that runs out is the cancel window.
            assert plan.stop.reason is not R.DEADLINE_EXCEEDED
            assert not plan.recoverable
        assert plan.recoverable is (plan.stop.reason is R.DEADLINE_EXCEEDED)
        assert plan.cancel_window is (
            op.cancel_deadline_at is not None
            and op.state == State.CANCELLING.value
            and op.cancel_deadline_at <= NOW
        )
    else:
        assert isinstance(plan, NoJobId)
        assert op.remote_job_id is None


def test_a_closed_cancel_window_gets_one_look_unless_held_back() -> None:
    closing = {"cancel_deadline_at": seconds(-1), "deadline_at": seconds(-600)}
    cancelling = op_in(State.CANCELLING, **closing)
    assert plan_read(cancelling, NOW) == Read(last_look=True)
    held = op_in(State.CANCELLING, retry_not_before=seconds(30), **closing)
    plan = plan_read(held, NOW)
    assert isinstance(plan, NoRead) and plan.cancel_window
    assert plan.stop.reason is R.CANCELLATION_UNCONFIRMED
    assert plan.stop.detail.endswith(
        "; the provider's Retry-After allows no status request before 2025-04-18T10:20:30Z"
    )
    spent = op_in(State.CANCELLING, status_requests_used=12, **closing)
    assert isinstance(plan_read(spent, NOW), NoRead)


# --- just before transmission --------------------------------------------------------------


@given(state=st.sampled_from(WATCHED), offset=st.integers(-5, 5), look=st.booleans())
def test_a_read_is_withheld_past_the_deadline_unless_it_is_a_last_look(
    state: State, offset: int, look: bool
) -> None:
    op = op_in(state, deadline_at=seconds(offset), cancel_deadline_at=seconds(offset))
    stop = before_send(op, NOW, LastLook() if look else None)
    assert (stop is None) is (look or seconds(offset) > NOW)
    if stop is not None:
        assert "reached before the status request was sent" in stop.detail
        expected = R.CANCELLATION_UNCONFIRMED if state is State.CANCELLING else R.DEADLINE_EXCEEDED
        assert stop.reason is expected


# --- the answer ----------------------------------------------------------------------------


@given(op=ops, obs=answers, trusted=st.booleans())
def test_an_ordinary_answer_is_the_records_decision_with_the_watchs_reason(
    op: OperationRecord, obs: Observation, trusted: bool
) -> None:
    charged = op_in(
        State(op.state),
        deadline_at=op.deadline_at,
        cancel_deadline_at=op.cancel_deadline_at,
        status_requests_used=min(op.status_requests_used + 1, 12),
    )
    got = decide_read(charged, obs, NOW, random.Random(3), POLICY, trusted=trusted)
    if obs.job_id_matches is False:
        assert got == Stop(
            R.CONTRADICTORY_STATUS, f"status answer names job {obs.job_id}, not job_1"
        )
        return
    plain = decide(
        record_of(charged),
        obs,
        NOW,
        random.Random(3),
        POLICY,
        trusted=trusted and obs.category is RemoteCategory.PENDING,
    )
    cancelling = charged.state == State.CANCELLING.value
    if isinstance(plain, Stop) and cancelling and plain.reason is R.DEADLINE_EXCEEDED:
        plain = Stop(R.CANCELLATION_UNCONFIRMED, plain.detail, plain.counters)
    assert got == plain


@given(obs=answers, lapse=st.booleans(), state=st.sampled_from(WATCHED))
def test_a_last_look_settles_only_on_an_end_state(
    obs: Observation, lapse: bool, state: State
) -> None:
    """Past the window, a pending answer never waits: it escalates, naming what it saw."""
    op = op_in(state, deadline_at=seconds(-60), cancel_deadline_at=seconds(-1))
    outage = Lapse(seconds(-300), seconds(-10), inferred=True)
    look = LastLook(outage if lapse else None)
    got = decide_read(op, obs, NOW, random.Random(1), POLICY, look=look, trusted=True)
    assert not isinstance(got, Wait)
    if isinstance(got, Stop) and obs.job_id_matches is not False and "still said" in got.detail:
        assert got.counters is not None, "the counters of the answer are kept"
        if lapse:
            assert "during this service's own storage outage" in got.detail
        else:
            assert got.reason is R.CANCELLATION_UNCONFIRMED
    if obs.job_id_matches is not False and obs.http_status == 200:
        if obs.category in (RemoteCategory.FAILURE, RemoteCategory.CANCELLED):
            assert isinstance(got, Finish)
        if obs.category is RemoteCategory.SUCCESS and obs.required_fields_ok:
            assert isinstance(got, Collect)


def test_the_last_looks_stops_say_what_the_answer_said() -> None:
    op = op_in(State.CANCELLING, deadline_at=seconds(-60), cancel_deadline_at=seconds(-1))
    rng = random.Random(1)
    unconfirmed = decide_read(op, answer(), NOW, rng, POLICY, look=LastLook())
    assert unconfirmed == Stop(
        R.CANCELLATION_UNCONFIRMED,
        "no cancelled state by 2025-04-18T10:19:59Z; a last status read after the window "
        "still said running",
        unconfirmed.counters,
    )
    observing = op_in(deadline_at=seconds(-60))
    outage = Lapse(seconds(-300), seconds(-10))
    failed = answer(http_status=500, category=None, remote_state=None)
    timed_out = decide_read(observing, failed, NOW, rng, POLICY, look=LastLook(outage))
    assert isinstance(timed_out, Stop) and timed_out.reason is R.DEADLINE_EXCEEDED
    assert timed_out.detail.endswith("a status read after recovery still said 'HTTP 500'")
    silent = answer(
        http_status=None, transport_error=TransportError.TIMEOUT, category=None, remote_state=None
    )
    timed_out = decide_read(observing, silent, NOW, rng, POLICY, look=LastLook(outage))
    assert isinstance(timed_out, Stop)
    assert timed_out.detail.endswith("still said 'no answer'")


@given(obs=answers, look=st.sampled_from([None, LastLook()]))
def test_trust_stretches_only_an_ordinary_pending_answer(
    obs: Observation, look: LastLook | None
) -> None:
    op = op_in(State.OBSERVING, deadline_at=seconds(3600))
    if may_stretch(obs, look):
        assert obs.category is RemoteCategory.PENDING and look is None
        return
    trusted = decide_read(op, obs, NOW, random.Random(5), POLICY, look=look, trusted=True)
    untrusted = decide_read(op, obs, NOW, random.Random(5), POLICY, look=look, trusted=False)
    assert trusted == untrusted


# --- the recovery look ---------------------------------------------------------------------


@given(
    retry=st.one_of(st.none(), st.integers(-30, 30)),
    job=st.sampled_from([None, "job_1"]),
    looked=st.booleans(),
)
def test_one_recovery_look_ever_and_never_inside_a_retry_after(
    retry: int | None, job: str | None, looked: bool
) -> None:
    op = op_in(
        deadline_at=seconds(-60),
        remote_job_id=job,
        retry_not_before=None if retry is None else seconds(retry),
    )
    outage = Lapse(seconds(-300), seconds(-10))
    stop = recovery_stop(op, outage, NOW, looked_before=looked)
    held = held_back(op.retry_not_before, NOW)
    assert (stop is None) is (held is None and job is not None and not looked)
    if stop is not None:
        assert stop.reason is R.DEADLINE_EXCEEDED
        assert "no status read after recovery could settle it" in stop.detail
        assert stop.detail.endswith(held or "settle it")
