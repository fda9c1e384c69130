"""A step that fails in a way nothing foresaw: counted, backed off, then a person.

The provider's adapter here has a defect (its status read, or its result fetch, raises
after the provider answered): the worker counts each failure on the operation with
the moment of the next try, never tries again before it, and at the fifth failure in a
row escalates ``internal_error`` naming the step and the exception's type, never its
message. A step that finishes clears the count; an operator's ``retry`` runs the step
again with a fresh count. Each test runs on SQLite and PostgreSQL.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from reconciler.core.errors import StorageUnavailable
from reconciler.core.provider_calls import CallResult
from reconciler.core.records import OperationRecord
from reconciler.core.step_retry import StepRetryPolicy
from reconciler.engine.context import StepContext
from reconciler.providers.adapter import StatusOutcome, Subject
from reconciler.providers.http_adapter import HttpAdapter
from tests.support.steps import StepRig, step_rig

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

SECRET = "sk-live-never-in-a-record"
ATTEMPTS = StepRetryPolicy().max_attempts


class DefectiveAdapter(HttpAdapter):
    """The sim's adapter, with a defect that can be switched on per call."""

    fail_status = False
    fail_result = False

    async def status(self, subject: Subject) -> StatusOutcome:
        outcome = await super().status(subject)
        if self.fail_status:
            raise RuntimeError(f"cannot read the answer (token={SECRET})")
        return outcome

    async def fetch_result(self, subject: Subject, result_ref: str | None) -> CallResult:
        if self.fail_result:
            raise ValueError(f"http://user:{SECRET}@127.0.0.2/x")
        return await super().fetch_result(subject, result_ref)


def defective(rig: StepRig) -> DefectiveAdapter:
    rt = rig.runtime
    adapter = DefectiveAdapter(
        rt.providers["sim"], rt.environ, httpx.MockTransport(rig.provider.handle), clock=rig.clock
    )
    rt.adapters["sim"] = adapter
    return adapter


async def observing(rig: StepRig) -> tuple[str, str]:
    op_id = rig.submit()
    op = await rig.step(op_id)
    assert op.state == "observing" and op.remote_job_id is not None
    return op_id, op.remote_job_id


async def fail_once(rig: StepRig, op_id: str) -> OperationRecord:
    """Move to the moment the operation is due, and let a worker tick run its step."""
    rig.advance_to_due(op_id)
    assert await rig.tick() == 1
    return rig.row(op_id)


def notes(rig: StepRig, op_id: str) -> list[dict[str, Any]]:
    return [e.detail for e in rig.history(op_id) if e.cause == "step_failed" and e.detail]


