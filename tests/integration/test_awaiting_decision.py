"""An end that a decision may reopen is not done: the row says so, and the list filters on it.

Written through the real write paths (``escalate``, ``apply_decision``) on SQLite and
PostgreSQL, then read back by the list's SQL: ``done`` and ``awaiting_decision`` are
conditions of the statement, so a page is full whatever they leave out.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from reconciler.commands.decide import apply_decision
from reconciler.core.clock import ManualClock
from reconciler.core.escalation import UNKNOWN_PROVIDER
from reconciler.core.operator_decision import DecisionRequest
from reconciler.core.principal import Principal
from reconciler.core.records import OperationRecord
from reconciler.core.states import State, awaits_decision, is_done
from reconciler.core.vocabulary import DecisionAction, EscalationReason, Scope
from reconciler.storage import operations as store
from reconciler.storage.database import Database
from reconciler.storage.escalations import escalate
from reconciler.storage.journal import Journal
from reconciler.storage.operation_reads import view_of
from reconciler.storage.tables import OPS
from tests.support.factories import insert_operation

pytestmark = pytest.mark.both_backends

AGENT = Principal("agent-1", Scope.AGENT)


def _observing(db: Database, journal: Journal, clock: ManualClock) -> OperationRecord:
    op = insert_operation(db, journal, clock.now())
    with db.write() as conn:
        op = journal.transition(
            conn,
            op,
            State.ACCEPTED,
            actor="t",
            cause="t",
            now=clock.now(),
            changes={"remote_job_id": f"job_{op.id}"},
        )
        return journal.transition(conn, op, State.OBSERVING, actor="t", cause="t", now=clock.now())


def _escalated(
    db: Database, journal: Journal, clock: ManualClock, reason: EscalationReason
) -> OperationRecord:
    op = _observing(db, journal, clock)
    with db.write() as conn:
        if reason is EscalationReason.CANCELLATION_UNCONFIRMED:
            for state in (State.CANCEL_REQUESTED, State.CANCELLING):
                op = journal.transition(conn, op, state, actor="t", cause="t", now=clock.now())
        return escalate(
            conn, journal, op, UNKNOWN_PROVIDER, reason, "test", now=clock.now(), actor="t"
        )


def _ended(db: Database, journal: Journal, clock: ManualClock, state: State) -> OperationRecord:
    op = _observing(db, journal, clock)
    with db.write() as conn:
        if state is State.FAILED:
            return journal.transition(conn, op, state, actor="t", cause="t", now=clock.now())
        op = journal.transition(
            conn, op, State.RESULT_COLLECTING, actor="t", cause="t", now=clock.now()
        )
        return journal.transition(conn, op, state, actor="t", cause="t", now=clock.now())


def _decide(
    db: Database, journal: Journal, clock: ManualClock, op: OperationRecord, action: str
) -> OperationRecord:
    request = DecisionRequest(DecisionAction(action))
    with db.write() as conn:
        fresh = store.load_operation(conn, op.id)
        return apply_decision(conn, journal, fresh, request, "operator:ops", clock.now(), 120.0)


def _ids(db: Database, **filters: object) -> list[str]:
    with db.read() as conn:
        page = store.list_operations(
            conn, AGENT, state=None, provider=None, limit=50, cursor=None, **filters
        )
    return [op.id for op in page.items]


def test_done_and_awaiting_decision_are_conditions_on_the_row(
    db: Database, clock: ManualClock
) -> None:
    journal = Journal()
    running = _observing(db, journal, clock)
    succeeded = _ended(db, journal, clock, State.SUCCEEDED)
    failed = _ended(db, journal, clock, State.FAILED)
    timed_out = _escalated(db, journal, clock, EscalationReason.DEADLINE_EXCEEDED)
    unconfirmed = _escalated(db, journal, clock, EscalationReason.CANCELLATION_UNCONFIRMED)
    stuck = _escalated(db, journal, clock, EscalationReason.UNKNOWN_STATE)
    assert (timed_out.state, unconfirmed.state, stuck.state) == (
        "result_timed_out",
        "cancellation_unconfirmed",
        "escalated",
    )
    assert timed_out.escalation_open and unconfirmed.escalation_open and stuck.escalation_open

    awaiting = {timed_out.id, unconfirmed.id, stuck.id}
    assert set(_ids(db, done=False)) == awaiting | {running.id}
    assert set(_ids(db, done=True)) == {succeeded.id, failed.id}
    assert set(_ids(db, awaiting_decision=True)) == awaiting
    assert set(_ids(db, awaiting_decision=False)) == {running.id, succeeded.id, failed.id}
    with db.read() as conn:
        view = view_of(conn, store.load_operation(conn, timed_out.id), clock.now())
    assert (view["done"], view["awaiting_decision"]) == (False, True)
    assert timed_out.done_at is not None and view["done_at"] is None  # nothing reads as final

    # The decisions land: done follows the state each one leads to.
    _decide(db, journal, clock, timed_out, "abandon")
    _decide(db, journal, clock, unconfirmed, "abandon")
    extended = _decide(db, journal, clock, stuck, "extend")
    assert extended.state == "observing" and not extended.escalation_open
    assert set(_ids(db, awaiting_decision=True)) == set()
    assert set(_ids(db, done=True)) == {succeeded.id, failed.id, timed_out.id, unconfirmed.id}
    assert set(_ids(db, done=False)) == {running.id, stuck.id}
    with db.read() as conn:
        view = view_of(conn, store.load_operation(conn, timed_out.id), clock.now())
    assert (view["done"], view["awaiting_decision"]) == (True, False)
    assert view["error"]["code"] == "abandoned_deadline_exceeded"
    assert view["done_at"] is not None
    assert view["message"].startswith("An operator decided to stop waiting for the job (abandon)")


def test_an_undeliverable_callback_leaves_an_outcome_done(db: Database, clock: ManualClock) -> None:
    journal = Journal()
    op = _ended(db, journal, clock, State.SUCCEEDED)
    with db.write() as conn:
        op = escalate(
            conn,
            journal,
            op,
            UNKNOWN_PROVIDER,
            EscalationReason.CALLBACK_UNDELIVERABLE,
            "test",
            now=clock.now(),
            actor="t",
        )
    assert op.state == "succeeded" and op.escalation_open
    assert _ids(db, done=True) == [op.id] and _ids(db, awaiting_decision=True) == []


def test_a_page_of_the_not_done_is_full_however_many_done_lie_between(
    db: Database, clock: ManualClock
) -> None:
    """The filter is in the statement: a page of 3 holds 3 not-done operations even when
    the newest 20 are done (a filter applied after reading a page would return none)."""
    journal = Journal()
    waiting = [_escalated(db, journal, clock, EscalationReason.DEADLINE_EXCEEDED)]
    waiting += [_observing(db, journal, clock) for _ in range(3)]
    for _ in range(20):
        clock.advance(0.01)
        _ended(db, journal, clock, State.SUCCEEDED)
    with db.read() as conn:
        page = store.list_operations(
            conn, AGENT, state=None, provider=None, limit=3, cursor=None, done=False
        )
        rest = store.list_operations(
            conn, AGENT, state=None, provider=None, limit=3, cursor=page.next_cursor, done=False
        )
    assert len(page.items) == 3 and page.next_cursor is not None
    assert {op.id for op in page.items + rest.items} == {op.id for op in waiting}
    assert rest.next_cursor is None


def test_the_filters_are_the_rule_for_every_state(db: Database, clock: ManualClock) -> None:
    """The statement's conditions and ``core.states`` agree on all 32 (state, open) pairs."""
    journal = Journal()
    facts: dict[str, tuple[State, bool]] = {}
    for state in State:
        for is_open in (False, True):
            op = insert_operation(db, journal, clock.now())
            with db.write() as conn:
                conn.execute(
                    sa.update(OPS)
                    .where(OPS.c.id == op.id)
                    .values(state=state.value, escalation_open=is_open)
                )
            facts[op.id] = (state, is_open)
    done = {i for i, (s, o) in facts.items() if is_done(s, o)}
    waiting = {i for i, (s, o) in facts.items() if awaits_decision(s, o)}
    assert set(_ids(db, done=True)) == done
    assert set(_ids(db, done=False)) == set(facts) - done
    assert set(_ids(db, awaiting_decision=True)) == waiting
    assert set(_ids(db, awaiting_decision=False)) == set(facts) - waiting
    assert set(_ids(db, done=False, awaiting_decision=False)) == set(facts) - done - waiting
