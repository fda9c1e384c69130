"""``write_batch`` on a real database, with hand-made verified events.

One call is one transaction's worth of events; the outcomes come back in input order.
"""

from __future__ import annotations

import hashlib
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from reconciler.core.states import State
from reconciler.storage.database import Database
from reconciler.storage.journal import Journal
from reconciler.storage.tables import EVENTS, HISTORY, OPS
from reconciler.storage.webhook_events import (
    IncomingEvent,
    Outcome,
    attach_orphans,
    lock_job_for_accept,
    write_batch,
)
from tests.support.factories import insert_operation

pytestmark = pytest.mark.both_backends

NOW = datetime(2025, 4, 18, 10, 20, tzinfo=UTC)
LATER = NOW + timedelta(hours=1)


def event(event_id: str, job: str | None, body: str = "", provider: str = "sim") -> IncomingEvent:
    text = body or f'{{"id":"{event_id}","job":"{job}"}}'
    return IncomingEvent(
        provider=provider,
        event_id=event_id,
        remote_job_id=job,
        body_sha256=hashlib.sha256(text.encode()).hexdigest(),
        body=text,
        received_at=NOW,
    )


@pytest.fixture
def journal() -> Journal:
    return Journal()


def add_op(db: Database, journal: Journal, job: str, state: State, **extra: Any) -> str:
    values: dict[str, Any] = {
        "state": state.value,
        "remote_job_id": job,
        "accepted_at": NOW,
        "next_poll_at": LATER,
        "delay_source": "local_backoff",
    }
    values.update(extra)
    return insert_operation(db, journal, NOW - timedelta(minutes=5), **values).id


def write(db: Database, journal: Journal, events: list[IncomingEvent]) -> list[Outcome]:
    with db.write() as conn:
        return write_batch(conn, journal, events, NOW)


def rows(db: Database) -> dict[str, dict[str, Any]]:
    with db.read() as conn:
        return {r["event_id"]: dict(r) for r in conn.execute(sa.select(EVENTS)).mappings()}


def op_row(db: Database, op_id: str) -> dict[str, Any]:
    with db.read() as conn:
        return dict(conn.execute(sa.select(OPS).where(OPS.c.id == op_id)).mappings().one())


def hints(db: Database, op_id: str) -> list[dict[str, Any]]:
    with db.read() as conn:
        found = conn.execute(
            sa.select(HISTORY)
            .where(HISTORY.c.operation_id == op_id, HISTORY.c.kind == "hint")
            .order_by(HISTORY.c.seq)
        ).mappings()
        return [dict(r) for r in found]


def test_new_event_for_an_observing_operation_hints_it(db: Database, journal: Journal) -> None:
    op_id = add_op(db, journal, "job_a", State.OBSERVING)
    assert write(db, journal, [event("e1", "job_a")]) == [Outcome.HINTED]
    op = op_row(db, op_id)
    assert (op["hinted_at"], op["next_poll_at"], op["delay_source"]) == (NOW, NOW, "webhook_hint")
    assert op["version"] == 2
    [hint] = hints(db, op_id)
    assert (hint["cause"], hint["delay_source"], hint["actor"]) == (
        "webhook:e1",
        "webhook_hint",
        "provider:sim",
    )
    assert rows(db)["e1"]["operation_id"] == op_id


def test_duplicates_inside_one_batch(db: Database, journal: Journal) -> None:
    op_id = add_op(db, journal, "job_a", State.OBSERVING)
    same = event("e1", "job_a")
    outcomes = write(db, journal, [same, same, same])
    assert outcomes == [Outcome.HINTED, Outcome.DUPLICATE, Outcome.DUPLICATE]
    assert len(rows(db)) == 1
    assert (rows(db)["e1"]["duplicates"], rows(db)["e1"]["conflicts"]) == (2, 0)
    assert len(hints(db, op_id)) == 1


