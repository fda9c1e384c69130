"""The single write path: transitions with evidence, version guard, history replay.

Runs on SQLite and PostgreSQL (the ``db_url`` fixture).
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconciler.core.chain import Entry
from reconciler.core.clock import ManualClock
from reconciler.core.errors import IllegalTransition, StaleWrite
from reconciler.core.records import OperationRecord
from reconciler.core.states import END_STATES, TRANSITIONS, State
from reconciler.core.vocabulary import HistoryKind
from reconciler.storage import completion_steps as steps
from reconciler.storage.audit import verify
from reconciler.storage.database import Database
from reconciler.storage.journal import Journal, Lease, Step
from reconciler.storage.operations import load_operation
from reconciler.storage.tables import HISTORY, OPS
from tests.support.factories import insert_operation
from tests.support.statements import recording

pytestmark = pytest.mark.both_backends

ALL_EDGES = [(frm, to) for frm, tos in TRANSITIONS.items() for to in sorted(tos)]


def _history(db: Database, op_id: str) -> list[dict[str, object]]:
    with db.read() as conn:
        rows = conn.execute(
            sa.select(HISTORY).where(HISTORY.c.operation_id == op_id).order_by(HISTORY.c.seq)
        )
        return [dict(r._mapping) for r in rows]


def _force_state(
    db: Database, journal: Journal, op: OperationRecord, state: State
) -> OperationRecord:
    """Put a fresh operation into ``state`` without walking the table (test set-up only)."""
    with db.write() as conn:
        conn.execute(sa.update(OPS).where(OPS.c.id == op.id).values(state=state.value))
        return load_operation(conn, op.id)


@pytest.mark.parametrize(("frm", "to"), ALL_EDGES, ids=[f"{a}->{b}" for a, b in ALL_EDGES])
def test_every_allowed_transition_succeeds_with_evidence(
    db: Database, clock: ManualClock, frm: State, to: State
) -> None:
    journal = Journal()
    op = _force_state(db, journal, insert_operation(db, journal, clock.now()), frm)
    clock.advance(1)
    with db.write() as conn:
        after = journal.transition(
            conn,
            op,
            to,
            actor="worker-3",
            cause="test:evidence",
            now=clock.now(),
            detail={"http_status": 200},
        )
    assert after.state == to.value
    assert after.version == op.version + 1
    last = _history(db, op.id)[-1]
    assert (last["from_state"], last["to_state"]) == (frm.value, to.value)
    assert last["actor"] == "worker-3"
    assert last["cause"] == "test:evidence"
    assert last["detail"] == {"http_status": 200}
    assert last["at"] == clock.now()
    with db.read() as conn:
        stored = load_operation(conn, op.id)
    assert stored.state == to.value
    if to in END_STATES:
        assert stored.done_at == clock.now()
        assert stored.completion_pending is True


FORBIDDEN = [
    (State.CREATE_PENDING, State.OBSERVING),
    (State.OBSERVING, State.SUCCEEDED),
    (State.CANCELLING, State.OBSERVING),
    (State.SUCCEEDED, State.FAILED),
    (State.FAILED, State.OBSERVING),
    (State.CANCELLED, State.CANCEL_REQUESTED),
    (State.RESULT_COLLECTING, State.CANCELLED),
    (State.ESCALATED, State.SUCCEEDED),
]


@pytest.mark.parametrize(("frm", "to"), FORBIDDEN, ids=[f"{a}->{b}" for a, b in FORBIDDEN])
def test_forbidden_transition_raises_and_writes_nothing(
    db: Database, clock: ManualClock, frm: State, to: State
) -> None:
    journal = Journal()
    op = _force_state(db, journal, insert_operation(db, journal, clock.now()), frm)
    before = _history(db, op.id)
    with pytest.raises(IllegalTransition), db.write() as conn:
        journal.transition(conn, op, to, actor="w", cause="test", now=clock.now())
    with db.read() as conn:
        assert load_operation(conn, op.id) == op
    assert _history(db, op.id) == before


def test_a_move_through_a_state_is_two_moves_in_one_write(db: Database, clock: ManualClock) -> None:
    """``through``: each state passed is a move of its own in the history (checked against
    the state table, chained), and the row changes once."""
    journal = Journal()
    op = insert_operation(db, journal, clock.now())
    with db.write() as conn:
        after = journal.transition(
            conn,
            op,
            State.OBSERVING,
            actor="w",
            cause="observing",
            now=clock.now(),
            changes={"remote_job_id": "job-1"},
            through=[Step(State.ACCEPTED, "create_confirmed_job", {"job_id": "job-1"})],
        )
    assert (after.state, after.version, after.remote_job_id) == (
        "observing",
        op.version + 1,
        "job-1",
    )
    moves = [(h["from_state"], h["to_state"], h["cause"]) for h in _history(db, op.id)[1:]]
    assert moves == [
        ("create_pending", "accepted", "create_confirmed_job"),
        ("accepted", "observing", "observing"),
    ]
    assert verify(db, None).fault is None
    with db.read() as conn:
        stored = load_operation(conn, op.id)
    assert (stored.state, stored.version, stored.history_head) == (
        after.state,
        after.version,
        after.history_head,
    )


def test_a_move_through_a_state_the_table_forbids_writes_nothing(
    db: Database, clock: ManualClock
) -> None:
    journal = Journal()
    op = insert_operation(db, journal, clock.now())
    with pytest.raises(IllegalTransition), db.write() as conn:
        journal.transition(
            conn,
            op,
            State.OBSERVING,
            actor="w",
            cause="c",
            now=clock.now(),
            through=[Step(State.RESULT_COLLECTING, "c")],
        )
    with db.read() as conn:
        assert load_operation(conn, op.id).version == op.version
    assert len(_history(db, op.id)) == 1


def test_many_rows_are_written_at_once_or_not_at_all(
    db: Database, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``write_many`` (a webhook batch's hints): each row its own values and history, in
    one UPDATE on PostgreSQL; one row changed meanwhile refuses the batch."""
    journal = Journal()
    ops = [insert_operation(db, journal, clock.now()) for _ in range(3)]
    clock.advance(1)
    due = [clock.now() + timedelta(seconds=i) for i in range(3)]

    def items(
        of: list[OperationRecord],
    ) -> list[tuple[OperationRecord, dict[str, object], list[Entry]]]:
        note = Entry(kind=HistoryKind.HINT, actor="provider:sim", cause="webhook:e")
        return [
            (op, {"next_poll_at": at, "completion_pending": False}, [note])
            for op, at in zip(of, due, strict=True)
        ]

    with recording(monkeypatch) as ran, db.write() as conn:
        journal.write_many(conn, items(ops), now=clock.now())
    [update] = [sql for sql, _ in ran if sql.startswith("UPDATE operations")]
    assert ("FROM (VALUES" in update) is not db.sqlite  # SQLite: one executemany
    with db.read() as conn:
        after = [load_operation(conn, op.id) for op in ops]
    assert [op.next_poll_at for op in after] == due
    assert [op.version for op in after] == [op.version + 1 for op in ops]
    assert all(len(_history(db, op.id)) == 2 for op in ops)
    assert verify(db, None).fault is None
    # The first two as read now, the third as it was: the batch is refused whole.
    with pytest.raises(StaleWrite), db.write() as conn:
        journal.write_many(conn, items([*after[:2], ops[2]]), now=clock.now())
    with db.read() as conn:
        assert [load_operation(conn, op.id).version for op in ops] == [a.version for a in after]


