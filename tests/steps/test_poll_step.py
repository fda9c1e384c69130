"""The poll step: every stop condition, Retry-After, grace windows and provider outcomes.

Each case runs the real create and poll steps against an in-process provider on a
``ManualClock``: the clock jumps to each time the poller chose, so deadlines and
backoffs cost nothing. What the provider received is its request log; what the
operator sees is the Operation view the API renders.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from reconciler.core.clock import isoformat
from tests.support.provider_mock import FakeProvider, Job, answer, error, refused
from tests.support.stack import QUICK_POLLING
from tests.support.steps import StepRig, step_rig

pytestmark = pytest.mark.anyio

ALL_OPTIONS = ("extend", "cancel", "abandon")
Arrange = Callable[[FakeProvider, Job, StepRig], None]


def provider_for(grace: float = 0.5, **polling: Any) -> dict[str, dict[str, Any]]:
    return {
        "polling": {**QUICK_POLLING, **polling},
        "status": {"not_found_grace_seconds": grace},
    }


async def observing(rig: StepRig, **fields: Any) -> tuple[str, Job]:
    op_id = rig.submit(**fields)
    op = await rig.step(op_id)
    assert op.state == "observing", rig.causes(op_id)
    assert op.remote_job_id is not None
    return op_id, rig.provider.jobs[op.remote_job_id]


def nothing(provider: FakeProvider, job: Job, rig: StepRig) -> None:
    return None


def statuses(*answers: Any) -> Arrange:
    def arrange(provider: FakeProvider, job: Job, rig: StepRig) -> None:
        provider.script("status", *(provider.usual if a == "usual" else a for a in answers))

    return arrange


def with_state(state: str, **extra: Any) -> Arrange:
    def arrange(provider: FakeProvider, job: Job, rig: StepRig) -> None:
        job.state = state
        job.extra.update(extra)

    return arrange


def invisible(provider: FakeProvider, job: Job, rig: StepRig) -> None:
    job.visible = False


def past_expiry(provider: FakeProvider, job: Job, rig: StepRig) -> None:
    job.state = "running"
    job.extra["expires_at"] = isoformat(rig.clock.now() - timedelta(seconds=1))


@dataclass(frozen=True)
class Case:
    reason: str
    arrange: Arrange = nothing
    fields: dict[str, Any] = field(default_factory=dict)
    state: str = "escalated"
    options: tuple[str, ...] = ALL_OPTIONS
    grace: float = 0.5
    last_statuses: tuple[int, ...] = ()  # the last status answers' HTTP statuses, newest last
    detail: str = ""


CASES = {
    "deadline_exceeded": Case(
        "deadline_exceeded",
        fields={"deadline_seconds": 1.2},
        state="result_timed_out",
        detail="deadline",
    ),
    "request_budget_exhausted": Case(
        "request_budget_exhausted",
        fields={"max_status_requests": 4},
        last_statuses=(200,),
        detail="4 of 4 status requests used",
    ),
    "rate_limited": Case(
        "rate_limited",
        statuses(error(429), error(429), error(429)),
        last_statuses=(429, 429, 429),
        detail="HTTP 429 3 times in a row",
    ),
    "unknown_state": Case(
        "unknown_state",
        with_state("needs_review"),
        last_statuses=(200,),
        detail="needs_review",
    ),
    "authorization_denied_401": Case(
        "authorization_denied",
        statuses("usual", error(401)),
        options=("extend", "abandon"),
        last_statuses=(401,),
        detail="HTTP 401",
    ),
    "authorization_denied_403": Case(
        "authorization_denied",
        statuses("usual", "usual", error(403)),
        options=("extend", "abandon"),
        last_statuses=(403,),
        detail="HTTP 403",
    ),
    "provider_failure_503": Case(
        "provider_failure",
        statuses(error(503), error(503), error(503)),
        last_statuses=(503, 503, 503),
        detail="3 of 3",
    ),
    "provider_failure_500": Case(
        "provider_failure",
        statuses("usual", error(500), error(500), error(500)),
        last_statuses=(500, 500, 500),
        detail="3 of 3",
    ),
    "contract_violation_404": Case(
        "contract_violation",
        invisible,
        options=("cancel", "abandon"),
        grace=0.4,
        last_statuses=(404,),
        detail="grace window",
    ),
    "contradictory_status_success_without_result": Case(
        "contradictory_status",
        with_state("succeeded"),
        last_statuses=(200,),
        detail="required result fields",
    ),
    "contradictory_status_running_past_expiry": Case(
        "contradictory_status",
        past_expiry,
        last_statuses=(200,),
        detail="running after its own expiry",
    ),
    "contradictory_status_other_job": Case(
        "contradictory_status",
        with_state("running", job_id="job-elsewhere"),
        last_statuses=(200,),
        detail="names job job-elsewhere",
    ),
}


def message_lines(message: str) -> dict[str, str]:
    lines = message.splitlines()
    assert lines[0] == "External job needs a decision"
    return dict(line.split(": ", 1) for line in lines[1:])


@pytest.mark.parametrize("name", list(CASES))
async def test_stop_condition_escalates_with_reason_message_options_and_silence(
    tmp_path: Path, db_url: str, name: str
) -> None:
    case = CASES[name]
    async with step_rig(tmp_path, db_url, provider=provider_for(case.grace)) as rig:
        op_id, job = await observing(rig, **case.fields)
        case.arrange(rig.provider, job, rig)
        await rig.run(op_id, [case.state])
        view = rig.view(op_id)
        esc = view["escalation"]
        # Waiting stopped for a person: not done, whichever state it stopped in.
        assert view["done"] is False and view["awaiting_decision"] is True
        assert esc["reason"] == case.reason and esc["decided"] is False

        # What the operator reads: the escalation message and bounded options.
        lines = message_lines(esc["message"])
        budget = view["budget"]
        assert lines["Operation"] == op_id
        assert lines["Provider job"].startswith(job.id)
        assert lines["Status requests"] == (
            f"{budget['status_requests_used']} of {budget['max_status_requests']}"
        )
        assert lines["Stopped because"].startswith(case.reason)
        assert case.detail in lines["Stopped because"], lines
        assert [o["action"] for o in esc["options"]] == list(case.options)
        for option in esc["options"]:
            assert option["description"] in lines["Safe options"]
            if option["action"] == "extend":
                assert 0 < option["extra_seconds"] <= 24 * 3600
                assert 0 < option["extra_status_requests"] <= 100
                assert "additional check" in option["description"]

        # What the provider saw: exactly the charged reads, within the budget.
        reads = rig.provider.sent("status", job.id)
        assert len(reads) == budget["status_requests_used"] <= budget["max_status_requests"]
        if case.last_statuses:
            assert lines["Last HTTP result"].startswith(str(case.last_statuses[-1]))
            recorded = [e for e in rig.history(op_id) if e.cause == "status_read"]
            tail = [e.detail["http_status"] for e in recorded[-len(case.last_statuses) :]]
            assert tail == list(case.last_statuses)
        if case.reason == "deadline_exceeded":
            # Checked before a request: none was sent at or after the deadline.
            deadline = rig.row(op_id).deadline_at
            assert all(r.at < deadline for r in reads)

        # The history: one escalation, one transition into the state, one entry per read.
        entries = rig.history(op_id)
        assert [e.detail["reason"] for e in entries if e.kind == "escalation"] == [case.reason]
        moved = [e for e in entries if e.kind == "transition" and e.to_state == case.state]
        assert [e.cause for e in moved] == [f"escalation:{case.reason}"]
        assert sum(e.cause == "status_read" for e in entries) == len(reads)

        # Silence: nothing is due, and an hour of ticks sends nothing more.
        assert rig.row(op_id).next_poll_at is None
        for _ in range(3):
            rig.advance(1200)
            assert await rig.tick() == 0
        assert len(rig.provider.requests) == 1 + len(reads)
        assert rig.view(op_id)["budget"] == budget


async def test_not_found_within_grace_waits_then_succeeds(tmp_path: Path, db_url: str) -> None:
    async with step_rig(tmp_path, db_url, provider=provider_for(grace=15.0)) as rig:
        op_id, job = await observing(rig)
        job.visible = False
        for _ in range(3):
            rig.advance_to_due(op_id)
            await rig.step(op_id)
        job.visible = True
        rig.provider.finish(job.id)
        op = await rig.run(op_id, ["succeeded"])
        assert op.escalation_id is None
        codes = [e.detail["http_status"] for e in rig.history(op_id) if e.cause == "status_read"]
        assert codes == [404, 404, 404, 200]
        for entry in rig.history(op_id):
            if entry.cause == "status_read" and entry.detail["http_status"] == 404:
                assert entry.detail["decision"] == "wait"
                assert any("grace window" in note for note in entry.detail["notes"])


@pytest.mark.parametrize(("status", "form"), [(503, "seconds"), (503, "date"), (429, "seconds")])
async def test_retry_after_sets_the_next_read(
    tmp_path: Path, db_url: str, status: int, form: str
) -> None:
    async with step_rig(tmp_path, db_url, provider=provider_for()) as rig:
        op_id, job = await observing(rig)
        rig.advance_to_due(op_id)
        at = rig.clock.now()
        when = at + timedelta(seconds=7)
        if form == "date":  # an HTTP date has whole seconds: the next one after ``when``
            when = when.replace(microsecond=0) + timedelta(seconds=1 if when.microsecond else 0)
        value = "7" if form == "seconds" else format_datetime(when, usegmt=True)
        rig.provider.script("status", error(status, {"Retry-After": value}))
        op = await rig.step(op_id)
        assert op.next_poll_at == when and op.delay_source == "provider_retry_after"
        entry = [e for e in rig.history(op_id) if e.cause == "status_read"][-1]
        assert entry.delay_source == "provider_retry_after"
        assert entry.detail["next_poll_at"] == isoformat(when)
        # Nothing is sent before that moment, and the read at it goes out.
        rig.clock.set(when - timedelta(seconds=0.1))
        assert await rig.tick() == 0
        rig.provider.finish(job.id)
        await rig.run(op_id, ["succeeded"])
        first, second = rig.provider.sent("status", job.id)[-2:]
        assert first.at == at and second.at == when


async def test_poll_after_hint_replaces_the_backoff(tmp_path: Path, db_url: str) -> None:
    async with step_rig(tmp_path, db_url, provider=provider_for()) as rig:
        op_id, job = await observing(rig)
        job.state, job.extra["poll_after_seconds"] = "running", 4
        rig.advance_to_due(op_id)
        now = rig.clock.now()
        op = await rig.step(op_id)
        assert op.next_poll_at == now + timedelta(seconds=4)
        assert op.delay_source == "provider_poll_hint"


async def test_terminal_failure_ends_failed_with_the_provider_error(
    tmp_path: Path, db_url: str
) -> None:
    problem = {"code": "bad_input", "message": "row 7 is unreadable"}
    async with step_rig(tmp_path, db_url, provider=provider_for()) as rig:
        op_id, job = await observing(rig)
        rig.provider.finish(job.id, "failed", error=problem)
        op = await rig.run(op_id, ["failed"])
        view = rig.view(op_id)
        assert view["done"] is True and view["escalation"] is None
        assert view["error"]["detail"]["provider_error"] == problem
        assert view["error"]["provider_message"] == "row 7 is unreadable"
        assert view["error"]["code"] == "provider_failed"
        assert op.remote_state == "failed"
        assert rig.provider.sent("result") == []
        assert not [e for e in rig.history(op_id) if e.kind == "escalation"]


async def test_transport_errors_spend_the_failure_budget_then_escalate(
    tmp_path: Path, db_url: str
) -> None:
    async with step_rig(tmp_path, db_url, provider=provider_for()) as rig:
        op_id, _ = await observing(rig)
        rig.provider.script(
            "status",
            refused(),
            httpx.ReadTimeout("slow"),
            httpx.RemoteProtocolError("peer closed connection"),
        )
        await rig.run(op_id, ["escalated"])
        view = rig.view(op_id)
        assert view["escalation"]["reason"] == "provider_failure"
        errors = [
            e.detail.get("transport_error") for e in rig.history(op_id) if e.cause == "status_read"
        ]
        assert errors == ["connection_refused", "timeout", "connection_reset"]


async def test_a_late_answer_is_applied_on_the_fresh_row_after_a_cancel(
    tmp_path: Path, db_url: str
) -> None:
    """An agent's cancel lands while the status request is out: both are kept."""
    async with step_rig(tmp_path, db_url, provider=provider_for()) as rig:
        op_id, job = await observing(rig)

        def cancel_meanwhile(request: Any) -> Any:
            rig.cancel(op_id, "changed my mind")
            return answer(200, rig.provider.status_body(job))

        job.state = "running"
        rig.provider.script("status", cancel_meanwhile)
        rig.advance_to_due(op_id)
        op = await rig.step(op_id)
        assert op.state == "cancel_requested"
        assert op.remote_state == "running"
        assert op.status_requests_used == 1
        assert op.next_poll_at == rig.clock.now()  # the cancel is sent at once
        assert rig.causes(op_id)[-1] == "status_read"


