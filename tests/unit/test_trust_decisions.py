"""Webhook trust in the pure core: the stretched wait, the final look, the way back, counting."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.core.backoff import BackoffPolicy, parse_retry_after
from reconciler.core.next_read import first_poll, restore
from reconciler.core.poll import decide
from reconciler.core.poll_values import Observation, PollPolicy, PollRecord, Wait
from reconciler.core.trust import (
    Health,
    TrustPolicy,
    TrustState,
    Verdict,
    count,
    judge_read,
    settle,
    share,
    spread,
)
from reconciler.core.vocabulary import DelaySource, RemoteCategory, TransportError

T0 = datetime(2025, 4, 18, 10, 20, tzinfo=UTC)
BACKOFF = BackoffPolicy(5.0, 120.0, 0.5)
PLAIN = PollPolicy(backoff=BACKOFF)
ADAPTIVE = PollPolicy(backoff=BACKOFF, trusted_max_delay_seconds=1200.0, final_look_seconds=5.0)


def record(**overrides: Any) -> PollRecord:
    values: dict[str, Any] = {
        "deadline_at": T0 + timedelta(seconds=2400),
        "accepted_at": T0,
        "max_status_requests": 12,
        "status_requests_used": 1,
        "max_transport_failures": 3,
    }
    values.update(overrides)
    return PollRecord(**values)


def pending(now: datetime, **overrides: Any) -> Observation:
    values: dict[str, Any] = {
        "at": now,
        "http_status": 200,
        "category": RemoteCategory.PENDING,
        "remote_state": "running",
    }
    values.update(overrides)
    return Observation(**values)


# --- properties of the poll decision with trust --------------------------------------------

observations = st.fixed_dictionaries(
    {
        "http_status": st.sampled_from([200, 200, 200, 429, 500, 503, 404]),
        "retry_after": st.one_of(
            st.none(), st.integers(0, 5000).map(str), st.sampled_from(["soon", "-3"])
        ),
        "poll_after_seconds": st.one_of(st.none(), st.floats(-10, 5000), st.integers(0, 5000)),
        "transport": st.booleans(),
    }
)


@settings(max_examples=400, deadline=None)
@given(
    obs=observations,
    elapsed=st.floats(0, 2500),
    used=st.integers(1, 12),
    attempt=st.integers(0, 20),
    trusted=st.booleans(),
    seed=st.integers(0, 2**16),
    deadline=st.floats(10, 4000),
)
def test_trust_and_the_final_look_keep_every_polling_bound(
    obs: dict[str, Any],
    elapsed: float,
    used: int,
    attempt: int,
    trusted: bool,
    seed: int,
    deadline: float,
) -> None:
    now = T0 + timedelta(seconds=elapsed)
    rec = record(
        deadline_at=T0 + timedelta(seconds=deadline),
        status_requests_used=used,
        poll_attempt=attempt,
    )
    observation = pending(
        now,
        http_status=None if obs["transport"] else obs["http_status"],
        transport_error=TransportError.TIMEOUT if obs["transport"] else None,
        retry_after=obs["retry_after"],
        poll_after_seconds=obs["poll_after_seconds"],
    )
    decision = decide(rec, observation, now, random.Random(seed), ADAPTIVE, trusted=trusted)
    if not isinstance(decision, Wait):
        return
    # Reads never exceed the budget: a wait is only scheduled with a request left.
    assert rec.status_requests_used < rec.max_status_requests
    # Never past the deadline, never before now.
    assert now <= decision.at <= rec.deadline_at
    # Never before Retry-After, unless no legal request is left (then: the deadline).
    minimum = parse_retry_after(obs["retry_after"], now)
    if minimum is not None and decision.at < now + minimum:
        assert decision.at == rec.deadline_at
    # Never before a valid provider hint.
    if decision.hint_at is not None:
        assert decision.at >= decision.hint_at
    # Trust never stretches beyond trusted_max_delay_seconds.
    if decision.source is DelaySource.WEBHOOK_TRUST:
        assert trusted
        assert (decision.at - now).total_seconds() <= 1200.0
    # The final look only before the deadline, inside the budget, never before a minimum.
    if decision.final_look:
        assert decision.at < rec.deadline_at
        assert decision.at >= rec.deadline_at - timedelta(seconds=5.0) or decision.at == now


@settings(max_examples=200, deadline=None)
@given(elapsed=st.floats(0, 2399), seed=st.integers(0, 2**16), attempt=st.integers(0, 12))
def test_without_trust_keys_the_decision_is_exactly_the_old_one(
    elapsed: float, seed: int, attempt: int
) -> None:
    now = T0 + timedelta(seconds=elapsed)
    rec = record(poll_attempt=attempt)
    old = decide(rec, pending(now), now, random.Random(seed), PLAIN)
    # webhook_trust = "off" leaves both trust values None: "trusted" cannot change a thing.
    new = decide(rec, pending(now), now, random.Random(seed), PLAIN, trusted=True)
    assert old == new
    assert not isinstance(old, Wait) or old.source is not DelaySource.WEBHOOK_TRUST


def test_a_trusted_pending_read_waits_the_stretched_schedule() -> None:
    now = T0 + timedelta(seconds=30)
    wait = decide(record(), pending(now), now, random.Random(1), ADAPTIVE, trusted=True)
    assert isinstance(wait, Wait)
    assert wait.source is DelaySource.WEBHOOK_TRUST
    assert 600 <= (wait.at - now).total_seconds() <= 1200
    assert any("stretched" in n for n in wait.notes)


def test_a_provider_hint_longer_than_the_stretch_is_a_minimum() -> None:
    now = T0 + timedelta(seconds=30)
    obs = pending(now, poll_after_seconds=1500)
    wait = decide(record(), obs, now, random.Random(1), ADAPTIVE, trusted=True)
    assert isinstance(wait, Wait)
    assert wait.source is DelaySource.PROVIDER_POLL_HINT
    assert wait.at == now + timedelta(seconds=1500)


def test_a_read_that_would_pass_the_deadline_becomes_the_final_look() -> None:
    now = T0 + timedelta(seconds=2000)
    wait = decide(record(), pending(now), now, random.Random(1), ADAPTIVE, trusted=True)
    assert isinstance(wait, Wait)
    assert wait.final_look
    assert wait.at == record().deadline_at - timedelta(seconds=5)
    # That read itself is inside the window: the next wait ends at the deadline, no loop.
    later = wait.at + timedelta(seconds=1)
    rec = record(status_requests_used=2, poll_attempt=1)
    after = decide(rec, pending(later), later, random.Random(2), ADAPTIVE, trusted=True)
    assert isinstance(after, Wait)
    assert not after.final_look
    assert after.at == record().deadline_at


def test_no_final_look_when_the_last_request_is_spent() -> None:
    now = T0 + timedelta(seconds=2000)
    rec = record(status_requests_used=12)
    decision = decide(rec, pending(now), now, random.Random(1), ADAPTIVE, trusted=True)
    assert not isinstance(decision, Wait)


def test_the_first_read_after_the_create_is_stretched_while_trusted() -> None:
    deadline = T0 + timedelta(seconds=2400)
    at, source = first_poll(T0, deadline, random.Random(3), ADAPTIVE, trusted=True)
    assert source is DelaySource.WEBHOOK_TRUST
    assert 600 <= (at - T0).total_seconds() <= 1200
    at, source = first_poll(T0, deadline, random.Random(3), ADAPTIVE, trusted=False)
    assert source is DelaySource.LOCAL_BACKOFF
    assert (at - T0).total_seconds() <= 5
    short = T0 + timedelta(seconds=300)
    at, _ = first_poll(T0, short, random.Random(3), ADAPTIVE, trusted=True)
    assert at == short - timedelta(seconds=5)  # the final look


@settings(max_examples=300, deadline=None)
@given(
    since_read=st.floats(0, 1200),
    stretch=st.floats(1, 1200),
    slot=st.floats(0, 30),
    attempt=st.integers(0, 10),
    hint=st.one_of(st.none(), st.floats(0, 2000)),
    retry=st.one_of(st.none(), st.floats(0, 2000)),
    seed=st.integers(0, 2**16),
)
def test_a_restored_wait_is_normal_never_later_than_the_stretch_and_keeps_minimums(
    since_read: float,
    stretch: float,
    slot: float,
    attempt: int,
    hint: float | None,
    retry: float | None,
    seed: int,
) -> None:
    now = T0 + timedelta(seconds=1000)
    last = now - timedelta(seconds=since_read)
    stretched_at = now + timedelta(seconds=stretch)
    hint_at = now + timedelta(seconds=hint) if hint is not None else None
    retry_at = now + timedelta(seconds=retry) if retry is not None else None
    rec = record(poll_attempt=attempt)
    back = restore(
        rec,
        last,
        stretched_at,
        hint_at,
        retry_at,
        now + timedelta(seconds=slot),
        now,
        random.Random(seed),
        ADAPTIVE,
    )
    assert now <= back.at <= rec.deadline_at
    floors = [f for f in (hint_at, retry_at) if f is not None]
    if floors and max(floors) > stretched_at:
        # Guidance beyond the stretched read wins; beyond the deadline it ends there.
        assert back.at == min(max(floors), rec.deadline_at)
    else:
        assert back.at <= stretched_at
    for floor in floors:
        assert back.at >= min(floor, rec.deadline_at)
    assert back.source is not DelaySource.WEBHOOK_TRUST


# --- health --------------------------------------------------------------------------------

POLICY = TrustPolicy(trust_after=3, distrust_after_misses=1)


def test_a_read_after_our_own_outage_excuses_the_provider_but_never_hides_a_webhook() -> None:
    second = timedelta(seconds=1)
    # The webhook may have come while our storage refused it: not the provider's miss.
    assert judge_read(None, T0, outage=True) is Verdict.EXCUSED
    assert judge_read(None, T0, T0 + second, outage=True) is Verdict.EXCUSED
    # A webhook stored before we asked still counts, outage or not.
    assert judge_read(T0 - second, T0, outage=True) is Verdict.WEBHOOK_FIRST
    assert judge_read(None, T0, T0 - second, outage=True) is Verdict.WEBHOOK_FIRST


def test_judging_a_read() -> None:
    assert judge_read(T0, T0 + timedelta(seconds=1)) is Verdict.WEBHOOK_FIRST
    assert judge_read(T0 + timedelta(seconds=1), T0) is Verdict.PENDING  # arrived during the read
    assert judge_read(None, T0) is Verdict.PENDING
    # A webhook no earlier read answered decides when the hint's moment is past the read.
    second = timedelta(seconds=1)
    assert judge_read(T0 + second, T0, T0 - second) is Verdict.WEBHOOK_FIRST
    assert judge_read(None, T0, T0 - second) is Verdict.WEBHOOK_FIRST
    assert judge_read(None, T0, T0 + second) is Verdict.PENDING
    grace_end = T0 + timedelta(seconds=30)
    assert settle(T0, T0 + timedelta(seconds=10), grace_end) is Verdict.LATE
    assert settle(T0, T0 + timedelta(seconds=31), grace_end) is Verdict.MISS
    assert settle(T0, None, grace_end) is Verdict.MISS
    # Received before the read (no earlier read answered it), its hint stored after it.
    assert settle(T0, T0 - timedelta(seconds=1), grace_end) is Verdict.WEBHOOK_FIRST


def test_trust_after_consecutive_webhook_first_then_distrust_at_the_first_miss() -> None:
    health = Health()
    changes = []
    for i in range(3):
        health, change = count(health, Verdict.WEBHOOK_FIRST, f"op_{i}", T0, POLICY)
        changes.append(change)
    assert health.state is TrustState.TRUSTED
    assert changes[:2] == [None, None] and changes[2] is not None
    health, change = count(health, Verdict.LATE, "op_late", T0, POLICY)
    assert change is None and health.state is TrustState.TRUSTED and health.late == 1
    health, change = count(health, Verdict.MISS, "op_miss", T0, POLICY)
    assert change is not None and change.distrusted
    assert (health.state, health.streak, health.last_miss_operation) == (
        TrustState.DISTRUSTED,
        0,
        "op_miss",
    )
    # Earned again the same way.
    for i in range(3):
        health, change = count(health, Verdict.WEBHOOK_FIRST, f"again_{i}", T0, POLICY)
    assert health.state is TrustState.TRUSTED
    assert share(health) == 6 / 8


def test_a_miss_resets_the_streak_while_learning() -> None:
    lenient = replace(POLICY, distrust_after_misses=2)
    health = Health()
    for verdict in (Verdict.WEBHOOK_FIRST, Verdict.WEBHOOK_FIRST, Verdict.MISS):
        health, _ = count(health, verdict, "op", T0, lenient)
    assert (health.state, health.streak, health.misses) == (TrustState.LEARNING, 0, 1)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 3000), concurrency=st.integers(1, 64), seed=st.integers(0, 2**16))
def test_brought_back_reads_are_spread_never_a_burst(n: int, concurrency: int, seed: int) -> None:
    times = sorted(spread(n, T0, 5.0, concurrency, random.Random(seed)))
    assert len(times) == n
    window = max(5.0, n / concurrency)
    assert all(T0 <= t <= T0 + timedelta(seconds=window) for t in times)
    # Each read has its own slot of window / n seconds: any `concurrency` + 1 consecutive
    # reads span more than (concurrency - 1) slots, i.e. about a second at the fastest.
    width = window / n
    for i in range(len(times) - concurrency):
        assert (times[i + concurrency] - times[i]).total_seconds() > (concurrency - 1) * width


def test_a_trusted_provider_never_moves_on_a_webhook_first_completion() -> None:
    """What storage.trust's one-statement fast path relies on."""
    health = Health(state=TrustState.TRUSTED, streak=40, webhook_first=40)
    after, change = count(health, Verdict.WEBHOOK_FIRST, "op", T0, POLICY)
    assert change is None
    assert after == replace(health, streak=41, webhook_first=41)