def test_stale_version_is_refused(db: Database, clock: ManualClock) -> None:
    journal = Journal()
    op = insert_operation(db, journal, clock.now())
    with db.write() as conn:
        journal.transition(conn, op, State.ACCEPTED, actor="a", cause="c", now=clock.now())
    with pytest.raises(StaleWrite), db.write() as conn:
        journal.transition(conn, op, State.FAILED, actor="b", cause="c", now=clock.now())
    assert [h["to_state"] for h in _history(db, op.id)] == ["create_pending", "accepted"]


@pytest.mark.parametrize("entries", [0, 2], ids=["no-entries", "two-entries"])
def test_what_comes_also_is_written_with_the_row_or_not_at_all(
    db: Database, clock: ManualClock, entries: int
) -> None:
    """``also`` (a completion step's record) is written with the row's change, on
    PostgreSQL in its statement; a lost race leaves none of it once its write is undone."""
    journal = Journal()
    op = insert_operation(db, journal, clock.now())
    [row] = _ensured(db, op)
    notes = [Entry(kind=HistoryKind.NOTE, actor="a", cause=f"n{i}") for i in range(entries)]
    with db.write() as conn:
        after = journal.write(
            conn, op, now=clock.now(), entries=notes, also=(steps.running(op, row, clock.now()),)
        )
    assert _ensured(db, op)[0].status is steps.StepStatus.RUNNING
    assert len(_history(db, op.id)) == 1 + entries
    with pytest.raises(StaleWrite), db.write() as conn:  # ``op`` is an old version now
        journal.write(
            conn, op, now=clock.now(), entries=notes, also=(steps.done(op, "s", clock.now()),)
        )
    assert _ensured(db, op)[0].status is steps.StepStatus.RUNNING
    assert len(_history(db, op.id)) == 1 + entries
    with db.read() as conn:
        assert load_operation(conn, op.id).version == after.version


