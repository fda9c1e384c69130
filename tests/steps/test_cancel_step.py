"""The cancel step: the provider's cancel is sent once, and only its outcome ends the job.

Sending a cancel is not "cancelled": the operation ends ``cancelled`` only when the
provider says so, reports a success that won the race as a success, and ends
``cancellation_unconfirmed`` when the provider's cancel window closes first.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from pathlib import Path

import httpx
import pytest

from reconciler.core.errors import Conflict
from tests.support.provider_mock import error
from tests.support.steps import StepRig, step_rig

pytestmark = pytest.mark.anyio

WINDOW = {"cancel": {"cancel_deadline_seconds": 30}}


def transitions(rig: StepRig, op_id: str) -> list[tuple[str | None, str | None]]:
    return [(e.from_state, e.to_state) for e in rig.history(op_id) if e.kind == "transition"]


async def observing(rig: StepRig) -> tuple[str, str]:
    op_id = rig.submit()
    op = await rig.step(op_id)
    assert op.state == "observing" and op.remote_job_id is not None
    rig.provider.jobs[op.remote_job_id].state = "running"
    return op_id, op.remote_job_id


async def test_a_cancel_is_sent_once_and_confirmed_by_the_provider(
    tmp_path: Path, db_url: str
) -> None:
    async with step_rig(tmp_path, db_url) as rig:
        op_id, job_id = await observing(rig)
        requested = rig.cancel(op_id, "not needed any more")
        assert requested.state == "cancel_requested" and requested.next_poll_at == rig.clock.now()
        assert rig.view(op_id)["done"] is False

        op = await rig.step(op_id)
        assert op.state == "cancelling"
        assert op.cancel_sent_at == rig.clock.now()
        [sent] = rig.provider.sent("cancel", job_id)
        assert sent.method == "POST" and sent.path == f"/v1/jobs/{job_id}/cancel"
        assert op.cancel_deadline_at is not None

        # Still cancelling at the provider: observed, not ended.
        op = await rig.run(op_id, ["cancelling"])
        rig.advance_to_due(op_id)
        assert (await rig.step(op_id)).state == "cancelling"
        rig.provider.finish(job_id, "cancelled")
        await rig.run(op_id, ["cancelled"])
        assert rig.view(op_id)["done"] is True
        assert len(rig.provider.sent("cancel")) == 1
        at = transitions(rig, op_id).index(("observing", "cancel_requested"))
        assert transitions(rig, op_id)[at:] == [
            ("observing", "cancel_requested"),
            ("cancel_requested", "cancelling"),
            ("cancelling", "cancelled"),
        ]


async def test_a_success_that_won_the_race_is_reported_as_it_happened(
    tmp_path: Path, db_url: str
) -> None:
    async with step_rig(tmp_path, db_url) as rig:
        op_id, job_id = await observing(rig)
        rig.cancel(op_id)
        await rig.step(op_id)  # the cancel goes out ...
        rig.provider.finish(job_id, "succeeded")  # ... but the job had passed its commit point
        await rig.run(op_id, ["succeeded"])
        view = rig.view(op_id)
        assert view["cancel_requested"] is True and view["result"]["sha256"]
        assert transitions(rig, op_id)[-2:] == [
            ("cancelling", "result_collecting"),
            ("result_collecting", "succeeded"),
        ]
        assert len(rig.provider.sent("cancel")) == 1


async def test_a_cancel_never_confirmed_ends_cancellation_unconfirmed(
    tmp_path: Path, db_url: str
) -> None:
    provider = {"cancel": {"cancel_deadline_seconds": 30}}
    async with step_rig(tmp_path, db_url, provider=provider) as rig:
        op_id, job_id = await observing(rig)
        rig.cancel(op_id)
        op = await rig.step(op_id)
        window = op.cancel_deadline_at
        assert window is not None
        op = await rig.run(op_id, ["cancellation_unconfirmed"])
        view = rig.view(op_id)
        # An end a decision may still reopen: not done until the operator decides.
        assert view["done"] is False and view["awaiting_decision"] is True
        assert view["escalation"]["reason"] == "cancellation_unconfirmed"
        assert rig.provider.jobs[job_id].state == "cancelling"
        assert len(rig.provider.sent("cancel")) == 1
        # Watched until the window closed, never past it.
        reads = rig.provider.sent("status", job_id)
        assert reads and all(r.at <= window for r in reads)
        assert rig.clock.now() >= window


async def test_a_cancel_already_sent_by_a_crashed_worker_is_not_sent_again(
    tmp_path: Path, db_url: str
) -> None:
    """``cancel_sent_at`` is written before the call: a worker that crashed after it
    leaves the evidence, and the next owner only watches."""
    async with step_rig(tmp_path, db_url) as rig:
        op_id, _ = await observing(rig)
        rig.cancel(op_id)
        now = rig.clock.now()
        with rig.runtime.db.write() as conn:  # what a crashed worker left behind
            rig.runtime.journal.write(
                conn, rig.row(op_id), now=now, changes={"cancel_sent_at": now}
            )
        op = await rig.step(op_id)
        assert op.state == "cancelling"
        assert rig.provider.sent("cancel") == []
        note = [e for e in rig.history(op_id) if e.cause == "cancel_watch"]
        assert note and note[0].detail == {"note": "cancel call already sent earlier"}


async def test_without_a_cancel_action_a_cancel_is_refused_and_nothing_changes(
    tmp_path: Path, db_url: str
) -> None:
    async with step_rig(tmp_path, db_url, drop=("cancel",)) as rig:
        op_id, _ = await observing(rig)
        before = rig.history(op_id)
        with pytest.raises(Conflict, match="no cancel action"):
            rig.cancel(op_id)
        assert rig.row(op_id).state == "observing" and rig.history(op_id) == before


async def test_a_cancel_call_that_fails_is_still_followed_by_observation(
    tmp_path: Path, db_url: str
) -> None:
    async with step_rig(tmp_path, db_url) as rig:
        op_id, job_id = await observing(rig)
        rig.cancel(op_id)
        rig.provider.script("cancel", httpx.ReadTimeout("lost"))
        op = await rig.step(op_id)
        assert op.state == "cancelling"
        [entry] = [e for e in rig.history(op_id) if e.cause == "cancel_call"]
        assert entry.detail is not None and entry.detail["transport_error"] == "timeout"
        rig.provider.finish(job_id, "cancelled")
        await rig.run(op_id, ["cancelled"])
        assert len(rig.provider.sent("cancel")) == 1


async def _cancelling_until(rig: StepRig, past_close: float) -> tuple[str, str, datetime]:
    """A cancel sent, and its first status read answered 429 with a Retry-After that ends
    about ``past_close`` s after the cancel window closes; returns that moment."""
    op_id, job_id = await observing(rig)
    rig.cancel(op_id)
    window = (await rig.step(op_id)).cancel_deadline_at
    assert window is not None
    rig.advance_to_due(op_id)
    asked = rig.clock.now()
    wait = math.ceil((window - asked).total_seconds() + past_close)
    rig.provider.script("status", error(429, {"Retry-After": str(wait)}))
    op = await rig.step(op_id)
    assert op.state == "cancelling" and len(rig.provider.sent("status", job_id)) == 1
    return op_id, job_id, asked + timedelta(seconds=wait)


async def test_the_look_after_the_cancel_window_waits_for_a_retry_after(
    tmp_path: Path, db_url: str
) -> None:
    """A 429 shortly before the window closes names a moment just past it: the last look
    waits for that moment instead of asking at the close, and then settles the cancel."""
    async with step_rig(tmp_path, db_url, provider=WINDOW) as rig:
        op_id, job_id, floor = await _cancelling_until(rig, 1.0)
        op = rig.row(op_id)
        assert op.cancel_deadline_at is not None and floor > op.cancel_deadline_at
        assert op.next_poll_at == floor and op.delay_source == "provider_retry_after"
        rig.clock.set(op.cancel_deadline_at)
        assert await rig.tick() == 0  # the window has closed, but the provider said wait
        rig.provider.finish(job_id, "cancelled")
        await rig.run(op_id, ["cancelled"])
        [_, look] = rig.provider.sent("status", job_id)
        assert look.at == floor


async def test_a_retry_after_far_past_the_window_escalates_at_its_close(
    tmp_path: Path, db_url: str
) -> None:
    """Further off than any wait of our own between reads: no look, and a person decides."""
    async with step_rig(tmp_path, db_url, provider=WINDOW) as rig:
        op_id, job_id, floor = await _cancelling_until(rig, 3600.0)
        await rig.run(op_id, ["cancellation_unconfirmed"])
        assert len(rig.provider.sent("status", job_id)) == 1  # only the one answered 429
        assert rig.clock.now() < floor
        reason = rig.view(op_id)["escalation"]
        assert reason["reason"] == "cancellation_unconfirmed"
        assert "Retry-After" in reason["message"]
