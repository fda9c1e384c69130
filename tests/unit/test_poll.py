"""The pure poll decisions (``reconciler.core.poll``): before a request, and on each answer."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.core.backoff import BackoffPolicy, parse_retry_after
from reconciler.core.cancel import cancel_window_read
from reconciler.core.clock import isoformat
from reconciler.core.errors import InvalidObservation, ReconcilerError
from reconciler.core.next_read import first_poll_at, parse_rfc3339
from reconciler.core.poll import before_request, decide
from reconciler.core.poll_values import (
    Collect,
    Counters,
    Finish,
    Observation,
    PollPolicy,
    PollRecord,
    Stop,
    Wait,
)
from reconciler.core.vocabulary import DelaySource, EscalationReason, RemoteCategory, TransportError

R = EscalationReason
T0 = datetime(2025, 4, 18, 10, 20, tzinfo=UTC)
NOW = T0 + timedelta(minutes=5)
POLICY = PollPolicy()


def rec(**overrides: Any) -> PollRecord:
    values: dict[str, Any] = {
        "deadline_at": T0 + timedelta(minutes=40),
        "accepted_at": T0,
        "max_status_requests": 12,
        "status_requests_used": 1,
        "max_transport_failures": 3,
    }
    values.update(overrides)
    return PollRecord(**values)


def obs(**overrides: Any) -> Observation:
    values: dict[str, Any] = {
        "at": NOW,
        "http_status": 200,
        "category": RemoteCategory.PENDING,
        "remote_state": "running",
    }
    values.update(overrides)
    return Observation(**values)


def run(record: PollRecord, observation: Observation, now: datetime = NOW, seed: int = 1) -> Any:
    return decide(record, observation, now, random.Random(seed), POLICY)


def wait(decision: Any) -> Wait:
    assert isinstance(decision, Wait), decision
    return decision


def stop(decision: Any, reason: EscalationReason) -> Stop:
    assert isinstance(decision, Stop), decision
    assert decision.reason is reason
    return decision


def seconds(w: Wait, now: datetime = NOW) -> float:
    return (w.at - now).total_seconds()


# --- before_request: the ordering before a request -------------------------------------------


def test_deadline_is_checked_before_a_request() -> None:
    r = rec(deadline_at=NOW)
    assert stop(before_request(r, NOW), R.DEADLINE_EXCEEDED).counters is None
    assert before_request(r, NOW - timedelta(microseconds=1)) is None


def test_budget_is_checked_before_scheduling() -> None:
    assert before_request(rec(status_requests_used=11), NOW) is None
    s = stop(before_request(rec(status_requests_used=12), NOW), R.REQUEST_BUDGET_EXHAUSTED)
    assert "12 of 12" in s.detail


def test_deadline_wins_over_budget() -> None:
    r = rec(deadline_at=NOW, status_requests_used=12)
    stop(before_request(r, NOW), R.DEADLINE_EXCEEDED)


def test_a_late_wake_stops_without_a_request() -> None:
    # Woken a day late: no "catch-up" requests, just the stop.
    stop(before_request(rec(), T0 + timedelta(days=1)), R.DEADLINE_EXCEEDED)


def test_first_poll_uses_attempt_zero_and_never_passes_the_deadline() -> None:
    at = first_poll_at(T0, T0 + timedelta(minutes=40), random.Random(3), POLICY)
    assert 2.5 <= (at - T0).total_seconds() <= 5.0
    assert first_poll_at(T0, T0 + timedelta(seconds=1), random.Random(3), POLICY) == T0 + (
        timedelta(seconds=1)
    )


# --- outcomes from the status body ------------------------------------------------------------


def test_success_with_required_fields_collects() -> None:
    d = run(rec(), obs(category=RemoteCategory.SUCCESS, required_fields_ok=True))
    assert isinstance(d, Collect)


def test_partial_success_is_collected_too() -> None:
    d = run(rec(), obs(category=RemoteCategory.PARTIAL, required_fields_ok=True))
    assert isinstance(d, Collect)


@pytest.mark.parametrize("category", [RemoteCategory.SUCCESS, RemoteCategory.PARTIAL])
def test_success_without_required_fields_is_contradictory(category: RemoteCategory) -> None:
    d = run(rec(), obs(category=category, remote_state="succeeded", required_fields_ok=False))
    assert "required result fields" in stop(d, R.CONTRADICTORY_STATUS).detail


@pytest.mark.parametrize(
    "category", [RemoteCategory.FAILURE, RemoteCategory.CANCELLED, RemoteCategory.EXPIRED]
)
def test_terminal_failure_cancel_expiry_finish_without_escalation(
    category: RemoteCategory,
) -> None:
    d = run(rec(), obs(category=category))
    assert isinstance(d, Finish)
    assert d.category is category


def test_success_after_the_deadline_is_still_collected() -> None:
    # The answer is a fact; the deadline only stops further waiting.
    late = rec(deadline_at=NOW - timedelta(seconds=1))
    assert isinstance(
        run(late, obs(category=RemoteCategory.SUCCESS, required_fields_ok=True)), Collect
    )


def test_unknown_state_stops() -> None:
    d = run(rec(), obs(category=RemoteCategory.UNKNOWN, remote_state="needs_payment"))
    assert "'needs_payment'" in stop(d, R.UNKNOWN_STATE).detail


def test_unparsable_2xx_body_is_a_contract_violation() -> None:
    d = run(rec(), obs(category=None, remote_state=None, parse_error="invalid JSON at byte 3"))
    assert "invalid JSON at byte 3" in stop(d, R.CONTRACT_VIOLATION).detail


def test_2xx_without_a_state_is_a_contract_violation() -> None:
    d = run(rec(), obs(http_status=204, category=None, remote_state=None))
    assert "HTTP 204" in stop(d, R.CONTRACT_VIOLATION).detail


def test_an_observation_needs_a_status_or_a_transport_error() -> None:
    with pytest.raises(InvalidObservation) as caught:
        run(rec(), obs(http_status=None))
    assert isinstance(caught.value, ReconcilerError)


# --- HTTP statuses ----------------------------------------------------------------------------


@pytest.mark.parametrize("status", [401, 403])
def test_authorization_failures_stop_at_once(status: int) -> None:
    d = run(rec(), obs(http_status=status, category=None, retry_after="5"))
    s = stop(d, R.AUTHORIZATION_DENIED)
    assert str(status) in s.detail
    assert s.counters is not None and s.counters.transport_failures_used == 0


@pytest.mark.parametrize("status", [400, 302, 405, 410, 422, 451])
def test_other_unexpected_statuses_are_contract_violations(status: int) -> None:
    d = run(rec(), obs(http_status=status, category=None))
    assert f"HTTP {status}" in stop(d, R.CONTRACT_VIOLATION).detail


def test_404_within_the_grace_window_waits() -> None:
    r = rec(accepted_at=NOW - timedelta(seconds=10))
    w = wait(run(r, obs(http_status=404, category=None)))
    assert w.source is DelaySource.LOCAL_BACKOFF
    assert any("grace window" in n for n in w.notes)


def test_404_after_the_grace_window_escalates() -> None:
    r = rec(accepted_at=NOW - timedelta(seconds=30))
    d = run(r, obs(http_status=404, category=None))
    assert "job not found (HTTP 404) after the grace window" in stop(d, R.CONTRACT_VIOLATION).detail


def test_404_without_an_acceptance_time_has_no_grace() -> None:
    stop(run(rec(accepted_at=None), obs(http_status=404, category=None)), R.CONTRACT_VIOLATION)


def test_429_without_retry_after_backs_off_sharply_and_counts() -> None:
    r = rec(rate_limited_count=1, poll_attempt=2)
    w = wait(run(r, obs(http_status=429, category=None)))
    assert w.source is DelaySource.LOCAL_BACKOFF
    assert w.counters.rate_limited_count == 2
    assert w.counters.transport_failures_used == 0
    floor = max(60.0, 4 * POLICY.backoff.raw(3))
    assert floor <= seconds(w) <= floor * 1.5


def test_sharp_delay_rises_with_the_backoff() -> None:
    policy = PollPolicy(rate_limit_delay_seconds=10)
    for attempt in range(8):
        floor = max(10.0, 4 * policy.backoff.raw(attempt))
        for seed in range(20):
            assert floor <= policy.sharp_delay(attempt, random.Random(seed)) <= floor * 1.5


def test_429_with_retry_after_waits_exactly_that_long_when_it_binds() -> None:
    w = wait(run(rec(), obs(http_status=429, category=None, retry_after="90")))
    assert w.source is DelaySource.PROVIDER_RETRY_AFTER
    assert w.at == NOW + timedelta(seconds=90)


def test_the_third_consecutive_429_escalates() -> None:
    d = run(rec(rate_limited_count=2), obs(http_status=429, category=None, retry_after="5"))
    s = stop(d, R.RATE_LIMITED)
    assert s.counters is not None and s.counters.rate_limited_count == 3
    assert "3 times in a row" in s.detail


def test_any_other_answer_resets_the_429_streak() -> None:
    assert wait(run(rec(rate_limited_count=2), obs())).counters.rate_limited_count == 0


def test_503_with_retry_after_waits_at_least_that_long() -> None:
    # Retry-After is a minimum: the normal backoff never reads earlier than it asks.
    w = wait(run(rec(), obs(http_status=503, category=None, retry_after="120")))
    assert w.at == NOW + timedelta(seconds=120)
    assert w.source is DelaySource.PROVIDER_RETRY_AFTER
    assert w.counters.transport_failures_used == 1


def test_503_without_retry_after_backs_off_sharply() -> None:
    w = wait(run(rec(), obs(http_status=503, category=None)))
    assert seconds(w) >= 60


def test_500_uses_normal_backoff_and_the_failure_budget() -> None:
    w = wait(run(rec(poll_attempt=0), obs(http_status=500, category=None)))
    assert 5.0 <= seconds(w) <= 10.0
    assert w.counters.transport_failures_used == 1


@pytest.mark.parametrize("error", list(TransportError))
def test_transport_errors_spend_the_failure_budget(error: TransportError) -> None:
    w = wait(run(rec(transport_failures_used=1), obs(http_status=None, transport_error=error)))
    assert w.counters.transport_failures_used == 2


def test_the_failure_that_exhausts_the_budget_stops_with_ambiguous_delivery() -> None:
    r = rec(transport_failures_used=2)
    d = run(r, obs(http_status=None, category=None, transport_error=TransportError.TIMEOUT))
    s = stop(d, R.PROVIDER_FAILURE)
    assert "timed out (delivery ambiguous)" in s.detail
    assert "3 of 3" in s.detail
    assert s.counters is not None and s.counters.transport_failures_used == 3


def test_the_third_5xx_exhausts_the_budget() -> None:
    stop(run(rec(transport_failures_used=2), obs(http_status=502)), R.PROVIDER_FAILURE)


# --- pending: contradictions and the next read ------------------------------------------------


def test_running_after_its_own_expiry_escalates() -> None:
    d = run(rec(), obs(expires_at=isoformat(NOW - timedelta(seconds=1))))
    assert "running after its own expiry" in stop(d, R.CONTRADICTORY_STATUS).detail


def test_a_future_expiry_keeps_waiting() -> None:
    wait(run(rec(), obs(expires_at=isoformat(NOW + timedelta(hours=1)))))


@pytest.mark.parametrize(
    "value", ["tomorrow", 1745000000, "2025-04-18T10:00:00", "2025-13-01T00:00:00Z"]
)
def test_an_invalid_expiry_is_ignored_with_a_note(value: Any) -> None:
    w = wait(run(rec(), obs(expires_at=value)))
    assert any(n.startswith("expires_at") and "not an RFC 3339" in n for n in w.notes)


def test_pending_uses_jittered_backoff_at_the_completed_poll_count() -> None:
    w = wait(run(rec(poll_attempt=2), obs()))
    raw = POLICY.backoff.raw(3)
    assert w.source is DelaySource.LOCAL_BACKOFF
    assert 0.5 * raw <= seconds(w) <= raw
    assert w.counters == Counters(
        transport_failures_used=0, rate_limited_count=0, poll_attempt=3, hint_consumed=False
    )
    assert w.notes == ()


def test_a_valid_poll_after_hint_replaces_the_backoff() -> None:
    w = wait(run(rec(), obs(poll_after_seconds=30)))
    assert (w.at, w.source) == (NOW + timedelta(seconds=30), DelaySource.PROVIDER_POLL_HINT)


def test_a_valid_next_check_at_replaces_the_backoff() -> None:
    at = NOW + timedelta(minutes=3)
    w = wait(run(rec(), obs(next_check_at=isoformat(at))))
    assert (w.at, w.source) == (at, DelaySource.PROVIDER_POLL_HINT)


def test_with_both_hints_the_later_one_wins() -> None:
    at = NOW + timedelta(minutes=3)
    w = wait(run(rec(), obs(poll_after_seconds=30, next_check_at=isoformat(at))))
    assert w.at == at


@pytest.mark.parametrize(
    ("value", "note"),
    [
        (-5, "poll_after_seconds -5 ignored: negative"),
        ("soon", "poll_after_seconds 'soon' ignored: not a number"),
        ("30", "poll_after_seconds '30' ignored: not a number"),
        (True, "poll_after_seconds True ignored: not a number"),
        (math.nan, "poll_after_seconds nan ignored: not a finite number"),
        (math.inf, "poll_after_seconds inf ignored: not a finite number"),
        (10**9, "poll_after_seconds 1000000000 ignored: past the deadline"),
        (10**400, "ignored: past the deadline"),
        ([30], "poll_after_seconds [30] ignored: not a number"),
    ],
)
def test_bad_poll_after_hints_are_ignored_with_a_note(value: Any, note: str) -> None:
    w = wait(run(rec(poll_attempt=0), obs(poll_after_seconds=value)))
    assert w.source is DelaySource.LOCAL_BACKOFF
    assert 5.0 <= seconds(w) <= 10.0
    assert any(n.startswith("poll_after_seconds") and n.endswith(note) for n in w.notes)


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("next tuesday", "not an RFC 3339 timestamp"),
        (12345, "not an RFC 3339 timestamp"),
        ("2025-04-18T10:30:00", "not an RFC 3339 timestamp"),  # no offset
        (isoformat(NOW - timedelta(seconds=1)), "in the past"),
        (isoformat(NOW + timedelta(days=2)), "past the deadline"),
    ],
)
def test_bad_next_check_at_hints_are_ignored_with_a_note(value: Any, problem: str) -> None:
    w = wait(run(rec(), obs(next_check_at=value)))
    assert w.source is DelaySource.LOCAL_BACKOFF
    assert any(n.startswith("next_check_at") and n.endswith(problem) for n in w.notes)


def test_retry_after_is_a_minimum_over_a_provider_hint() -> None:
    w = wait(run(rec(), obs(poll_after_seconds=30, retry_after="45")))
    assert (w.at, w.source) == (NOW + timedelta(seconds=45), DelaySource.PROVIDER_RETRY_AFTER)


def test_a_longer_hint_is_kept_when_retry_after_is_shorter() -> None:
    w = wait(run(rec(), obs(poll_after_seconds=60, retry_after="45")))
    assert (w.at, w.source) == (NOW + timedelta(seconds=60), DelaySource.PROVIDER_POLL_HINT)


def test_retry_after_as_an_http_date() -> None:
    when = NOW + timedelta(minutes=2)
    w = wait(run(rec(), obs(retry_after=format_datetime(when, usegmt=True))))
    assert (w.at, w.source) == (when, DelaySource.PROVIDER_RETRY_AFTER)


def test_garbage_retry_after_is_ignored_with_a_note() -> None:
    w = wait(run(rec(), obs(retry_after="soon-ish")))
    assert w.source is DelaySource.LOCAL_BACKOFF
    assert "Retry-After 'soon-ish' ignored: unparsable" in w.notes


def test_retry_after_past_the_deadline_waits_until_the_deadline_then_stops_unsent() -> None:
    r = rec(deadline_at=NOW + timedelta(seconds=60))
    w = wait(run(r, obs(http_status=503, category=None, retry_after="600")))
    assert (w.at, w.source) == (r.deadline_at, DelaySource.PROVIDER_RETRY_AFTER)
    assert any("past the deadline" in n for n in w.notes)
    stop(before_request(replace(r, status_requests_used=2), w.at), R.DEADLINE_EXCEEDED)


def test_a_wait_is_capped_at_the_deadline() -> None:
    r = rec(deadline_at=NOW + timedelta(seconds=3), poll_attempt=10)
    w = wait(run(r, obs()))
    assert w.at == r.deadline_at
    assert w.source is DelaySource.LOCAL_BACKOFF
    assert any("capped at the deadline" in n for n in w.notes)


def test_an_absurd_backoff_is_capped_without_overflow() -> None:
    policy = PollPolicy(backoff=BackoffPolicy(base_seconds=1e300, max_seconds=1e300))
    r = rec(deadline_at=NOW + timedelta(hours=1))
    w = wait(decide(r, obs(), NOW, random.Random(1), policy))
    assert w.at == r.deadline_at


def test_pending_past_the_deadline_stops_at_once() -> None:
    r = rec(deadline_at=NOW)
    d = run(r, obs(poll_after_seconds=5))
    assert "remote state 'running'" in stop(d, R.DEADLINE_EXCEEDED).detail


def test_pending_on_the_last_budgeted_request_escalates_at_once() -> None:
    # No read is scheduled that the budget would refuse: the answer that spent it escalates.
    d = run(rec(status_requests_used=12), obs())
    s = stop(d, R.REQUEST_BUDGET_EXHAUSTED)
    assert "12 of 12" in s.detail
    assert s.counters is not None and s.counters.poll_attempt == 1


def test_a_wait_is_never_before_now_even_when_the_response_is_dated_later() -> None:
    w = wait(run(rec(), obs(at=NOW + timedelta(minutes=1), poll_after_seconds=0)))
    assert w.at == NOW


def test_a_pending_read_consumes_a_webhook_hint_with_a_note() -> None:
    w = wait(run(rec(hinted=True), obs()))
    assert w.counters.hint_consumed
    assert "webhook hint not confirmed: the provider still reports 'running'" in w.notes


def test_a_failed_read_keeps_the_webhook_hint() -> None:
    w = wait(run(rec(hinted=True), obs(http_status=503, category=None)))
    assert not w.counters.hint_consumed


def test_the_seed_audit_story() -> None:
    # 10:20:00 submitted; polls at 10:20:05, 10:20:14, 10:20:31 (503, Retry-After 120), 10:22:31.
    rng = random.Random(0)
    r = rec(deadline_at=T0 + timedelta(minutes=40), status_requests_used=0)
    at = first_poll_at(T0, r.deadline_at, rng, POLICY)
    assert 2.5 <= (at - T0).total_seconds() <= 5
    ranges = [(5, 10), (10, 20)]
    for low, high in ranges:
        r = replace(r, status_requests_used=r.status_requests_used + 1)
        w = wait(decide(r, obs(at=at), at, rng, POLICY))
        assert low <= (w.at - at).total_seconds() <= high
        r = replace(r, poll_attempt=w.counters.poll_attempt)
        at = w.at
    r = replace(r, status_requests_used=r.status_requests_used + 1)
    w = wait(decide(r, obs(at=at, http_status=503, retry_after="120"), at, rng, POLICY))
    assert (w.at - at, w.source) == (timedelta(seconds=120), DelaySource.PROVIDER_RETRY_AFTER)


def test_parse_rfc3339() -> None:
    assert parse_rfc3339("2025-04-18T10:24:00Z") == datetime(2025, 4, 18, 10, 24, tzinfo=UTC)
    assert parse_rfc3339("2025-04-18t12:24:00.123456789+02:00") == datetime(
        2025, 4, 18, 10, 24, 0, 123456, tzinfo=UTC
    )
    for bad in (None, 5, "", "2025-04-18", "20250418T102400Z", "2025-04-18T10:24:00"):
        assert parse_rfc3339(bad) is None


# --- properties -------------------------------------------------------------------------------

DEADLINE_ROOM = st.integers(min_value=1, max_value=6 * 3600)


@st.composite
def policies(draw: st.DrawFn) -> PollPolicy:
    base = draw(st.floats(min_value=0.01, max_value=300))
    cap = draw(st.floats(min_value=base, max_value=3600))
    floor = draw(st.floats(min_value=0.0, max_value=1.0))
    return PollPolicy(
        backoff=BackoffPolicy(base, cap, floor),
        max_rate_limited=draw(st.integers(min_value=1, max_value=5)),
        rate_limit_delay_seconds=draw(st.floats(min_value=0, max_value=600)),
        not_found_grace_seconds=draw(st.floats(min_value=0, max_value=120)),
    )


@dataclass(frozen=True)
class Spec:
    """A response shape independent of time; ``build`` places it at the simulated clock."""

    status: int | None
    error: TransportError | None
    category: RemoteCategory | None
    retry_after: int | str | None  # int: seconds from now as an HTTP-date
    poll_after: Any
    next_check: int | str | None  # int: seconds from now as RFC 3339
    expires: int | None
    required_ok: bool

    def build(self, now: datetime) -> Observation:
        retry_after = self.retry_after
        if isinstance(retry_after, int):
            retry_after = format_datetime(now + timedelta(seconds=retry_after), usegmt=True)
        next_check = self.next_check
        if isinstance(next_check, int):
            next_check = isoformat(now + timedelta(seconds=next_check))
        expires = None if self.expires is None else isoformat(now + timedelta(seconds=self.expires))
        return Observation(
            at=now,
            http_status=self.status,
            transport_error=self.error,
            retry_after=retry_after,
            category=self.category if self.status is not None and self.status < 300 else None,
            remote_state=None if self.category is None else f"state-{self.category.value}",
            poll_after_seconds=self.poll_after,
            next_check_at=next_check,
            expires_at=expires,
            required_fields_ok=self.required_ok,
        )


SPECS = st.builds(
    Spec,
    status=st.sampled_from([200, 200, 200, 200, 202, 404, 429, 500, 503, 401, 403, 400]),
    error=st.one_of(st.none(), st.none(), st.sampled_from(list(TransportError))),
    category=st.one_of(
        st.just(RemoteCategory.PENDING), st.sampled_from(list(RemoteCategory)), st.none()
    ),
    retry_after=st.one_of(
        st.none(),
        st.integers(min_value=0, max_value=20000).map(str),
        st.integers(min_value=-100, max_value=20000),
        st.text(max_size=8),
    ),
    poll_after=st.one_of(
        st.none(),
        st.integers(min_value=-100, max_value=10**12),
        st.floats(allow_nan=True, allow_infinity=True),
        st.booleans(),
        st.text(max_size=5),
    ),
    next_check=st.one_of(
        st.none(), st.integers(min_value=-500, max_value=50000), st.text(max_size=8)
    ),
    expires=st.one_of(st.none(), st.integers(min_value=-500, max_value=50000)),
    required_ok=st.booleans(),
)


@given(
    spec=SPECS,
    policy=policies(),
    room=DEADLINE_ROOM,
    used=st.integers(min_value=1, max_value=20),
    attempt=st.integers(min_value=0, max_value=100),
    skew=st.integers(min_value=-5, max_value=5),
    seed=st.integers(min_value=0, max_value=2**32),
    hinted=st.booleans(),
)
def test_a_wait_stays_between_now_retry_after_and_the_deadline(
    spec: Spec,
    policy: PollPolicy,
    room: int,
    used: int,
    attempt: int,
    skew: int,
    seed: int,
    hinted: bool,
) -> None:
    r = rec(
        deadline_at=NOW + timedelta(seconds=room),
        status_requests_used=used,
        max_status_requests=20,
        poll_attempt=attempt,
        hinted=hinted,
    )
    o = replace(spec.build(NOW), at=NOW + timedelta(seconds=skew))
    d = decide(r, o, NOW, random.Random(seed), policy)
    if not isinstance(d, Wait):
        return
    assert NOW <= d.at <= r.deadline_at
    minimum = parse_retry_after(o.retry_after, NOW)
    if minimum is not None and NOW + minimum <= r.deadline_at:
        assert d.at >= NOW + minimum
    if o.transport_error is None and o.http_status in (401, 403):
        pytest.fail("authorization failures never wait")


@given(
    policy=policies(),
    attempt=st.integers(min_value=0, max_value=80),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_local_backoff_jitter_stays_within_floor_and_raw(
    policy: PollPolicy, attempt: int, seed: int
) -> None:
    r = rec(deadline_at=NOW + timedelta(days=30), poll_attempt=attempt)
    w = wait(decide(r, obs(), NOW, random.Random(seed), policy))
    raw = policy.backoff.raw(attempt + 1)
    assert w.source is DelaySource.LOCAL_BACKOFF
    assert policy.backoff.jitter_floor * raw - 1e-6 <= seconds(w) <= raw + 1e-6


@settings(max_examples=300)
@given(
    specs=st.lists(SPECS, max_size=40),
    policy=policies(),
    room=DEADLINE_ROOM,
    budget=st.integers(min_value=0, max_value=25),
    failures=st.integers(min_value=0, max_value=5),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_a_whole_polling_run_is_bounded_and_terminates(
    specs: list[Spec], policy: PollPolicy, room: int, budget: int, failures: int, seed: int
) -> None:
    rng = random.Random(seed)
    deadline = T0 + timedelta(seconds=room)
    r = rec(
        deadline_at=deadline,
        accepted_at=T0,
        max_status_requests=budget,
        status_requests_used=0,
        max_transport_failures=failures,
    )
    now = T0
    sent = 0
    pending = Spec(200, None, RemoteCategory.PENDING, None, None, None, None, False)
    for _ in range(budget + 1):
        early = before_request(r, now)
        if early is not None:
            assert early.reason in (R.DEADLINE_EXCEEDED, R.REQUEST_BUDGET_EXHAUSTED)
            break
        r = replace(r, status_requests_used=r.status_requests_used + 1)  # charge, then send
        sent += 1
        spec = specs[sent - 1] if sent <= len(specs) else pending
        o = spec.build(now)
        d = decide(r, o, now, rng, policy)
        if o.transport_error is None and o.http_status in (401, 403):
            assert stop(d, R.AUTHORIZATION_DENIED)
        if o.transport_error is None and o.category is RemoteCategory.UNKNOWN:
            assert stop(d, R.UNKNOWN_STATE)
        assert d.counters is not None
        r = replace(
            r,
            transport_failures_used=d.counters.transport_failures_used,
            rate_limited_count=d.counters.rate_limited_count,
            poll_attempt=d.counters.poll_attempt,
            hinted=r.hinted and not d.counters.hint_consumed,
        )
        if not isinstance(d, Wait):
            assert isinstance(d, Collect | Finish | Stop)
            break
        assert now <= d.at <= deadline
        now = d.at
    else:
        pytest.fail("the run did not end within its request budget")
    assert sent <= budget


@given(
    at=st.integers(0, 600),
    close=st.integers(0, 600),
    floor=st.none() | st.integers(0, 1200),
    source=st.sampled_from(list(DelaySource)),
)
def test_a_cancelling_read_is_by_the_close_or_at_a_retry_after_just_past_it(
    at: int, close: int, floor: int | None, source: DelaySource
) -> None:
    """Never after the window's close, unless the provider's Retry-After holds the last
    look back: then exactly at it, and no further than the longest wait of our own."""
    bound = max(POLICY.backoff.max_seconds, POLICY.rate_limit_delay_seconds)

    def moment(seconds: int) -> datetime:
        return NOW + timedelta(seconds=seconds)

    floor_at = moment(floor) if floor is not None else None
    got, why = cancel_window_read(moment(at), source, moment(close), floor_at, POLICY)
    if floor is not None and close < floor <= close + bound:
        assert (got, why) == (moment(floor), DelaySource.PROVIDER_RETRY_AFTER)
    else:
        assert (got, why) == (min(moment(at), moment(close)), source)
        assert got <= moment(close)