def _ensured(db: Database, op: OperationRecord) -> list[steps.StepRow]:
    with db.write() as conn:
        return steps.ensure_all(conn, op, ["s"]).rows


def test_lease_guard_refuses_an_expired_or_foreign_lease(db: Database, clock: ManualClock) -> None:
    journal = Journal()
    op = insert_operation(db, journal, clock.now())
    with db.write() as conn:
        op = journal.write(
            conn,
            op,
            now=clock.now(),
            changes={"lease_owner": "w1", "lease_expires_at": clock.now() + timedelta(seconds=30)},
        )
    with pytest.raises(StaleWrite, match="lease"), db.write() as conn:
        journal.transition(
            conn, op, State.ACCEPTED, actor="w2", cause="c", now=clock.now(), lease=Lease("w2")
        )
    clock.advance(31)
    with pytest.raises(StaleWrite), db.write() as conn:
        journal.transition(
            conn, op, State.ACCEPTED, actor="w1", cause="c", now=clock.now(), lease=Lease("w1")
        )
    clock.advance(-31)
    with db.write() as conn:
        journal.transition(
            conn, op, State.ACCEPTED, actor="w1", cause="c", now=clock.now(), lease=Lease("w1")
        )


def test_two_threads_racing_on_one_operation_one_wins(db: Database, clock: ManualClock) -> None:
    journal = Journal()
    op = insert_operation(db, journal, clock.now())
    barrier = threading.Barrier(2)
    outcomes: list[str] = []
    lock = threading.Lock()

    def attempt(to: State) -> None:
        barrier.wait()
        try:
            with db.write() as conn:
                journal.transition(conn, op, to, actor=f"t-{to}", cause="race", now=clock.now())
            result = "won"
        except StaleWrite:
            result = "lost"
        with lock:
            outcomes.append(result)

    threads = [
        threading.Thread(target=attempt, args=(State.ACCEPTED,)),
        threading.Thread(target=attempt, args=(State.CREATE_UNKNOWN,)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(outcomes) == ["lost", "won"]
    transitions = [h for h in _history(db, op.id) if h["kind"] == HistoryKind.TRANSITION]
    assert len(transitions) == 2  # the creation entry and exactly one winner


@pytest.mark.postgres
def test_two_postgres_connections_racing_one_wins(
    db: Database, clock: ManualClock, backend: str
) -> None:
    if backend != "postgres":
        pytest.skip("PostgreSQL-specific interleaving")
    journal = Journal()
    op = insert_operation(db, journal, clock.now())
    conn_a = db.engine.connect()
    conn_b = db.engine.connect()
    try:
        tx_a = conn_a.begin()
        journal.transition(conn_a, op, State.ACCEPTED, actor="a", cause="c", now=clock.now())
        # B blocks on A's row lock inside the UPDATE; release it by committing A from a thread.
        timer = threading.Timer(0.3, tx_a.commit)
        timer.start()
        tx_b = conn_b.begin()
        with pytest.raises(StaleWrite):
            journal.transition(conn_b, op, State.FAILED, actor="b", cause="c", now=clock.now())
        tx_b.rollback()
        timer.join()
    finally:
        conn_a.close()
        conn_b.close()
    assert [h["to_state"] for h in _history(db, op.id)] == ["create_pending", "accepted"]


# A random walk of attempted transitions: the table decides which succeed, and the
# history always replays to the state the row holds.
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.sampled_from(list(State)), min_size=1, max_size=12))
def test_random_attempts_replay_to_current_state(db: Database, attempts: list[State]) -> None:
    clock = ManualClock()
    journal = Journal()
    op = insert_operation(db, journal, clock.now())
    for to in attempts:
        clock.advance(1)
        try:
            with db.write() as conn:
                op = journal.transition(conn, op, to, actor="h", cause="walk", now=clock.now())
        except IllegalTransition:
            assert to not in TRANSITIONS[State(op.state)]
        else:
            assert op.state == to.value
    history = _history(db, op.id)
    replay: State | None = None
    for entry in history:
        if entry["kind"] != HistoryKind.TRANSITION:
            continue
        if replay is not None:
            assert entry["from_state"] == replay.value
            assert State(str(entry["to_state"])) in TRANSITIONS[replay]
        replay = State(str(entry["to_state"]))
    assert replay is not None and replay.value == op.state
    with db.read() as conn:
        assert load_operation(conn, op.id).state == op.state