async def test_a_read_charged_in_time_but_not_sendable_before_the_deadline_is_withheld(
    tmp_path: Path, db_url: str
) -> None:
    """The deadline is checked again just before transmission (docs/design.md#read-order).

    Persisting the charge takes time on a loaded machine; the clock is moved past the
    deadline between the charge and the send (at the provider call, before the request
    is made), so the read is withheld as an unused reservation, never sent late.
    """
    async with step_rig(tmp_path, db_url, provider=provider_for(deadline_seconds=20)) as rig:
        op_id, _ = await observing(rig)
        deadline = rig.row(op_id).deadline_at
        sent_before = len(rig.provider.requests)
        rig.clock.set(deadline - timedelta(seconds=1))
        call = rig.ctx.call

        async def late_call(op: Any, name: str, fn: Callable[[], Any]) -> Any:
            rig.clock.set(deadline + timedelta(seconds=1))  # the charge took two seconds
            return await call(op, name, fn)

        rig.ctx.call = late_call  # type: ignore[method-assign]
        op = await rig.step(op_id)
        assert op.state == "result_timed_out"
        assert len(rig.provider.requests) == sent_before, "no request after the deadline"
        assert op.status_requests_used == 1  # the withheld read was charged in time
        stop = [e for e in rig.history(op_id) if e.kind == "escalation"][-1]
        assert "before the status request was sent" in stop.detail["detail"]
