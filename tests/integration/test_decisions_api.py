"""Operator decisions on escalations: the HTTP API and ``reconciler decide``, end to end.

Each test lets the poller escalate on its own, decides, and then checks what the
operation, its history and the provider show afterwards. The API's decisions run in
the in-process world (``tests/support/world.py``: the service's routes and worker and
the simulated provider over ``httpx.ASGITransport``, one manual clock), so "the poller
resumes" and "no read follows" are the clock running on, not a wait. The command line
runs as its own process beside the service on uvicorn (``live``), and so does the
callback that keeps failing, whose retries are real deliveries to a receiver.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from reconciler.cli import main
from reconciler.core.clock import utc
from reconciler.core.escalation import abandon_state
from reconciler.core.vocabulary import EscalationReason
from tests.support import forked, hooks, waiting
from tests.support.hooks import Reply, serve_receiver
from tests.support.stack import QUICK_POLLING as POLLING
from tests.support.stack import ROOT, Stack, quiescent, running_stack
from tests.support.world import SyncWorld, sync_world

# An operator's note: markup and quotes are text, a line break is kept.
NOTE = 'the provider\'s status page says "degraded" <until 06:00>\nwaiting once more'
NEVER = {"scenario": "never_finishes", "webhooks": "never", "cancel_delay": 0.3}
# Requests and fields that make the poller stop with each reason, quickly.
ESCALATE: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "request_budget_exhausted": (NEVER, {"max_status_requests": 3}),
    "deadline_exceeded": (NEVER, {"deadline_seconds": 1.0}),
    # Three 429s stop the poller; the provider answers normally afterwards.
    "rate_limited": (
        {**NEVER, "status_fault": 429, "status_fault_count": 3, "retry_after": None},
        {},
    ),
    "provider_failure": ({**NEVER, "status_fault": 503, "retry_after": None}, {}),
    "unknown_state": ({"scenario": "unknown_state", "duration": 0.2, "webhooks": "never"}, {}),
    "authorization_denied": ({**NEVER, "auth_fault": 403, "auth_fault_after": 1}, {}),
    "contract_violation": ({"scenario": "success", "invisible_for": 60, "webhooks": "never"}, {}),
    "contradictory_status": ({"scenario": "running_past_expiry", "webhooks": "never"}, {}),
}
STOPPED = {"escalated", "result_timed_out"}
PROVIDER = {"polling": POLLING, "status": {"not_found_grace_seconds": 0.3}}
# The in-process world or the live service: the helpers below take either.
Scene = SyncWorld | Stack


@pytest.fixture
def stack(tmp_path: Path, db_url: str) -> Iterator[SyncWorld]:
    with sync_world(tmp_path, db_url, provider=PROVIDER) as world:
        yield world


@pytest.fixture
def live(tmp_path: Path, db_url: str) -> Iterator[Stack]:
    with running_stack(tmp_path, db_url, provider=PROVIDER) as s:
        yield s


def epoch(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def escalate(stack: Scene, reason: str) -> dict[str, Any]:
    request, fields = ESCALATE[reason]
    created = stack.create(request, **fields)
    assert created.status_code == 202, created.text
    op = stack.wait_state(created.json()["id"], STOPPED, timeout=15)
    assert op["state"] in STOPPED, op
    assert op["escalation"]["reason"] == reason
    return op


def decide(stack: Scene, op_id: str, body: Any, *, operator: bool = True) -> httpx.Response:
    kwargs: dict[str, Any] = {"content": body} if isinstance(body, bytes) else {"json": body}
    return stack.client.post(
        f"/v1/operations/{op_id}/decisions",
        headers={**stack.headers(operator=operator), "Content-Type": "application/json"},
        **kwargs,
    )


def status_reads(stack: Scene, job_id: str) -> list[dict[str, Any]]:
    reads: list[dict[str, Any]] = stack.sim_job(job_id)["requests"]["status"]
    return reads


def wait_until(predicate: Any, timeout: float = 10.0) -> None:
    waiting.wait_until(predicate, timeout, "the condition")


def unchanged(stack: Scene, before: dict[str, Any]) -> None:
    """A refused decision changed nothing: same state, same open escalation, same budget."""
    after = stack.get(before["id"], operator=True)
    assert after["state"] == before["state"]
    assert after["escalation"]["decided"] is False
    assert after["budget"] == before["budget"]
    assert after["deadline_at"] == before["deadline_at"]


def decision_entries(stack: Scene, op_id: str) -> list[dict[str, Any]]:
    return [e for e in stack.history(op_id) if e["kind"] == "decision"]


# --- extend ----------------------------------------------------------------------------


def test_extend_grants_new_limits_and_the_operation_finishes(stack: Scene) -> None:
    op = escalate(stack, "request_budget_exhausted")
    job_id = op["remote_job_id"]
    assert len(status_reads(stack, job_id)) == 3
    before_deadline = epoch(op["deadline_at"])

    # Only what was offered (four more checks), or less: see tests/security.
    body = {"action": "extend", "extra_seconds": 60, "extra_status_requests": 4, "note": NOTE}
    response = decide(stack, op["id"], body)
    assert response.status_code == 200, response.text
    after = response.json()
    assert after["state"] == "observing"
    assert after["budget"] == {"status_requests_used": 3, "max_status_requests": 7}
    assert epoch(after["deadline_at"]) == pytest.approx(before_deadline + 60, abs=0.01)
    assert after["escalation"]["decided"] is True
    assert after["escalation"]["decision"] == {
        "action": "extend",
        "extra_seconds": 60.0,
        "extra_status_requests": 4,
        "note": NOTE,
    }

    # The note is kept with the decision: in the chained history entry, as sent.
    [entry] = decision_entries(stack, op["id"])
    assert entry["delay_source"] == "manual_extension"
    assert entry["actor"] == "operator:ops-1"
    assert entry["detail"]["extra_status_requests"] == 4
    assert entry["detail"]["note"] == NOTE
    resumed = [e for e in stack.history(op["id"]) if e["cause"] == "decision:extend"]
    assert [(e["from"], e["to"]) for e in resumed if e["kind"] == "transition"] == [
        ("escalated", "observing")
    ]

    # The poller resumes on its own; then the job finishes and the operation completes.
    stack.run_until(lambda: len(status_reads(stack, job_id)) >= 5)
    forced = stack.sim_client.post(f"/_sim/jobs/{job_id}/complete", json={"state": "succeeded"})
    assert forced.status_code == 200
    done = stack.wait(op["id"])
    assert done["state"] == "succeeded", done
    reads = status_reads(stack, job_id)
    assert len(reads) == done["budget"]["status_requests_used"] <= 7


def test_extension_is_a_new_bounded_limit(stack: Scene) -> None:
    op = escalate(stack, "request_budget_exhausted")
    response = decide(stack, op["id"], {"action": "extend", "extra_status_requests": 2})
    assert response.status_code == 200, response.text
    # Without extra_seconds the offered amount applies.
    offered = op["escalation"]["options"][0]
    assert response.json()["escalation"]["decision"]["extra_seconds"] == offered["extra_seconds"]
    stack.run_until(lambda: stack.row(op["id"])["state"] == "escalated")  # escalated again
    again = stack.get(op["id"], operator=True)
    assert again["escalation"]["decided"] is False
    assert again["escalation"]["reason"] == "request_budget_exhausted"
    assert "Status requests: 5 of 5" in again["escalation"]["message"]
    assert len(status_reads(stack, op["remote_job_id"])) == 5


# --- cancel ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reason", ["request_budget_exhausted", "deadline_exceeded", "rate_limited"]
)
def test_cancel_hands_over_to_cancellation(stack: Scene, reason: str) -> None:
    op = escalate(stack, reason)
    job_id = op["remote_job_id"]
    response = decide(stack, op["id"], {"action": "cancel"})
    assert response.status_code == 200, response.text
    assert response.json()["state"] == "cancel_requested"
    assert response.json()["cancel_requested"] is True

    done = stack.wait(op["id"], timeout=15)
    assert done["state"] == "cancelled", (done["state"], done["escalation"])
    job = stack.sim_job(job_id)
    assert job["counts"]["cancel"] == 1
    assert job["state"] == "cancelled"
    path = [e["to"] for e in stack.history(op["id"]) if e["kind"] == "transition"]
    tail = path[path.index("cancel_requested") :]
    assert tail == ["cancel_requested", "cancelling", "cancelled"]
    # Confirming the cancellation stays within a (granted) status budget.
    # Never a request the budget did not charge; at most one charged and left unsent (the
    # deadline is checked again after the charge, just before transmission).
    seen = len(status_reads(stack, job_id))
    assert seen <= done["budget"]["status_requests_used"] <= seen + 1
    assert done["budget"]["status_requests_used"] <= done["budget"]["max_status_requests"]


# --- abandon -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reason",
    ["request_budget_exhausted", "deadline_exceeded", "unknown_state", "authorization_denied"],
)
def test_abandon_ends_as_the_escalation_says(stack: Scene, reason: str) -> None:
    op = escalate(stack, reason)
    reads_before = len(status_reads(stack, op["remote_job_id"]))
    expected = abandon_state(EscalationReason(reason)).value
    abandon = next(o for o in op["escalation"]["options"] if o["action"] == "abandon")
    assert expected in abandon["description"]

    response = decide(stack, op["id"], {"action": "abandon"})
    assert response.status_code == 200, response.text
    after = response.json()
    assert after["state"] == expected
    assert after["done"] is True
    assert after["escalation"]["decided"] is True
    assert after["escalation"]["decision"] == {"action": "abandon"}
    assert op["done"] is False and op["awaiting_decision"] is True
    assert after["awaiting_decision"] is False
    assert after["error"]["code"] == f"abandoned_{reason}"

    [entry] = decision_entries(stack, op["id"])
    assert entry["cause"] == "decision:abandon" and entry["actor"] == "operator:ops-1"
    stack.settled([op["id"]])  # idle, nothing due: no read can follow
    assert stack.get(op["id"])["state"] == expected
    assert len(status_reads(stack, op["remote_job_id"])) == reads_before


# --- refusals ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reason", "action"),
    [("authorization_denied", "cancel"), ("contract_violation", "extend")],
)
def test_option_not_offered_is_409(stack: Scene, reason: str, action: str) -> None:
    op = escalate(stack, reason)
    assert action not in [o["action"] for o in op["escalation"]["options"]]
    response = decide(stack, op["id"], {"action": action})
    assert response.status_code == 409
    assert "not offered" in response.json()["error"]["message"]
    unchanged(stack, op)
    assert decision_entries(stack, op["id"]) == []


def test_agent_token_is_403(stack: Scene) -> None:
    op = escalate(stack, "request_budget_exhausted")
    response = decide(stack, op["id"], {"action": "extend"}, operator=False)
    assert response.status_code == 403
    unchanged(stack, op)
    no_token = stack.client.post(f"/v1/operations/{op['id']}/decisions", json={"action": "cancel"})
    assert no_token.status_code == 401
    unchanged(stack, op)


def test_second_decision_is_409(stack: Scene) -> None:
    op = escalate(stack, "unknown_state")
    assert decide(stack, op["id"], {"action": "abandon"}).status_code == 200
    for body in ({"action": "extend"}, {"action": "abandon"}, {"action": "cancel"}):
        response = decide(stack, op["id"], body)
        assert response.status_code == 409, response.text
    assert len(decision_entries(stack, op["id"])) == 1
    assert stack.get(op["id"])["state"] == "failed"


def test_decision_without_an_open_escalation_is_409(stack: Scene) -> None:
    created = stack.create({"scenario": "never_finishes", "webhooks": "never"})
    op_id = created.json()["id"]
    response = decide(stack, op_id, {"action": "abandon"})
    assert response.status_code == 409
    # Nothing was decided: the operation goes on (its create may still be on its way).
    after = stack.get(op_id, operator=True)
    assert after["state"] in {"create_pending", "accepted", "observing"}
    assert after["escalation"] is None and after["done"] is False
    missing = decide(stack, "op_0000000000doesnotexist000", {"action": "abandon"})
    assert missing.status_code == 404


BAD_BODIES: list[Any] = [
    b"not json",
    b"",
    b"[]",
    {},
    {"action": "continue"},
    {"action": "EXTEND"},
    {"action": 1},
    {"action": "extend", "extra_seconds": -5},
    {"action": "extend", "extra_seconds": "60"},
    {"action": "extend", "extra_status_requests": 1.5},
    {"action": "extend", "extra_status_requests": 0},
    {"action": "cancel", "extra_seconds": 10},
    {"action": "abandon", "extra_status_requests": 2},
    {"action": "abandon", "why": "bored"},
    {"action": "abandon", "note": 5},
    {"action": "abandon", "note": ["why"]},
    {"action": "abandon", "note": "   "},
    {"action": "abandon", "note": "x" * 501},
    {"action": "abandon", "note": "red \u001b[31m"},
]


def test_bad_bodies_are_400(stack: Scene) -> None:
    op = escalate(stack, "request_budget_exhausted")
    for body in BAD_BODIES:
        response = decide(stack, op["id"], body)
        assert response.status_code == 400, (body, response.status_code, response.text)
        assert response.json()["error"]["message"]
    said = {
        repr(body["note"]): decide(stack, op["id"], body).json()["error"]["message"]
        for body in BAD_BODIES
        if isinstance(body, dict) and "note" in body
    }
    assert said == {
        "5": "'note' must be a string, got a number",
        "['why']": "'note' must be a string, got an array",
        "'   '": "'note' must not be empty",
        repr("x" * 501): "'note' must be at most 500 characters",
        repr("red \u001b[31m"): (
            "'note' must be plain text: no control characters but line breaks and tabs"
        ),
    }
    unchanged(stack, op)
    assert decision_entries(stack, op["id"]) == []


# --- the command line --------------------------------------------------------------------


def run_cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return forked.run([*args, "--config", str(config)], os.environ, ROOT)


def cli_config(tmp_path: Path, db_url: str) -> Path:
    path = tmp_path / "cli.toml"
    path.write_text(f'database_url = "{db_url}"\n')
    return path


@pytest.mark.parametrize("action", ["extend", "cancel", "abandon"])
def test_cli_decide_is_picked_up_by_the_service(
    live: Stack, tmp_path: Path, db_url: str, action: str, capsys: pytest.CaptureFixture[str]
) -> None:
    stack = live
    op = escalate(stack, "request_budget_exhausted")
    job_id = op["remote_job_id"]
    extra = ["--extra-requests", "2", "--extra-seconds", "30"] if action == "extend" else []
    note = ["--note", f"{action}: ticket OPS-1"]
    result = run_cli(
        cli_config(tmp_path, db_url), "decide", op["id"], action, *extra, *note, "--by", "ana"
    )
    assert result.returncode == 0, result.stderr
    assert f"{op['id']}: {action} recorded" in result.stdout

    [entry] = decision_entries(stack, op["id"])
    assert entry["actor"] == "operator:ana"
    assert entry["detail"]["note"] == f"{action}: ticket OPS-1"
    if action == "extend":
        assert entry["delay_source"] == "manual_extension"
        # The running service polls again (two more reads), then stops at the new limit.
        wait_until(lambda: len(status_reads(stack, job_id)) == 5)
        wait_until(lambda: stack.get(op["id"], operator=True)["escalation"]["decided"] is False)
        assert stack.get(op["id"], operator=True)["budget"]["max_status_requests"] == 5
    elif action == "cancel":
        done = stack.wait(op["id"], timeout=15)
        assert done["state"] == "cancelled", (done["state"], done["escalation"])
        assert stack.sim_job(job_id)["counts"]["cancel"] == 1
    else:
        after = stack.get(op["id"])
        assert after["state"] == "result_timed_out" and after["done"] is True
        assert after["escalation"]["decision"] == {
            "action": "abandon",
            "note": "abandon: ticket OPS-1",
        }

    if action != "extend":
        # The same command again (in this process: the same parser and handler).
        code = main(["decide", op["id"], "abandon", "--config", str(cli_config(tmp_path, db_url))])
        err = capsys.readouterr().err
        assert code == 1
        assert "no open escalation" in err  # one line; an unhandled error would raise here


@pytest.mark.parametrize("action", ["extend", "cancel"])
def test_decision_on_a_timed_out_operation_whose_callback_is_retrying(
    tmp_path: Path, db_url: str, action: str
) -> None:
    """The end state's completion (a callback that keeps failing) must not hold the reopened
    operation: after the decision it polls (or cancels) again, and no "completed" callback
    goes out for an operation that is running (the timed-out end's own callback says the
    operation awaits the decision)."""
    callbacks = {"base_delay_seconds": 5.0, "max_delay_seconds": 5.0}
    provider = {"polling": POLLING}
    with (
        serve_receiver() as (receiver, receiver_url),
        running_stack(tmp_path, db_url, provider=provider, callbacks=callbacks) as stack,
    ):
        receiver.script("down", [Reply(status=500)])
        request, fields = ESCALATE["deadline_exceeded"]
        created = stack.create(request, callback_url=f"{receiver_url}/cb/down", **fields)
        op_id = created.json()["id"]
        op = stack.wait_state(op_id, {"result_timed_out"}, timeout=15)
        assert op["state"] == "result_timed_out"
        wait_until(lambda: receiver.deliveries("down"))  # it failed; a retry is due in 2.5-5 s
        wait_until(
            lambda: hooks.completion_steps(stack.runtime.db, op_id)["callback"]["next_attempt_at"]
        )
        retry_at = hooks.completion_steps(stack.runtime.db, op_id)["callback"]["next_attempt_at"]
        reads = len(status_reads(stack, op["remote_job_id"]))

        body = (
            {"action": "extend", "extra_seconds": 60} if action == "extend" else {"action": action}
        )
        response = decide(stack, op_id, body)
        assert response.status_code == 200, response.text
        if action == "extend":
            wait_until(lambda: len(status_reads(stack, op["remote_job_id"])) > reads, timeout=4)
        else:
            wait_until(lambda: stack.get(op_id)["state"] == "cancelled", timeout=6)
        # Past the failed callback's retry time, with the worker seen at work after it: a
        # status read (extend), or the cancelled operation's own completion round.
        retry_epoch = utc(retry_at).timestamp()

        def looked_after_the_retry_time() -> bool:
            if time.time() <= retry_epoch:
                return False
            if quiescent(stack.runtime.db, op_id):
                return True  # nothing due and no lease: nothing can be sent any more
            if action == "extend":
                return any(r["at"] > retry_epoch for r in status_reads(stack, op["remote_job_id"]))
            return any(d.webhook_id == f"{op_id}_r2" for d in receiver.deliveries("down"))

        wait_until(looked_after_the_retry_time, timeout=15)
        for delivery in receiver.deliveries("down"):
            event = json.loads(delivery.body)
            sent = event["operation"]
            assert sent["done"] or sent["awaiting_decision"], sent["state"]
            assert sent["state"] in ("result_timed_out", "cancelled"), sent["state"]