def test_duplicates_across_batches(db: Database, journal: Journal) -> None:
    op_id = add_op(db, journal, "job_a", State.OBSERVING)
    assert write(db, journal, [event("e1", "job_a")]) == [Outcome.HINTED]
    version = op_row(db, op_id)["version"]
    assert write(db, journal, [event("e1", "job_a")]) == [Outcome.DUPLICATE]
    # e2 arrives while e1's hint is still pending: stored, coalesced into it (no entry, no write).
    assert write(db, journal, [event("e1", "job_a"), event("e2", "job_a")]) == [
        Outcome.DUPLICATE,
        Outcome.COALESCED,
    ]
    assert rows(db)["e1"]["duplicates"] == 2
    assert "e2" in rows(db)
    assert [h["cause"] for h in hints(db, op_id)] == ["webhook:e1"]
    assert op_row(db, op_id)["version"] == version


def test_conflicts_in_and_across_batches(db: Database, journal: Journal) -> None:
    op_id = add_op(db, journal, "job_a", State.OBSERVING)
    first = event("e1", "job_a", body='{"state":"running"}')
    other = event("e1", "job_a", body='{"state":"succeeded"}')
    assert write(db, journal, [first, other, first]) == [
        Outcome.HINTED,
        Outcome.CONFLICT,
        Outcome.DUPLICATE,
    ]
    assert write(db, journal, [other]) == [Outcome.CONFLICT]
    stored = rows(db)["e1"]
    assert (stored["duplicates"], stored["conflicts"]) == (1, 2)
    assert stored["body"] == '{"state":"running"}'
    assert len(hints(db, op_id)) == 1


def test_orphans_are_kept_without_an_operation(db: Database, journal: Journal) -> None:
    op_id = add_op(db, journal, "job_a", State.OBSERVING)
    before = op_row(db, op_id)
    outcomes = write(
        db,
        journal,
        [
            event("e1", "job_unknown"),
            event("e2", None),
            event("e3", "job_a", provider="other"),  # job ids belong to one provider
        ],
    )
    assert outcomes == [Outcome.ORPHAN] * 3
    stored = rows(db)
    assert {k: (v["remote_job_id"], v["operation_id"]) for k, v in stored.items()} == {
        "e1": ("job_unknown", None),
        "e2": (None, None),
        "e3": ("job_a", None),
    }
    assert op_row(db, op_id) == before
    assert hints(db, op_id) == []
    # An orphan seen again is a duplicate, not a second orphan row.
    assert write(db, journal, [event("e1", "job_unknown")]) == [Outcome.DUPLICATE]
    assert len(rows(db)) == 3


def test_several_events_for_one_operation_write_it_once(db: Database, journal: Journal) -> None:
    op_id = add_op(db, journal, "job_a", State.OBSERVING)
    other_id = add_op(db, journal, "job_b", State.CANCELLING)
    batch = [event("a1", "job_a"), event("b1", "job_b"), event("a2", "job_a"), event("a3", "job_a")]
    assert write(db, journal, batch) == [Outcome.HINTED] * 4
    assert op_row(db, op_id)["version"] == 2  # one write for three events
    [hint] = hints(db, op_id)  # and one entry: the other two coalesce into it
    assert (hint["cause"], hint["detail"]["coalesced"]) == ("webhook:a1", 2)
    assert [h["cause"] for h in hints(db, other_id)] == ["webhook:b1"]
    cancelling = op_row(db, other_id)
    assert (cancelling["next_poll_at"], cancelling["delay_source"]) == (NOW, "webhook_hint")
    with db.read() as conn:
        seqs = conn.execute(
            sa.select(HISTORY.c.seq).where(HISTORY.c.operation_id == op_id).order_by(HISTORY.c.seq)
        ).scalars()
        assert list(seqs) == [1, 2]


@pytest.mark.parametrize("state", [State.SUCCEEDED, State.FAILED, State.CANCELLED, State.ESCALATED])
def test_events_for_operations_with_nothing_to_look_at_are_recorded(
    db: Database, journal: Journal, state: State
) -> None:
    op_id = add_op(db, journal, "job_done", state, next_poll_at=None, delay_source=None)
    before = op_row(db, op_id)
    assert write(db, journal, [event("e1", "job_done"), event("e2", "job_done")]) == [
        Outcome.RECORDED,
        Outcome.RECORDED,
    ]
    assert op_row(db, op_id) == before
    assert hints(db, op_id) == []
    assert {r["operation_id"] for r in rows(db).values()} == {op_id}


