"""Properties of the deadline rule around our own outages (``core.lapses.deadline_lapse``).

A simulated poller reads a job that never finishes; the service is away during random
lapses (no claim, no read) and comes back after them. Whatever the lapses: never more
reads than the budget plus the one recovery look, never a read after the deadline but
that look, and the look only when a lapse covered the deadline.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.core.backoff import BackoffPolicy
from reconciler.core.lapses import Lapse, deadline_lapse
from reconciler.core.next_read import first_poll_at
from reconciler.core.poll import before_request, decide
from reconciler.core.poll_values import Observation, PollPolicy, PollRecord, Stop, Wait
from reconciler.core.vocabulary import EscalationReason, RemoteCategory

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SLACK = 5.0
POLICY = PollPolicy(backoff=BackoffPolicy(base_seconds=1.0, max_seconds=8.0))


def _away(at: datetime, lapses: list[Lapse]) -> datetime:
    """When the service can act again if it wanted to act at ``at``."""
    for lapse in lapses:
        if lapse.started_at <= at < lapse.ended_at:
            return lapse.ended_at
    return at


def _run(deadline_s: float, budget: int, spans: list[tuple[float, float]], seed: int) -> None:
    rng = random.Random(seed)
    deadline = T0 + timedelta(seconds=deadline_s)
    lapses = sorted(
        (Lapse(T0 + timedelta(seconds=s), T0 + timedelta(seconds=s + d)) for s, d in spans),
        key=lambda lp: lp.started_at,
    )
    record = PollRecord(
        deadline_at=deadline,
        accepted_at=T0,
        max_status_requests=budget,
        status_requests_used=0,
        max_transport_failures=3,
    )
    due = first_poll_at(T0, deadline, rng, POLICY)
    reads: list[tuple[datetime, bool]] = []  # (sent at, recovery look)
    for _ in range(budget + 10):
        now = _away(due, lapses)
        seen = [lp for lp in lapses if lp.ended_at <= now]  # what the process remembers
        stop = before_request(record, now)
        if stop is not None:
            lapse = None
            if stop.reason is EscalationReason.DEADLINE_EXCEEDED:
                lapse = deadline_lapse(deadline, due, now, seen, slack_seconds=SLACK)
            if lapse is not None:
                reads.append((now, True))
                covered = any(lp.started_at <= deadline for lp in lapses) or (
                    (now - min(due, deadline)).total_seconds() > SLACK
                )
                assert covered, "a recovery look without a lapse covering the deadline"
                assert lapse.started_at <= deadline
            break
        record = PollRecord(**{**record.__dict__, "status_requests_used": len(reads) + 1})
        reads.append((now, False))
        obs = Observation(at=now, http_status=200, category=RemoteCategory.PENDING)
        decision = decide(record, obs, now, rng, POLICY)
        if isinstance(decision, Stop):
            break
        assert isinstance(decision, Wait)
        record = PollRecord(**{**record.__dict__, "poll_attempt": decision.counters.poll_attempt})
        due = decision.at
    assert len(reads) <= budget + 1
    assert len([r for r in reads if r[1]]) <= 1
    assert all(at < deadline for at, look in reads if not look), "a plain read at the deadline"


@settings(max_examples=400, deadline=None)
@given(
    deadline_s=st.floats(min_value=2.0, max_value=120.0),
    budget=st.integers(min_value=1, max_value=30),
    spans=st.lists(st.tuples(st.floats(0.0, 150.0), st.floats(0.1, 90.0)), max_size=3),
    seed=st.integers(0, 2**16),
)
def test_reads_stay_bounded_and_the_look_needs_a_covering_lapse(
    deadline_s: float, budget: int, spans: list[tuple[float, float]], seed: int
) -> None:
    _run(deadline_s, budget, spans, seed)


@given(
    before=st.floats(0.0, 100.0),
    late=st.floats(0.0, 100.0),
)
def test_before_the_deadline_there_is_no_lapse(before: float, late: float) -> None:
    deadline = T0 + timedelta(seconds=200)
    now = deadline - timedelta(seconds=before + 0.001)
    lapse = Lapse(T0, now)
    found = deadline_lapse(
        deadline, now - timedelta(seconds=late), now, [lapse], slack_seconds=SLACK
    )
    assert found is None


def test_a_lapse_over_before_the_planned_look_does_not_cover_the_deadline() -> None:
    """Back before the deadline, the operation was read again: that was the look."""
    deadline = T0 + timedelta(seconds=200)
    over = Lapse(T0, deadline - timedelta(seconds=5))
    assert deadline_lapse(deadline, deadline, deadline, [over], slack_seconds=SLACK) is None
    across = Lapse(deadline - timedelta(seconds=20), deadline + timedelta(seconds=1))
    due = deadline - timedelta(seconds=1)
    now = deadline + timedelta(seconds=1)
    assert deadline_lapse(deadline, due, now, [across], slack_seconds=SLACK) == across