async def test_a_failing_status_read_backs_off_then_escalates_internal_error(
    tmp_path: Path, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with step_rig(tmp_path, db_url) as rig:
        adapter = defective(rig)
        op_id, job_id = await observing(rig)
        adapter.fail_status = True
        waits = []
        for attempt in range(1, ATTEMPTS):
            before = rig.clock.now()
            op = await fail_once(rig, op_id)
            assert (op.state, op.step_failures, op.failed_step) == (
                "observing",
                attempt,
                "status_read",
            )
            assert op.lease_owner is None and op.delay_source == "step_retry"
            assert op.next_poll_at is not None
            waits.append((op.next_poll_at - before).total_seconds())
            # Nothing runs before the chosen moment: a tick just before it claims nothing.
            rig.clock.set(op.next_poll_at - timedelta(milliseconds=1))
            assert await rig.tick() == 0
        # About a second, doubling (a jitter floor of one half): never at once.
        assert [0.5 * 2**i <= w <= 2**i for i, w in enumerate(waits)] == [True] * len(waits)

        op = await fail_once(rig, op_id)
        assert op.state == "escalated" and op.step_failures == ATTEMPTS
        view = rig.view(op_id)
        escalation = view["escalation"]
        assert escalation["reason"] == "internal_error"
        assert [o["action"] for o in escalation["options"]] == ["retry", "cancel", "abandon"]
        assert "status read step failed 5 times" in escalation["message"]
        assert "RuntimeError" in escalation["message"]
        # One status request per failure, each sent at its time: no loop.
        assert len(rig.provider.sent("status", job_id)) == ATTEMPTS
        assert [n["attempt"] for n in notes(rig, op_id)] == list(range(1, ATTEMPTS + 1))
        everything = repr([e.detail for e in rig.history(op_id)]) + str(view)
        assert SECRET not in everything and "cannot read the answer" not in everything

        # The log: the traceback of the first failure, a line for each further one, and
        # the escalation said once.
        failed = [r for r in caplog.records if "status read step failed" in r.getMessage()]
        tracebacks = [getattr(r, "exc", "") for r in failed]
        assert ["Traceback" in t for t in tracebacks] == [True] + [False] * (ATTEMPTS - 1)
        assert "RuntimeError (its message is not logged)" in tracebacks[0]
        assert "in status" in tracebacks[0]  # the frame that raised
        logged = caplog.text + "".join(tracebacks)
        assert SECRET not in logged  # the source line of the raise is shown, not its value
        said = [r for r in caplog.records if r.getMessage().endswith("escalated: internal_error")]
        assert len(said) == 1


async def test_a_read_that_succeeds_clears_the_count(tmp_path: Path, db_url: str) -> None:
    async with step_rig(tmp_path, db_url) as rig:
        adapter = defective(rig)
        op_id, _ = await observing(rig)
        adapter.fail_status = True
        for _ in range(ATTEMPTS - 1):
            await fail_once(rig, op_id)
        adapter.fail_status = False
        op = await fail_once(rig, op_id)
        assert (op.state, op.step_failures, op.failed_step) == ("observing", 0, None)
        adapter.fail_status = True
        op = await fail_once(rig, op_id)
        assert op.step_failures == 1 and op.state == "observing"  # a new burst


async def test_retry_runs_the_failed_step_again_with_a_fresh_count(
    tmp_path: Path, db_url: str
) -> None:
    async with step_rig(tmp_path, db_url) as rig:
        adapter = defective(rig)
        op_id, job_id = await observing(rig)
        rig.provider.finish(job_id)
        adapter.fail_result = True
        op = await fail_once(rig, op_id)  # the read confirms success; the fetch raises
        assert (op.state, op.failed_step, op.step_failures) == (
            "result_collecting",
            "result_collection",
            1,
        )
        for _ in range(ATTEMPTS - 1):
            op = await fail_once(rig, op_id)
        assert op.state == "escalated"
        escalation = rig.view(op_id)["escalation"]
        # The provider reported the end: there is nothing left to cancel.
        assert [o["action"] for o in escalation["options"]] == ["retry", "abandon"]
        assert "ValueError" in escalation["message"] and SECRET not in escalation["message"]

        op = rig.decide(op_id, {"action": "retry"})
        assert (op.state, op.step_failures, op.failed_step) == ("result_collecting", 0, None)
        assert op.deadline_at == rig.row(op_id).deadline_at
        op = await fail_once(rig, op_id)
        assert (op.state, op.step_failures) == ("result_collecting", 1)  # counted afresh

        adapter.fail_result = False
        op = await rig.run(op_id, ["succeeded"])
        assert op.step_failures == 0 and op.failed_step is None
        kinds = [(e.kind, e.cause) for e in rig.history(op_id) if e.kind != "transition"]
        assert kinds.count(("decision", "decision:retry")) == 1
        assert kinds.count(("escalation", "escalation:internal_error")) == 1


async def test_abandon_after_internal_error_ends_the_operation_failed(
    tmp_path: Path, db_url: str
) -> None:
    async with step_rig(tmp_path, db_url) as rig:
        adapter = defective(rig)
        op_id, _ = await observing(rig)
        adapter.fail_status = True
        for _ in range(ATTEMPTS):
            await fail_once(rig, op_id)
        op = rig.decide(op_id, {"action": "abandon"})
        assert op.state == "failed"
        assert op.error == {
            "code": "abandoned_internal_error",
            "message": "an operator abandoned the operation after internal_error",
        }


async def test_a_completion_that_keeps_failing_stops_and_waits_for_a_decision(
    tmp_path: Path, db_url: str
) -> None:
    async with step_rig(tmp_path, db_url) as rig:
        op_id, job_id = await observing(rig)
        rig.provider.finish(job_id)
        steps = rig.worker.steps

        async def broken(op: OperationRecord, prep: Any = None) -> None:
            raise KeyError("a defect in the completion")

        rig.worker.steps = replace(steps, completion=broken)
        op = await fail_once(rig, op_id)  # read, collect, and the completion raises
        assert (op.state, op.failed_step, op.step_failures) == ("succeeded", "completion", 1)
        for _ in range(ATTEMPTS - 1):
            op = await fail_once(rig, op_id)
        assert (op.state, op.next_poll_at, op.completion_pending) == ("succeeded", None, True)
        view = rig.view(op_id)
        assert view["escalation"]["reason"] == "internal_error" and view["done"] is True
        assert [o["action"] for o in view["escalation"]["options"]] == ["retry", "abandon"]
        assert "completion step failed" in view["escalation"]["message"]

        rig.worker.steps = steps
        op = rig.decide(op_id, {"action": "retry"})
        assert op.next_poll_at is not None and op.step_failures == 0
        op = await rig.run(op_id, ["succeeded"])
        assert not op.completion_pending


async def test_our_own_outage_is_not_counted(tmp_path: Path, db_url: str) -> None:
    async with step_rig(tmp_path, db_url) as rig:
        op_id, _ = await observing(rig)

        async def outage(op: OperationRecord, prep: Any = None) -> None:
            raise StorageUnavailable("the database is unavailable; retry later")

        rig.worker.steps = replace(
            rig.worker.steps, table=dict.fromkeys(rig.worker.steps.table, outage)
        )
        op = await fail_once(rig, op_id)
        assert op.step_failures == 0 and op.failed_step is None


async def test_a_failure_that_cannot_be_recorded_keeps_the_lease_until_it_runs_out(
    tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with step_rig(tmp_path, db_url) as rig:
        adapter = defective(rig)
        op_id, _ = await observing(rig)
        adapter.fail_status = True

        async def refused(self: StepContext, op: OperationRecord, build: Any) -> OperationRecord:
            raise sa.exc.DataError("UPDATE ...", {}, Exception("the value cannot be stored"))

        monkeypatch.setattr(StepContext, "record_failure", refused)
        op = await fail_once(rig, op_id)
        assert op.step_failures == 0
        assert op.lease_owner == rig.runtime.worker_id  # held: nobody runs it again at once
        assert await rig.tick() == 0
        assert op.lease_expires_at is not None
        rig.clock.set(op.lease_expires_at + timedelta(seconds=1))
        monkeypatch.undo()
        assert await rig.tick() == 1
        assert rig.row(op_id).step_failures == 1