@pytest.mark.parametrize("state", [State.ACCEPTED, State.CANCEL_REQUESTED, State.RESULT_COLLECTING])
def test_hint_is_noted_but_does_not_move_other_work(
    db: Database, journal: Journal, state: State
) -> None:
    op_id = add_op(db, journal, "job_a", state)
    assert write(db, journal, [event("e1", "job_a")]) == [Outcome.HINTED]
    op = op_row(db, op_id)
    assert op["hinted_at"] == NOW
    assert (op["next_poll_at"], op["delay_source"]) == (LATER, "local_backoff")
    [hint] = hints(db, op_id)
    assert hint["delay_source"] is None


def test_outcomes_come_back_in_input_order(db: Database, journal: Journal) -> None:
    add_op(db, journal, "job_live", State.OBSERVING)
    add_op(db, journal, "job_done", State.SUCCEEDED, next_poll_at=None)
    assert write(db, journal, [event("seen", "job_live")]) == [Outcome.HINTED]
    batch = [
        event("x1", "job_nobody"),
        event("seen", "job_live"),
        event("x2", "job_done"),
        event("x3", "job_live"),
        event("seen", "job_live", body="{}"),
        event("x1", "job_nobody"),
        event("x4", None),
        event("x5", "job_live"),
    ]
    assert write(db, journal, batch) == [
        Outcome.ORPHAN,
        Outcome.DUPLICATE,
        Outcome.RECORDED,
        Outcome.COALESCED,  # "seen" left a hint pending: x3 and x5 join it
        Outcome.CONFLICT,
        Outcome.DUPLICATE,
        Outcome.ORPHAN,
        Outcome.COALESCED,
    ]


def test_nothing_is_kept_when_the_transaction_rolls_back(db: Database, journal: Journal) -> None:
    op_id = add_op(db, journal, "job_a", State.OBSERVING)
    before = op_row(db, op_id)
    with pytest.raises(RuntimeError), db.write() as conn:
        write_batch(conn, journal, [event("e1", "job_a"), event("e2", "job_x")], NOW)
        raise RuntimeError("the commit never happens")
    assert rows(db) == {}
    assert op_row(db, op_id) == before
    assert hints(db, op_id) == []


def test_event_racing_the_create_answer_is_not_left_an_orphan(
    db: Database, journal: Journal
) -> None:
    """The create answer (job id + attaching orphans) and the job's first event commit at once.

    Whichever transaction goes first, the event must end up with the operation: either the
    acceptance attaches it, or the event finds the job id and hints.
    """
    op = insert_operation(db, journal, NOW)
    accepted_open = threading.Event()
    event_done = threading.Event()
    outcomes: list[Outcome] = []

    def accept() -> None:
        with db.write() as conn:
            # As the accept step: the job's lock, then the write that attaches orphans.
            lock_job_for_accept(conn, op.provider, "job_race", trust=True)
            journal.transition(
                conn,
                op,
                State.ACCEPTED,
                actor="test",
                cause="create_confirmed_job",
                now=NOW,
                changes={"remote_job_id": "job_race"},
                also=[attach_orphans(op.provider, "job_race", op.id)],
            )
            accepted_open.set()
            event_done.wait(1.0)  # give the event every chance to commit in between

    def deliver() -> None:
        accepted_open.wait(5.0)
        with db.write() as conn:
            outcomes.extend(write_batch(conn, journal, [event("e_race", "job_race")], NOW))
        event_done.set()

    threads = [threading.Thread(target=accept), threading.Thread(target=deliver)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10.0)
    assert outcomes in ([Outcome.ORPHAN], [Outcome.HINTED])
    assert rows(db)["e_race"]["operation_id"] == op.id, f"lost as an orphan ({outcomes})"
