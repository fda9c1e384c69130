"""The create step: one job per idempotency token, whatever happens to the create call.

The provider is in-process (``FakeProvider``): a test makes the create answer get
lost after the job was made, makes the provider refuse, or makes its lookup lag, and
then counts the jobs and requests it received per token.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from reconciler.storage.tables import OPS, PAYLOAD_TABLE
from reconciler.storage.webhook_events import IncomingEvent, Outcome, write_batch
from tests.support.provider_mock import answer, error, refused
from tests.support.statements import recording
from tests.support.steps import StepRig, step_rig

pytestmark = pytest.mark.anyio

# A timeout after the request went out, a reset mid-answer, and a 500 after the job was
# made: the job exists, the answer that names it is lost.
LOST_ANSWERS: dict[str, Any] = {
    "timeout": httpx.ReadTimeout("timed out"),
    "reset": httpx.RemoteProtocolError("peer closed connection without sending complete message"),
    "500_after_create": None,
}


def lose_the_answer(rig: StepRig, fault: str) -> None:
    exc = LOST_ANSWERS[fault]
    if exc is not None:
        rig.provider.script("create", rig.provider.made_then(exc))
        return

    def made_then_500(request: httpx.Request) -> httpx.Response:
        rig.provider.usual(request)
        return error(500)

    rig.provider.script("create", made_then_500)


def transitions(rig: StepRig, op_id: str) -> list[tuple[str | None, str | None]]:
    return [(e.from_state, e.to_state) for e in rig.history(op_id) if e.kind == "transition"]


def accepted(rig: StepRig, op_id: str) -> dict[str, Any]:
    [entry] = [e for e in rig.history(op_id) if e.to_state == "accepted"]
    assert entry.detail is not None
    return entry.detail


async def test_a_create_sends_the_stored_token_and_starts_observing(
    tmp_path: Path, db_url: str
) -> None:
    async with step_rig(tmp_path, db_url) as rig:
        op_id = rig.submit({"report": "q3"})
        stored = rig.row(op_id)
        op = await rig.step(op_id)
        assert op.state == "observing" and op.remote_job_id == "job-1"
        [sent] = rig.provider.sent("create")
        assert sent.headers["idempotency-key"] == stored.idempotency_token
        assert sent.headers["x-trace-id"] == stored.trace_id
        assert sent.headers["authorization"] == "Bearer sim-token-for-tests"
        assert sent.body == b'{"report":"q3"}'
        assert op.create_attempts == 1 and op.accepted_at == rig.clock.now()
        assert op.next_poll_at is not None and op.next_poll_at > rig.clock.now()
        assert transitions(rig, op_id) == [
            (None, "create_pending"),
            ("create_pending", "accepted"),
            ("accepted", "observing"),
        ]
        assert accepted(rig, op_id)["via"] == "create"


@pytest.mark.parametrize("fault", sorted(LOST_ANSWERS))
async def test_a_lost_create_answer_is_reconciled_by_lookup_to_one_job(
    tmp_path: Path, db_url: str, fault: str
) -> None:
    async with step_rig(tmp_path, db_url) as rig:
        op_id = rig.submit()
        token = rig.row(op_id).idempotency_token
        lose_the_answer(rig, fault)
        op = await rig.step(op_id)
        assert op.state == "create_unknown" and op.remote_job_id is None
        view = rig.view(op_id)
        assert view["done"] is False and "do not resubmit" in view["message"]

        rig.advance_to_due(op_id)
        op = await rig.step(op_id)
        assert op.state == "observing"
        assert list(rig.provider.by_key) == [token]
        assert op.remote_job_id == rig.provider.by_key[token]
        assert len(rig.provider.sent("create")) == 1  # no second create
        assert len(rig.provider.sent("lookup")) == 1
        assert ("create_pending", "create_unknown") in transitions(rig, op_id)
        assert ("create_unknown", "accepted") in transitions(rig, op_id)
        assert accepted(rig, op_id)["via"] == "lookup"


@pytest.mark.parametrize("fault", sorted(LOST_ANSWERS))
async def test_without_a_lookup_the_same_token_is_resent_and_answered_with_the_job(
    tmp_path: Path, db_url: str, fault: str
) -> None:
    async with step_rig(tmp_path, db_url, drop=("lookup",)) as rig:
        assert rig.runtime.providers["sim"].lookup is None
        op_id = rig.submit()
        lose_the_answer(rig, fault)
        assert (await rig.step(op_id)).state == "create_unknown"
        rig.advance_to_due(op_id)
        op = await rig.step(op_id)
        assert op.state == "observing" and op.create_attempts == 2
        creates = rig.provider.sent("create")
        assert len(creates) == 2
        assert {c.headers["idempotency-key"] for c in creates} == {rig.row(op_id).idempotency_token}
        assert list(rig.provider.jobs) == [op.remote_job_id]
        assert rig.provider.sent("lookup") == []
        assert accepted(rig, op_id)["via"] == "create"


async def test_a_create_that_never_arrived_is_resent_without_ambiguity(
    tmp_path: Path, db_url: str
) -> None:
    """A refused connection proves the provider got nothing: not ``create_unknown``."""
    async with step_rig(tmp_path, db_url) as rig:
        op_id = rig.submit()
        rig.provider.script("create", refused())
        op = await rig.step(op_id)
        assert op.state == "create_pending" and op.create_attempts == 1
        rig.advance_to_due(op_id)
        op = await rig.step(op_id)
        # An attempt is on record, so the provider is asked before resending, and the
        # resend's job id is checked against the token's.
        endpoints = [r.endpoint for r in rig.provider.requests]
        assert endpoints == ["create", "lookup", "create", "lookup"]
        assert op.state == "observing" and len(rig.provider.jobs) == 1
        seen = [e for e in rig.history(op_id) if e.cause == "lookup_response"]
        assert seen[0].detail is not None and seen[0].detail["decision"] == "resend"


@pytest.mark.parametrize("status", [400, 401, 403, 422])
async def test_a_definitive_rejection_fails_with_the_provider_error_kept(
    tmp_path: Path, db_url: str, status: int
) -> None:
    refusal = {"error": {"code": "no", "message": "this account may not create such jobs"}}
    async with step_rig(tmp_path, db_url) as rig:
        op_id = rig.submit()
        rig.provider.script("create", answer(status, refusal))
        op = await rig.step(op_id)
        view = rig.view(op_id)
        assert op.state == "failed" and view["done"] is True and op.remote_job_id is None
        assert view["error"]["http_status"] == status
        assert view["error"]["detail"]["provider_error"] == refusal
        assert view["error"]["provider_message"] == "this account may not create such jobs"
        if status in (401, 403):  # the service's credential: not the agent's to fix
            assert view["error"]["code"] == "authorization_denied"
            assert "REFUSED this service's credentials" in view["message"]
        else:  # the request: nothing ran, fix it and start again with a new key
            assert view["error"]["code"] == "request_rejected"
            assert view["message"].startswith("The provider REFUSED the request")
            assert "NEW `idempotency_key`" in view["message"]
        assert transitions(rig, op_id)[-1] == ("create_pending", "failed")
        assert op.completion_pending  # what is left is the completion handler
        await rig.run(op_id, ["failed"])
        assert [r.endpoint for r in rig.provider.requests] == ["create"]


@pytest.mark.parametrize("status", [409, 429, 503])
async def test_a_retryable_answer_waits_for_retry_after_and_sends_again(
    tmp_path: Path, db_url: str, status: int
) -> None:
    async with step_rig(tmp_path, db_url) as rig:
        op_id = rig.submit()
        rig.provider.script("create", error(status, {"Retry-After": "30"}))
        now = rig.clock.now()
        op = await rig.step(op_id)
        assert op.state in ("create_pending", "create_unknown")
        assert op.next_poll_at == now + timedelta(seconds=30)
        assert op.delay_source == "provider_retry_after"
        rig.advance_to_due(op_id)
        assert (await rig.step(op_id)).state == "observing"
        assert len(rig.provider.jobs) == 1


async def test_the_create_deadline_stops_reconciling_and_asks_a_person(
    tmp_path: Path, db_url: str
) -> None:
    async with step_rig(tmp_path, db_url) as rig:
        op_id = rig.submit()
        deadline = rig.row(op_id).create_deadline_at
        rig.provider.script("create", *[error(503)] * 50)
        op = await rig.run(op_id, ["escalated"])
        assert rig.view(op_id)["escalation"]["reason"] == "provider_failure"
        assert "create deadline" in rig.view(op_id)["escalation"]["message"]
        late = [r for r in rig.provider.requests if r.at >= deadline]
        # Every create went out in the window; after it, one lookup looked before escalating.
        assert [r.endpoint for r in late] == ["lookup"]
        assert rig.clock.now() >= deadline
        assert op.remote_job_id is None


async def test_a_second_job_for_the_same_token_is_a_contract_violation(
    tmp_path: Path, db_url: str
) -> None:
    """The resend and the lookup name different jobs; neither id is chosen."""
    async with step_rig(tmp_path, db_url) as rig:
        op_id = rig.submit()
        provider = rig.provider
        provider.script("create", provider.made_then(httpx.ReadTimeout("lost")))
        assert (await rig.step(op_id)).state == "create_unknown"
        # The lookup index lags: job 1 is not found, so the token is sent again, and this
        # provider ignores the key and makes job 2; the confirming lookup then finds job 1.
        first = provider.jobs["job-1"]
        provider.by_key.clear()

        def second_job(request: httpx.Request) -> httpx.Response:
            provider.by_key.clear()
            job = provider.make_job(None)
            provider.by_key[first.key or ""] = first.id
            return answer(202, {"job_id": job.id, "state": "queued"})

        provider.script("create", second_job)
        rig.advance_to_due(op_id)
        op = await rig.step(op_id)
        assert op.state == "escalated" and op.remote_job_id is None
        assert rig.view(op_id)["escalation"]["reason"] == "contract_violation"
        seen = [
            (e.cause, (e.detail or {}).get("job_id"))
            for e in rig.history(op_id)
            if e.kind == "observation"
        ]
        assert seen == [
            ("create_response", None),
            ("lookup_response", None),
            ("create_response", "job-2"),
            ("lookup_response", "job-1"),
        ]
        assert transitions(rig, op_id)[-1] == ("create_unknown", "escalated")
        assert not any(to in ("accepted", "observing") for _, to in transitions(rig, op_id))


async def test_a_cancel_before_the_job_id_is_held_and_applied_on_acceptance(
    tmp_path: Path, db_url: str
) -> None:
    async with step_rig(tmp_path, db_url) as rig:
        op_id = rig.submit()

        def cancel_while_creating(request: httpx.Request) -> httpx.Response:
            held = rig.cancel(op_id, "not needed")
            assert held.state == "create_pending" and held.cancel_requested_at is not None
            return rig.provider.usual(request)

        rig.provider.script("create", cancel_while_creating)
        op = await rig.step(op_id)
        assert op.state == "cancel_requested"
        applied = [e for e in rig.history(op_id) if e.cause == "held_cancel_applied"]
        assert [(e.from_state, e.to_state) for e in applied] == [("accepted", "cancel_requested")]
        held = [e for e in rig.history(op_id) if e.kind == "note"]
        assert any("held" in (e.detail or {}).get("note", "") for e in held)
        op = await rig.run(op_id, ["cancelling"])
        rig.provider.finish(op.remote_job_id or "", "cancelled")
        await rig.run(op_id, ["cancelled"])
        assert [r.endpoint for r in rig.provider.requests].count("create") == 1
        assert [r.endpoint for r in rig.provider.requests].count("cancel") == 1


async def test_a_cancel_before_anything_was_sent_ends_cancelled_without_a_call(
    tmp_path: Path, db_url: str
) -> None:
    async with step_rig(tmp_path, db_url) as rig:
        op_id = rig.submit()
        op = rig.cancel(op_id)
        assert op.state == "cancelled" and op.remote_job_id is None
        await rig.run(op_id, ["cancelled"])
        assert rig.provider.requests == []
        assert "completion_finished" in rig.causes(op_id)


@pytest.mark.both_backends
async def test_the_accept_attaches_orphans_in_its_write_and_hints_only_with_some(
    tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The write that accepts the job attaches the events that came for it before its id
    was known, in its own statement on PostgreSQL; with none, nothing is read after it.
    With one, the same transaction makes it the hint and the first read due at once."""
    async with step_rig(tmp_path, db_url) as rig:
        op_id = rig.submit({"report": "q3"})
        with recording(monkeypatch) as ran:
            op = await rig.step(op_id)
        assert op.state == "observing" and op.next_poll_at is not None
        assert op.next_poll_at > rig.clock.now()  # no orphan: the first read waits
        attach = [sql for sql, _ in ran if "UPDATE webhook_events" in sql]
        assert len(attach) == 1
        assert ("UPDATE operations" in attach[0]) is not rig.runtime.db.sqlite
        assert not [sql for sql, _ in ran if sql.startswith("SELECT event_id")]

        other = rig.submit({"report": "q4"})
        event = IncomingEvent(
            provider="sim",
            event_id="evt_early",
            remote_job_id="job-2",
            body_sha256="0" * 64,
            body="{}",
            received_at=rig.clock.now(),
        )
        with rig.runtime.db.write() as conn:
            assert write_batch(conn, rig.runtime.journal, [event], rig.clock.now()) == [
                Outcome.ORPHAN
            ]
        op = await rig.step(other)
        assert op.remote_job_id == "job-2" and op.next_poll_at == rig.clock.now()
        hints = [e for e in rig.history(other) if e.kind == "hint"]
        assert [h.cause for h in hints] == ["webhook:evt_early"]
        assert rig.history(other)[-1] == hints[0]


