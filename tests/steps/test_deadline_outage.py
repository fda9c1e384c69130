"""A deadline that passes during our own outage: one status read after recovery decides.

The provider finished before the deadline, but this service could not look (its
database refused every write, or it was not running). Before the fix the claim after
recovery timed the operation out at once (``deadline_exceeded``, no read). Now the
step makes one status read after recovery: an end it shows completes the operation
normally; anything else times out with the outage on record, never a plain timeout.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from reconciler.storage.availability import WriteFailure
from tests.support.provider_mock import answer, error
from tests.support.stack import QUICK_POLLING
from tests.support.steps import StepRig, step_rig

pytestmark = pytest.mark.anyio

PROVIDER = {"polling": {**QUICK_POLLING, "deadline_seconds": 20}}


async def observing(rig: StepRig) -> tuple[str, str]:
    op_id = rig.submit()
    op = await rig.step(op_id)
    assert op.state == "observing", rig.causes(op_id)
    assert op.remote_job_id is not None
    return op_id, op.remote_job_id


def reads_after_deadline(rig: StepRig, op_id: str, job_id: str) -> int:
    deadline = rig.row(op_id).deadline_at
    return len([r for r in rig.provider.sent("status", job_id) if r.at >= deadline])


def outage_notes(rig: StepRig, op_id: str) -> list[dict[str, Any]]:
    return [e.detail for e in rig.history(op_id) if e.cause == "storage_outage" and e.detail]


async def test_a_job_done_before_a_deadline_lost_to_our_outage_succeeds(
    tmp_path: Path, db_url: str
) -> None:
    async with step_rig(tmp_path, db_url, provider=PROVIDER) as rig:
        op_id, job_id = await observing(rig)
        deadline = rig.row(op_id).deadline_at
        rig.clock.set(deadline - timedelta(seconds=8))
        rig.provider.finish(job_id)  # done in time; its webhook and our read were lost
        rig.runtime.db.availability.failed(WriteFailure.UNREACHABLE)
        rig.clock.set(deadline + timedelta(seconds=2))  # back after the deadline
        op = await rig.run(op_id, ["succeeded"])
        assert op.escalation_id is None
        assert reads_after_deadline(rig, op_id, job_id) == 1
        notes = outage_notes(rig, op_id)
        assert len(notes) == 1 and notes[0]["recovery_look"] is True
        assert notes[0]["inferred"] is False  # this process saw its writes fail


async def test_a_job_still_running_times_out_with_the_outage_named(
    tmp_path: Path, db_url: str
) -> None:
    async with step_rig(tmp_path, db_url, provider=PROVIDER) as rig:
        op_id, job_id = await observing(rig)
        deadline = rig.row(op_id).deadline_at
        rig.provider.jobs[job_id].state = "running"
        rig.clock.set(deadline - timedelta(seconds=8))
        rig.runtime.db.availability.failed(WriteFailure.LOCKED)
        rig.clock.set(deadline + timedelta(seconds=2))
        op = await rig.step(op_id)
        assert op.state == "result_timed_out"
        assert reads_after_deadline(rig, op_id, job_id) == 1
        stop = [e for e in rig.history(op_id) if e.kind == "escalation"][-1]
        assert stop.detail["reason"] == "deadline_exceeded"
        assert "own storage outage" in stop.detail["detail"]
        assert "'running'" in stop.detail["detail"]
        assert outage_notes(rig, op_id)


async def test_a_deadline_passed_while_the_service_was_not_running_gets_the_look(
    tmp_path: Path, db_url: str
) -> None:
    """Nothing in memory after a restart: a claim far past its due time is the evidence."""
    async with step_rig(tmp_path, db_url, provider=PROVIDER) as rig:
        op_id, job_id = await observing(rig)
        deadline = rig.row(op_id).deadline_at
        rig.provider.finish(job_id)
        rig.clock.set(deadline + timedelta(seconds=30))
        op = await rig.run(op_id, ["succeeded"])
        assert op.escalation_id is None
        assert reads_after_deadline(rig, op_id, job_id) == 1
        notes = outage_notes(rig, op_id)
        assert len(notes) == 1 and notes[0]["inferred"] is True


async def test_a_deadline_reached_on_time_is_a_plain_timeout_without_a_read(
    tmp_path: Path, db_url: str
) -> None:
    """No outage: the wait ends at the deadline (Retry-After past it) and nothing is sent."""
    async with step_rig(tmp_path, db_url, provider=PROVIDER) as rig:
        op_id, job_id = await observing(rig)
        rig.provider.script("status", answer(503, None, {"Retry-After": "600"}))
        rig.advance_to_due(op_id)
        await rig.step(op_id)
        deadline = rig.row(op_id).deadline_at
        assert rig.row(op_id).next_poll_at == deadline
        rig.provider.finish(job_id)
        rig.advance_to_due(op_id)
        op = await rig.step(op_id)
        assert op.state == "result_timed_out"
        assert reads_after_deadline(rig, op_id, job_id) == 0
        assert not outage_notes(rig, op_id)


class Crash(Exception):
    pass


async def test_the_recovery_look_is_made_once_even_across_a_crash(
    tmp_path: Path, db_url: str
) -> None:
    """Killed after the look was charged: the next claim escalates, it does not look again."""
    async with step_rig(tmp_path, db_url, provider=PROVIDER) as rig:
        op_id, job_id = await observing(rig)
        deadline = rig.row(op_id).deadline_at
        rig.provider.finish(job_id)
        rig.clock.set(deadline + timedelta(seconds=30))
        call = rig.ctx.call

        async def crash(op: Any, name: str, fn: Callable[[], Any]) -> Any:
            raise Crash

        rig.ctx.call = crash  # type: ignore[method-assign]
        with pytest.raises(Crash):
            await rig.step(op_id)
        rig.ctx.call = call  # type: ignore[method-assign]
        used = rig.row(op_id).status_requests_used
        rig.clock.advance(1)
        rig.runtime.db.availability.succeeded(changed=True)
        op = await rig.run(op_id, ["result_timed_out"])
        assert op.status_requests_used == used
        assert reads_after_deadline(rig, op_id, job_id) == 0
        stop = [e for e in rig.history(op_id) if e.kind == "escalation"][-1]
        assert "no status read after recovery could settle it" in stop.detail["detail"]


async def test_a_retry_after_still_running_at_recovery_leaves_out_the_look(
    tmp_path: Path, db_url: str
) -> None:
    """The provider's last answer asked for no request until after the deadline, and our
    outage covered the deadline: the look after recovery would be that request, so the
    operation times out at once with the outage and the Retry-After on record."""
    async with step_rig(tmp_path, db_url, provider=PROVIDER) as rig:
        op_id, job_id = await observing(rig)
        deadline = rig.row(op_id).deadline_at
        rig.provider.jobs[job_id].state = "running"
        rig.clock.set(deadline - timedelta(seconds=8))
        rig.provider.script("status", error(429, {"Retry-After": "60"}))
        op = await rig.step(op_id)
        assert op.retry_not_before is not None and op.retry_not_before > deadline
        asked = len(rig.provider.sent("status", job_id))
        rig.runtime.db.availability.failed(WriteFailure.UNREACHABLE)
        rig.clock.set(deadline + timedelta(seconds=2))
        op = await rig.step(op_id)
        assert op.state == "result_timed_out"
        assert len(rig.provider.sent("status", job_id)) == asked  # no look
        stop = [e for e in rig.history(op_id) if e.kind == "escalation"][-1]
        assert "own storage outage" in stop.detail["detail"]
        assert "Retry-After allows no status request before" in stop.detail["detail"]
