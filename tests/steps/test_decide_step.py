"""Operator decisions at the step level: what each one does to the poller that follows.

An escalation stops the poller; ``extend`` starts it again with the new limits and it
stops at them, ``cancel`` hands the job to the cancel step, ``abandon`` ends the
operation as the escalation said and leaves nothing due. Each case lets the engine
escalate on its own (a spent budget, a passed deadline), decides through the same
command the API and ``reconciler decide`` call, and runs the steps on the test's clock.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.core.escalation import abandon_state
from reconciler.core.vocabulary import EscalationReason
from tests.support.steps import StepRig, step_rig

pytestmark = pytest.mark.anyio

# Ten clock minutes: long past any read the poller could still have had due.
QUIET_SECONDS = 600


async def escalated(rig: StepRig, reason: str) -> str:
    fields = {"max_status_requests": 3} if reason == "request_budget_exhausted" else {}
    if reason == "deadline_exceeded":
        fields = {"deadline_seconds": 30}
    op_id = rig.submit(**fields)
    wanted = "escalated" if reason == "request_budget_exhausted" else "result_timed_out"
    op = await rig.run(op_id, [wanted])
    assert rig.view(op_id)["escalation"]["reason"] == reason, op.state
    return op_id


def decisions(rig: StepRig, op_id: str) -> list[str]:
    return [e.cause for e in rig.history(op_id) if e.kind == "decision"]


async def test_extend_polls_again_up_to_the_new_limit_and_stops_there(
    tmp_path: Path, db_url: str
) -> None:
    async with step_rig(tmp_path, db_url) as rig:
        op_id = await escalated(rig, "request_budget_exhausted")
        assert len(rig.provider.sent("status")) == 3
        op = rig.decide(op_id, {"action": "extend", "extra_status_requests": 2})
        assert op.state == "observing" and op.next_poll_at is not None
        assert decisions(rig, op_id) == ["decision:extend"]

        await rig.run(op_id, ["escalated"])
        view = rig.view(op_id)
        assert view["escalation"]["reason"] == "request_budget_exhausted"
        assert view["escalation"]["decided"] is False  # a new escalation, not the old one
        assert view["budget"] == {"status_requests_used": 5, "max_status_requests": 5}
        assert len(rig.provider.sent("status")) == 5
        rig.advance(QUIET_SECONDS)
        assert await rig.tick() == 0
        assert len(rig.provider.sent("status")) == 5


async def test_extend_then_the_job_finishes_within_the_new_limit(
    tmp_path: Path, db_url: str
) -> None:
    async with step_rig(tmp_path, db_url) as rig:
        op_id = await escalated(rig, "request_budget_exhausted")
        job_id = rig.row(op_id).remote_job_id
        assert job_id is not None
        rig.decide(op_id, {"action": "extend", "extra_status_requests": 4})
        rig.provider.finish(job_id, "succeeded")
        await rig.run(op_id, ["succeeded"])
        assert (
            len(rig.provider.sent("status"))
            == rig.view(op_id)["budget"]["status_requests_used"]
            <= 7
        )


@pytest.mark.parametrize("reason", ["request_budget_exhausted", "deadline_exceeded"])
async def test_cancel_hands_the_job_to_the_cancel_step(
    tmp_path: Path, db_url: str, reason: str
) -> None:
    async with step_rig(tmp_path, db_url) as rig:
        op_id = await escalated(rig, reason)
        job_id = rig.row(op_id).remote_job_id
        op = rig.decide(op_id, {"action": "cancel"})
        assert op.state == "cancel_requested" and rig.view(op_id)["cancel_requested"] is True
        assert (await rig.step(op_id)).state == "cancelling"
        assert job_id is not None
        rig.provider.finish(job_id, "cancelled")
        await rig.run(op_id, ["cancelled"])
        assert len(rig.provider.sent("cancel", job_id)) == 1
        assert decisions(rig, op_id) == ["decision:cancel"]


@pytest.mark.parametrize("reason", ["request_budget_exhausted", "deadline_exceeded"])
async def test_abandon_ends_as_the_escalation_says_and_nothing_follows(
    tmp_path: Path, db_url: str, reason: str
) -> None:
    async with step_rig(tmp_path, db_url) as rig:
        op_id = await escalated(rig, reason)
        reads = len(rig.provider.sent("status"))
        op = rig.decide(op_id, {"action": "abandon"})
        expected = abandon_state(EscalationReason(reason)).value
        assert op.state == expected
        assert rig.view(op_id)["done"] is True
        await rig.run(op_id, [expected])  # the completion round, if any, closes
        rig.advance(QUIET_SECONDS)
        assert await rig.tick() == 0
        assert rig.row(op_id).next_poll_at is None
        assert len(rig.provider.sent("status")) == reads
        assert len(rig.provider.sent("cancel")) == 0
        assert decisions(rig, op_id) == ["decision:abandon"]