@pytest.mark.both_backends
async def test_a_claims_counts_go_out_in_one_statement_and_each_create_is_sent_once(
    tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim counts every claimed create before it is sent; on PostgreSQL those counts
    are one statement for them all (each row still guarded by its version), not one each."""
    async with step_rig(tmp_path, db_url) as rig:
        ids = [rig.submit({"report": f"q{n}"}) for n in range(3)]
        with recording(monkeypatch) as ran:
            assert await rig.tick() == 3
        counts = [sql for sql, _ in ran if sql.startswith("UPDATE operations SET create_attempts")]
        together = [sql for sql in counts if "FROM (VALUES" in sql]
        if rig.runtime.db.sqlite:
            assert (len(counts), len(together)) == (3, 0)
        else:
            assert (len(counts), len(together)) == (1, 1)
        for op_id in ids:
            op = rig.row(op_id)
            assert op.state == "observing" and op.create_attempts == 1
        assert len(rig.provider.sent("create")) == 3


@pytest.mark.both_backends
async def test_a_keyed_create_checks_its_key_in_its_insert_and_a_retry_gets_the_first(
    tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On PostgreSQL a create with an idempotency key is one statement: the insert is made
    only while the key is free, so no lookup runs before it. A retry of the key writes
    nothing (no second row, entry or part) and gets the first operation back; SQLite looks
    the key up first, as it always did."""
    async with step_rig(tmp_path, db_url) as rig:
        with recording(monkeypatch) as ran:
            first = rig.submit({"report": "q3"}, idempotency_key="k-1")
        lookups, tries = _key_statements(ran)
        assert (lookups, tries) == ((1, 0) if rig.runtime.db.sqlite else (0, 1))

        with recording(monkeypatch) as ran:
            again = rig.submit({"report": "q3"}, idempotency_key="k-1")
        assert again == first
        lookups, tries = _key_statements(ran)
        assert (lookups, tries) == ((1, 0) if rig.runtime.db.sqlite else (1, 1))

        with rig.runtime.db.read() as conn:
            rows = conn.execute(sa.select(OPS.c.id).where(OPS.c.idempotency_key == "k-1")).all()
            parts = conn.execute(sa.select(sa.func.count()).select_from(PAYLOAD_TABLE)).scalar()
        assert [r.id for r in rows] == [first]
        assert [e.cause for e in rig.history(first)] == ["agent_request:create"]
        assert parts == 1  # the request, once


def _key_statements(ran: list[tuple[str, Any]]) -> tuple[int, int]:
    """(key lookups, inserts that check the key themselves) among the statements run."""
    lookups = [sql for sql, _ in ran if sql.startswith("SELECT") and "idempotency_key =" in sql]
    tries = [sql for sql, _ in ran if "ON CONFLICT (caller, idempotency_key)" in sql]
    return len(lookups), len(tries)
