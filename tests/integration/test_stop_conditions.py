"""Poller stop conditions through the service's routes and the simulated provider.

Every stop condition is proven step by step in ``tests/steps/test_poll_step.py`` (an
in-process provider on a manual clock). These cases run the service's own routes,
worker and webhook intake against the sim (``tests/support/world.py``: both apps over
``httpx.ASGITransport``, one manual clock), to show the same through HTTP: what the
operator sees (reason, the escalation message of docs/design.md#escalation-message,
bounded options, the Operation and the list)
and what the provider saw: exactly the budget charged, and nothing after the stop,
however long the clock runs on. Retry-After and webhook hints are timed on the clock
both sides share, so the comparisons are exact.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.support.stack import QUICK_POLLING as POLLING
from tests.support.world import World, world

# The sim and the service read one clock: only the float rounding of timestamps differs.
SKEW = 1e-6
ALL_OPTIONS = ["extend", "cancel", "abandon"]
# Once stopped, the clock runs on this long and nothing more may reach the provider.
QUIET_SECONDS = 600


def run(
    tmp_path: Path,
    db_url: str,
    body: Callable[[World], Awaitable[None]],
    *,
    grace: float = 0.5,
    **polling: Any,
) -> None:
    async def main() -> None:
        async with world(
            tmp_path,
            db_url,
            polling={**POLLING, **polling},
            provider={"status": {"not_found_grace_seconds": grace}},
        ) as w:
            await body(w)

    asyncio.run(main())


def epoch(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def job_requests(w: World, job_id: str) -> dict[str, list[dict[str, Any]]]:
    return {
        name: [asdict(r) for r in records] for name, records in w.sim.jobs[job_id].requests.items()
    }


def all_requests(w: World, job_id: str) -> list[dict[str, Any]]:
    """Every request the sim logged for the job (any endpoint, answered or not), by time."""
    return sorted((asdict(r) for r in w.sim.requests if r.job_id == job_id), key=lambda r: r["at"])


async def settle(w: World, op_id: str, states: set[str]) -> dict[str, Any]:
    await w.run_until(w.in_state(op_id, *states))
    op = await w.get(op_id, operator=True)
    assert op["state"] in states, f"{op_id} stuck in {op['state']}: {op.get('escalation')}"
    return op


async def wait_done(w: World, op_id: str) -> dict[str, Any]:
    await w.run_until(w.finished(op_id))
    return await w.get(op_id, operator=True)


@dataclass(frozen=True)
class Case:
    reason: str
    request: dict[str, Any]
    fields: dict[str, Any] = field(default_factory=dict)
    state: str = "escalated"
    options: tuple[str, ...] = tuple(ALL_OPTIONS)
    grace: float = 0.5
    # HTTP statuses the last status answers must have had (newest last).
    last_statuses: tuple[int | None, ...] = ()
    detail: str = ""


NEVER = {"scenario": "never_finishes", "webhooks": "never"}

CASES = {
    "deadline_exceeded": Case(
        "deadline_exceeded",
        NEVER,
        {"deadline_seconds": 1.2},
        state="result_timed_out",
        detail="deadline",
    ),
    "rate_limited": Case(
        "rate_limited",
        {**NEVER, "status_fault": 429, "retry_after": None},
        last_statuses=(429, 429, 429),
        detail="HTTP 429 3 times in a row",
    ),
    "authorization_denied_401": Case(
        "authorization_denied",
        {**NEVER, "auth_fault": 401, "auth_fault_after": 1},
        options=("extend", "abandon"),
        last_statuses=(401,),
        detail="HTTP 401",
    ),
    "contract_violation_404": Case(
        "contract_violation",
        {"scenario": "success", "invisible_for": 60, "webhooks": "never"},
        options=("cancel", "abandon"),
        grace=0.4,
        last_statuses=(404,),
        detail="grace window",
    ),
}


def message_lines(message: str) -> dict[str, str]:
    lines = message.splitlines()
    assert lines[0] == "External job needs a decision"
    return dict(line.split(": ", 1) for line in lines[1:])


def check_message(op: dict[str, Any], case: Case) -> None:
    esc = op["escalation"]
    lines = message_lines(esc["message"])
    budget = op["budget"]
    assert lines["Operation"] == op["id"]
    assert lines["Provider job"].startswith(op["remote_job_id"])
    assert lines["Status requests"] == (
        f"{budget['status_requests_used']} of {budget['max_status_requests']}"
    )
    assert lines["Stopped because"].startswith(case.reason)
    assert case.detail in lines["Stopped because"]
    for option in esc["options"]:
        assert option["description"] in lines["Safe options"]
    # The last HTTP result the message names is the last one the provider gave.
    if case.last_statuses:
        assert lines["Last HTTP result"].startswith(str(case.last_statuses[-1]))


def check_options(op: dict[str, Any], case: Case) -> None:
    options = op["escalation"]["options"]
    assert [o["action"] for o in options] == list(case.options)
    for option in options:
        if option["action"] == "extend":
            # Bounded: a stated amount of time and of extra checks, never "continue?".
            assert 0 < option["extra_seconds"] <= 24 * 3600
            assert 0 < option["extra_status_requests"] <= 100
            assert "additional check" in option["description"]


async def check_listed(w: World, op: dict[str, Any], reason: str) -> None:
    response = await w.client.get(
        "/v1/operations", params={"state": op["state"]}, headers=w.headers(operator=True)
    )
    assert response.status_code == 200
    listed = {o["id"]: o for o in response.json()["operations"]}
    assert op["id"] in listed
    assert listed[op["id"]]["escalation"]["reason"] == reason
    assert all(o["state"] == op["state"] for o in listed.values())


async def check_provider_quiet(w: World, op: dict[str, Any]) -> None:
    """Nothing reached the provider after the stop, and nothing does while the clock runs
    on for ``QUIET_SECONDS``, every due moment on the way acted upon."""
    job_id = op["remote_job_id"]
    stopped_at = epoch(op["escalation"]["created_at"])
    before = all_requests(w, job_id)
    assert before and all(r["at"] <= stopped_at + SKEW for r in before), before
    await w.advance(QUIET_SECONDS)
    after = all_requests(w, job_id)
    assert after == before
    again = await w.get(op["id"], operator=True)
    assert again["budget"] == op["budget"]
    assert again["state"] == op["state"]


def check_budget(w: World, op: dict[str, Any]) -> list[dict[str, Any]]:
    """The provider saw exactly the charged status requests, never more than the budget.

    Time moves only between steps here, so the deadline check just before transmission
    cannot be crossed after the charge: every charged request was sent.
    """
    status = job_requests(w, op["remote_job_id"])["status"]
    budget = op["budget"]
    assert len(status) == budget["status_requests_used"]
    assert budget["status_requests_used"] <= budget["max_status_requests"]
    return status


async def check_history(w: World, op: dict[str, Any], case: Case) -> None:
    entries = await w.history(op["id"])
    escalations = [e for e in entries if e["kind"] == "escalation"]
    assert len(escalations) == 1
    assert escalations[0]["detail"]["reason"] == case.reason
    moved = [e for e in entries if e["kind"] == "transition" and e["to"] == op["state"]]
    assert len(moved) == 1 and moved[0]["cause"] == f"escalation:{case.reason}"
    reads = [e for e in entries if e["cause"] == "status_read"]
    assert len(reads) == op["budget"]["status_requests_used"]


@pytest.mark.parametrize("name", list(CASES))
def test_stop_condition_escalates_with_reason_message_and_silence(
    tmp_path: Path, db_url: str, name: str
) -> None:
    case = CASES[name]

    async def body(w: World) -> None:
        created = await w.submit(case.request, **case.fields)
        assert created.status_code == 202, created.text
        op = await settle(w, created.json()["id"], {case.state})
        # Stopped for a person: not done until the decision, whichever state it stopped in.
        assert op["done"] is False and op["awaiting_decision"] is True
        assert op["escalation"]["reason"] == case.reason
        assert op["escalation"]["decided"] is False
        check_message(op, case)
        check_options(op, case)
        await check_listed(w, op, case.reason)
        status = check_budget(w, op)
        if case.last_statuses:
            tail = [r["status"] for r in status[-len(case.last_statuses) :]]
            assert tail == list(case.last_statuses)
        if case.reason == "deadline_exceeded":
            # The deadline is checked before a request: none was sent at or after it.
            deadline = epoch(op["deadline_at"])
            assert all(r["at"] < deadline for r in status)
        await check_history(w, op, case)
        await check_provider_quiet(w, op)

    run(tmp_path, db_url, body, grace=case.grace)


@pytest.mark.parametrize(("status", "form"), [(503, "seconds"), (429, "http-date")])
def test_retry_after_is_honoured(tmp_path: Path, db_url: str, status: int, form: str) -> None:
    # No webhooks: only the poller decides when the next read happens.
    request = {
        "scenario": "success",
        "duration": 1.0,
        "webhooks": "never",
        "status_fault": status,
        "status_fault_after": 1,
        "status_fault_count": 1,
        "retry_after": 1,
        "retry_after_form": form,
    }

    async def body(w: World) -> None:
        op = await wait_done(w, await w.create(**request))
        assert op["state"] == "succeeded", op
        reads = job_requests(w, op["remote_job_id"])["status"]
        index = next(i for i, r in enumerate(reads) if r["status"] == status)
        faulted, following = reads[index], reads[index + 1]
        # The header said 1 s (seconds) or an IMF-fixdate rounded up to the next whole second.
        earliest = faulted["at"] + 1 if form == "seconds" else math.ceil(faulted["at"] + 1)
        assert following["at"] >= earliest - SKEW, (faulted, following)
        entry = [e for e in await w.history(op["id"]) if e["cause"] == "status_read"][index]
        assert entry["detail"]["http_status"] == status
        assert entry["delay_source"] == "provider_retry_after"
        assert epoch(entry["detail"]["next_poll_at"]) >= earliest - SKEW

    run(tmp_path, db_url, body)


def test_status_requests_never_exceed_budget_with_webhook_hints(
    tmp_path: Path, db_url: str
) -> None:
    """Hints bring reads forward; they never add reads beyond the budget."""
    request = {"scenario": "never_finishes", "webhooks": "duplicate", "duplicates": 5}

    async def body(w: World) -> None:
        ids = [(await w.submit(request, max_status_requests=3)).json()["id"] for _ in range(3)]
        for op_id in ids:
            op = await settle(w, op_id, {"escalated"})
            assert op["escalation"]["reason"] == "request_budget_exhausted"
            status = check_budget(w, op)
            assert len(status) == 3
        await w.advance(QUIET_SECONDS)  # the duplicate hints keep coming; no read follows
        for op_id in ids:
            op = await w.get(op_id, operator=True)
            assert len(job_requests(w, op["remote_job_id"])["status"]) == 3

    run(tmp_path, db_url, body)


def test_retry_after_is_honoured_when_a_webhook_arrives_meanwhile(
    tmp_path: Path, db_url: str
) -> None:
    """A webhook hint brings a read forward, but never before the provider's Retry-After."""
    # The job finishes (and its webhook arrives) inside the Retry-After window of a 503.
    request = {
        "scenario": "success",
        "duration": 0.8,
        "webhook_on_running": False,
        "status_fault": 503,
        "status_fault_after": 1,
        "status_fault_count": 1,
        "retry_after": 2,
    }

    async def body(w: World) -> None:
        op = await wait_done(w, await w.create(**request))
        assert op["state"] == "succeeded", op
        hints = [e for e in await w.history(op["id"]) if e["kind"] == "hint"]
        reads = job_requests(w, op["remote_job_id"])["status"]
        index = next(i for i, r in enumerate(reads) if r["status"] == 503)
        assert hints and epoch(hints[0]["at"]) < reads[index]["at"] + 2
        assert reads[index + 1]["at"] >= reads[index]["at"] + 2 - SKEW

    run(tmp_path, db_url, body)
