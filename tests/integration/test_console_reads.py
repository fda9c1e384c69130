"""The console's storage reads on both backends: at-risk SQL agrees with the pure rules."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest

from reconciler.core import risk
from reconciler.core.clock import ManualClock
from reconciler.core.states import State
from reconciler.storage import inbox, provider_stats
from reconciler.storage.database import Database
from reconciler.storage.journal import Journal
from tests.support.factories import insert_operation

pytestmark = pytest.mark.both_backends


def test_at_risk_lists_exactly_what_the_risk_rules_label(db: Database) -> None:
    clock, journal, rng = ManualClock(), Journal(), random.Random(11)
    now = clock.now()
    made = []
    for _ in range(120):
        created = now - timedelta(seconds=rng.randint(0, 3000))
        made.append(
            insert_operation(
                db,
                journal,
                created,
                state=rng.choice(list(State)).value,
                deadline_at=created + timedelta(seconds=rng.randint(1, 4000)),
                max_status_requests=rng.randint(0, 12),
                status_requests_used=rng.randint(0, 12),
                max_transport_failures=rng.randint(0, 4),
                transport_failures_used=rng.randint(0, 4),
            )
        )
    with db.read() as conn:
        listed = inbox.at_risk(conn, inbox.InboxFilter(), now, 1000, 0)
    expected = {op.id for op in made if risk.risks(op, now)}
    assert {op.id for op in listed.items} == expected
    assert listed.total == len(expected)
    assert all(risk.risks(op, now) for op in listed.items)
    deadlines = [op.deadline_at for op in listed.items]
    assert deadlines == sorted(deadlines)


def test_search_matches_id_job_and_trace_exactly(db: Database) -> None:
    clock, journal = ManualClock(), Journal()
    op = insert_operation(db, journal, clock.now(), remote_job_id="job_find_me")
    insert_operation(db, journal, clock.now(), remote_job_id="job_other")
    with db.read() as conn:
        for value in (op.id, "job_find_me", op.trace_id):
            found = inbox.matching(conn, inbox.InboxFilter(query=value), 10, 0)
            assert [o.id for o in found.items] == [op.id]
        assert inbox.matching(conn, inbox.InboxFilter(query="job_find"), 10, 0).total == 0
        assert inbox.providers_seen(conn) == ["sim"]
        assert inbox.stamp(conn) == "0.0"


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
