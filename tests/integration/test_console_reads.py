"""The console's storage reads on both backends: at-risk SQL agrees with the pure rules,
search takes the start of an id, a page's escalations come in one read."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest

from reconciler.core import risk
from reconciler.core.clock import ManualClock
from reconciler.core.states import State
from reconciler.core.vocabulary import EscalationReason
from reconciler.storage import inbox, provider_stats
from reconciler.storage.database import Database
from reconciler.storage.escalations import escalations_by_operation, escalations_for
from reconciler.storage.journal import Journal
from tests.support.factories import insert_escalation, insert_operation

pytestmark = pytest.mark.both_backends


def add_escalation(db: Database, op_id: str, esc_id: int, reason: str, decided: bool) -> None:
    insert_escalation(db, op_id, esc_id, reason, decided=decided, at=ManualClock().now())


def test_at_risk_lists_exactly_what_the_risk_rules_label(db: Database) -> None:
    clock, journal, rng = ManualClock(), Journal(), random.Random(11)
    now = clock.now()
    made = []
    reasons = [r.value for r in EscalationReason]
    for number in range(160):
        created = now - timedelta(seconds=rng.randint(0, 3000))
        # Some were escalated before (any reason, decided or not): "failing again" counts.
        escalated_before = rng.random() < 0.5
        op = insert_operation(
            db,
            journal,
            created,
            state=rng.choice(list(State)).value,
            deadline_at=created + timedelta(seconds=rng.randint(1, 4000)),
            max_status_requests=rng.randint(0, 12),
            status_requests_used=rng.randint(0, 12),
            max_transport_failures=rng.randint(0, 4),
            transport_failures_used=rng.randint(0, 4),
            rate_limited_count=rng.choice([0, 0, 1, 2]),
            escalation_id=number + 1 if escalated_before else None,
            escalation_open=escalated_before and rng.random() < 0.3,
        )
        if escalated_before:
            add_escalation(db, op.id, number + 1, rng.choice(reasons), not op.escalation_open)
        made.append(op)
    with db.read() as conn:
        listed = inbox.at_risk(conn, inbox.InboxFilter(), now, 1000, 0)
        last = escalations_for(conn, [op.escalation_id for op in made if op.escalation_id])
    reason = {op.id: last[op.escalation_id].reason for op in made if op.escalation_id}
    expected = {op.id for op in made if risk.risks(op, now, reason.get(op.id))}
    assert {op.id for op in listed.items} == expected
    assert listed.total == len(expected)
    assert listed.reasons == {op.id: reason[op.id] for op in listed.items if op.id in reason}
    assert all(risk.risks(op, now, reason.get(op.id)) for op in listed.items)
    deadlines = [op.deadline_at for op in listed.items]
    assert deadlines == sorted(deadlines)
    # The rule that is new to the list is exercised, not only allowed.
    again = [
        op
        for op in listed.items
        if any(r.kind == "again" for r in risk.risks(op, now, reason.get(op.id)))
    ]
    assert again


def test_an_operation_failing_again_the_way_it_stopped_is_at_risk(db: Database) -> None:
    clock, journal = ManualClock(), Journal()
    now = clock.now()
    calm = {"state": State.OBSERVING.value, "status_requests_used": 1}
    again = insert_operation(db, journal, now, rate_limited_count=1, escalation_id=1, **calm)
    other = insert_operation(db, journal, now, rate_limited_count=1, escalation_id=2, **calm)
    fresh = insert_operation(db, journal, now, rate_limited_count=0, escalation_id=3, **calm)
    add_escalation(db, again.id, 1, EscalationReason.RATE_LIMITED.value, decided=True)
    add_escalation(db, other.id, 2, EscalationReason.DEADLINE_EXCEEDED.value, decided=True)
    add_escalation(db, fresh.id, 3, EscalationReason.RATE_LIMITED.value, decided=True)
    with db.read() as conn:
        listed = inbox.at_risk(conn, inbox.InboxFilter(), now, 100, 0)
    assert [op.id for op in listed.items] == [again.id]
    [label] = risk.risks(listed.items[0], now, EscalationReason.RATE_LIMITED.value)
    assert label.text == "429 again (1 in a row) after the rate_limited decision"


def test_search_takes_the_start_of_an_id_job_or_trace(db: Database) -> None:
    clock, journal = ManualClock(), Journal()
    op = insert_operation(db, journal, clock.now(), remote_job_id="job_find_me")
    other = insert_operation(db, journal, clock.now(), remote_job_id="job_other")
    with db.read() as conn:

        def found(query: str) -> list[str]:
            return [o.id for o in inbox.matching(conn, inbox.InboxFilter(query=query), 10, 0).items]

        for value in (op.id, "job_find_me", op.trace_id):
            assert found(value) == [op.id]
        # The start of each: the id without its "op_" too; "_" is a character, not a wildcard.
        for value in (
            op.id[:-6],
            op.id[3:-6],
            "job_find",
            "job_f",
            op.trace_id[:8],
        ):
            assert op.id in found(value), value
        assert found("job_") == sorted([op.id, other.id], reverse=True)
        assert found("job%find") == [] and found("jobxfind") == [] and found("JOB_FIND") == []
        assert found("find_me") == []  # the start, not any part
        assert inbox.providers_seen(conn) == ["sim"]
        assert inbox.stamp(conn) == "0.0"


def test_a_pages_escalations_come_in_one_read(db: Database) -> None:
    clock, journal = ManualClock(), Journal()
    one = insert_operation(db, journal, clock.now())
    two = insert_operation(db, journal, clock.now())
    add_escalation(db, one.id, 7, "rate_limited", decided=True)
    add_escalation(db, one.id, 9, "rate_limited", decided=False)
    with db.read() as conn:
        found = escalations_by_operation(conn, [one.id, two.id])
        assert escalations_by_operation(conn, []) == {}
    assert [e.id for e in found[one.id]] == [7, 9]
    assert found[two.id] == []


def test_status_reads_per_completed_operation(db: Database) -> None:
    clock, journal = ManualClock(), Journal()
    for used in (1, 1, 4, 12):
        insert_operation(
            db, journal, clock.now(), state=State.SUCCEEDED.value, status_requests_used=used
        )
    insert_operation(db, journal, clock.now(), state=State.OBSERVING.value, status_requests_used=9)
    with db.read() as conn:
        reads = provider_stats.status_reads(conn)["sim"]
        assert provider_stats.webhook_counts(conn) == {}
    assert (reads.completed, reads.reads, reads.most) == (4, 18, 12)
    assert reads.mean == 4.5
    assert reads.buckets == {"0": 0, "1": 2, "2": 0, "3-5": 1, "6-10": 0, "11+": 1}
