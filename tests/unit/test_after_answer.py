"""The read after a pending answer as the row is written, and the cancel's own schedule.

``core.next_read.after_answer`` is the scheduling half of writing a status answer: the
row may have moved while we asked (a hint, a cancel), and a cancellation reads by its
window's close. ``core.cancel`` sets the read that may confirm a cancel.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from reconciler.core.cancel import (
    ALREADY_SENT,
    NO_CANCEL_ACTION,
    answer_floor,
    first_read,
    send_or_watch,
)
from reconciler.core.next_read import after_answer, hinted_wait, retry_floor
from reconciler.core.poll_values import Counters, Observation, PollPolicy, Wait
from reconciler.core.records import OperationRecord
from reconciler.core.states import State
from reconciler.core.vocabulary import DelaySource
from tests.support.factories import new_operation

NOW = datetime(2025, 4, 18, 10, 20, tzinfo=UTC)
POLICY = PollPolicy()
SENT = NOW - timedelta(seconds=2)  # when the status request went out
COUNTERS = Counters(0, 0, 1, False)
SOURCES = [
    DelaySource.LOCAL_BACKOFF,
    DelaySource.PROVIDER_POLL_HINT,
    DelaySource.PROVIDER_RETRY_AFTER,
    DelaySource.WEBHOOK_TRUST,
]


def seconds(n: float) -> datetime:
    return NOW + timedelta(seconds=n)


def op_in(state: State, **fields: Any) -> OperationRecord:
    values: dict[str, Any] = {
        "state": state.value,
        "remote_job_id": "job_1",
        "created_at": NOW - timedelta(minutes=10),
        "create_deadline_at": NOW - timedelta(minutes=9),
        "deadline_at": NOW + timedelta(minutes=30),
    }
    return new_operation(NOW, **{**values, **fields})


@given(
    state=st.sampled_from([State.OBSERVING, State.CANCELLING, State.CANCEL_REQUESTED]),
    wait_s=st.integers(0, 600),
    source=st.sampled_from(SOURCES),
    close=st.one_of(st.none(), st.integers(-5, 300)),
    retry=st.one_of(st.none(), st.integers(0, 900)),
    hinted=st.one_of(st.none(), st.integers(-10, 0)),
    cancel_sent=st.booleans(),
)
def test_the_next_read_honours_the_row_as_it_is_now(
    state: State,
    wait_s: int,
    source: DelaySource,
    close: int | None,
    retry: int | None,
    hinted: int | None,
    cancel_sent: bool,
) -> None:
    op = op_in(
        state,
        cancel_deadline_at=None if close is None else seconds(close),
        hinted_at=None if hinted is None else seconds(hinted),
        cancel_sent_at=SENT if cancel_sent else None,
    )
    wait = Wait(seconds(wait_s), source, (), COUNTERS, hint_at=seconds(wait_s))
    obs = Observation(at=SENT, http_status=200, retry_after=None if retry is None else str(retry))
    nxt = after_answer(op, wait, obs, NOW, POLICY)
    floor = retry_floor(obs.retry_after, NOW)
    assert nxt.at >= NOW
    # Trust may be withdrawn: a stretched wait keeps the provider hint's moment, no other.
    assert (nxt.hint_not_before is not None) is (nxt.source is DelaySource.WEBHOOK_TRUST)
    hinted_since = op.hinted_at is not None and op.hinted_at > SENT
    if hinted_since:
        # A hint that came while we asked is looked at now, or once the Retry-After ends;
        # a read set earlier still (at a deadline, which stops without a request) stays.
        if floor is None or floor <= NOW:
            assert (nxt.at, nxt.source) == (NOW, DelaySource.WEBHOOK_HINT)
        else:
            assert nxt.at <= floor
            assert nxt.source is not DelaySource.WEBHOOK_HINT
    elif state is State.CANCEL_REQUESTED and not cancel_sent:
        assert nxt.at == NOW  # a cancel arrived while we asked: it is sent now
    elif state is State.CANCELLING and op.cancel_deadline_at is not None:
        bound = timedelta(seconds=max(POLICY.backoff.max_seconds, POLICY.rate_limit_delay_seconds))
        # By the window's close, or a Retry-After just past it; never further off. A window
        # that closed before now is looked at now.
        close_at = op.cancel_deadline_at
        if nxt.at > max(close_at, NOW):
            assert nxt.source is DelaySource.PROVIDER_RETRY_AFTER
            assert floor is not None and nxt.at == floor <= close_at + bound
        else:
            assert (nxt.at, nxt.source) == (max(NOW, min(wait.at, close_at)), wait.source)
    else:
        assert (nxt.at, nxt.source) == (wait.at, wait.source)


def test_a_hint_during_the_read_means_now_unless_a_retry_after_runs() -> None:
    later = seconds(30)
    assert hinted_wait(later, DelaySource.LOCAL_BACKOFF, None, NOW) == (
        NOW,
        DelaySource.WEBHOOK_HINT,
    )
    assert hinted_wait(later, DelaySource.LOCAL_BACKOFF, seconds(5), NOW) == (
        seconds(5),
        DelaySource.PROVIDER_RETRY_AFTER,
    )
    assert hinted_wait(seconds(3), DelaySource.PROVIDER_RETRY_AFTER, seconds(5), NOW) == (
        seconds(3),
        DelaySource.PROVIDER_RETRY_AFTER,
    )


# --- the cancel -----------------------------------------------------------------------------


def test_the_cancel_is_sent_once_to_a_job_a_provider_can_cancel() -> None:
    requested = op_in(State.CANCEL_REQUESTED)
    assert send_or_watch(requested, can_cancel=True) is None
    assert send_or_watch(requested, can_cancel=False) == NO_CANCEL_ACTION
    assert send_or_watch(op_in(State.CANCEL_REQUESTED, remote_job_id=None), True) == (
        NO_CANCEL_ACTION
    )
    sent = op_in(State.CANCEL_REQUESTED, cancel_sent_at=SENT)
    assert send_or_watch(sent, can_cancel=True) == ALREADY_SENT


@given(base=st.floats(0.1, 60), retry=st.one_of(st.none(), st.integers(-30, 120)))
def test_the_read_that_confirms_a_cancel_waits_for_the_last_retry_after(
    base: float, retry: int | None
) -> None:
    not_before = None if retry is None else seconds(retry)
    at, source = first_read(NOW, base, not_before)
    assert at >= NOW + timedelta(seconds=base)
    if not_before is not None:
        assert at >= not_before
    expected = (
        DelaySource.PROVIDER_RETRY_AFTER
        if not_before is not None and not_before > NOW + timedelta(seconds=base)
        else DelaySource.LOCAL_BACKOFF
    )
    assert source is expected


@given(read_in=st.integers(0, 120), asked=st.one_of(st.none(), st.integers(0, 240)))
def test_a_cancel_answers_retry_after_holds_the_confirming_read_back(
    read_in: int, asked: int | None
) -> None:
    floor = answer_floor(seconds(read_in), NOW, None if asked is None else str(asked))
    if asked is None or asked <= read_in:
        assert floor is None
    else:
        assert floor == seconds(asked)
