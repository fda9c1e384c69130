"""The create path over real HTTP: ambiguous creates are reconciled to exactly one job.

The service and the simulated provider run on uvicorn on loopback. Each test asserts
what the provider saw (jobs and requests per idempotency token), what the history
holds and what the API answers.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from fixtures.provider_sim import FaultRates

from reconciler.storage.models import Operation
from tests.support.stack import Stack, running_stack

# Short waits everywhere: a retry after an ambiguous create comes within ~0.2 s.
FAST_POLLING = {"base_delay_seconds": 0.1, "max_delay_seconds": 0.5}
OPS = Operation.__table__  # type: ignore[attr-defined]


def token_of(stack: Stack, op_id: str) -> str:
    """The idempotency token the service sends to the provider for this operation."""
    with stack.runtime.db.read() as conn:
        token = conn.execute(sa.select(OPS.c.idempotency_token).where(OPS.c.id == op_id)).scalar()
    assert isinstance(token, str) and token
    return token


def key_report(stack: Stack, token: str) -> dict[str, Any]:
    """The sim's view of one idempotency key: its jobs and every request that carried it."""
    response = httpx.get(f"{stack.sim_url}/_sim/keys/{token}", timeout=10)
    response.raise_for_status()
    report: dict[str, Any] = response.json()
    return report


def requests_by_endpoint(report: dict[str, Any], endpoint: str) -> list[dict[str, Any]]:
    return [r for r in report["requests"] if r["endpoint"] == endpoint]


def transitions(history: list[dict[str, Any]]) -> list[tuple[str | None, str | None]]:
    return [(e["from"], e["to"]) for e in history if e["kind"] == "transition"]


def accepted_entry(history: list[dict[str, Any]]) -> dict[str, Any]:
    found = [e for e in history if e["kind"] == "transition" and e["to"] == "accepted"]
    assert len(found) == 1, history
    return found[0]


def start(stack: Stack, request: dict[str, Any]) -> str:
    response = stack.create(request)
    assert response.status_code == 202, response.text
    op_id: str = response.json()["id"]
    return op_id


# --- ambiguous creates: dropped answer, answer past the timeout, 500 after the job was made ----

AMBIGUOUS = {
    # the job is made, then the connection closes without an answer
    "drop": {"create_fault": "drop"},
    # the job is made, the answer comes after the service's 1 s create timeout
    "delay": {"create_fault": "delay", "create_delay": 3},
    # the job is made, then the provider answers 500
    "500_after_create": {"create_fault": "500_after_create"},
}


@pytest.mark.parametrize("fault", sorted(AMBIGUOUS))
def test_ambiguous_create_is_reconciled_by_lookup_to_one_job(
    tmp_path: Path, db_url: str, fault: str
) -> None:
    provider = {"polling": FAST_POLLING, "create": {"timeout_seconds": 1}}
    with running_stack(tmp_path, db_url, provider=provider) as stack:
        op_id = start(stack, {"duration": 0.3, **AMBIGUOUS[fault]})
        op = stack.wait(op_id, timeout=40)
        assert op["state"] == "succeeded", op
        token = token_of(stack, op_id)
        report = key_report(stack, token)
        history = stack.history(op_id)

    assert [j["job_id"] for j in report["jobs"]] == [op["remote_job_id"]]
    assert ("create_pending", "create_unknown") in transitions(history)
    assert ("create_unknown", "accepted") in transitions(history)
    # The job id came from the lookup by token; no second create was sent.
    assert accepted_entry(history)["detail"]["via"] == "lookup"
    assert accepted_entry(history)["detail"]["job_id"] == op["remote_job_id"]
    assert len(requests_by_endpoint(report, "create")) == 1
    lookups = requests_by_endpoint(report, "lookup")
    assert lookups and lookups[-1]["status"] == 200


@pytest.mark.parametrize("fault", sorted(AMBIGUOUS))
def test_ambiguous_create_is_reconciled_by_resending_the_same_token_without_lookup(
    tmp_path: Path, db_url: str, fault: str
) -> None:
    provider = {"polling": FAST_POLLING, "create": {"timeout_seconds": 1}}
    with running_stack(tmp_path, db_url, provider=provider, drop=("lookup",)) as stack:
        assert stack.runtime.providers["sim"].lookup is None
        op_id = start(stack, {"duration": 0.3, **AMBIGUOUS[fault]})
        op = stack.wait(op_id, timeout=40)
        assert op["state"] == "succeeded", op
        token = token_of(stack, op_id)
        report = key_report(stack, token)
        history = stack.history(op_id)

    assert [j["job_id"] for j in report["jobs"]] == [op["remote_job_id"]]
    assert ("create_pending", "create_unknown") in transitions(history)
    assert ("create_unknown", "accepted") in transitions(history)
    assert accepted_entry(history)["detail"]["via"] == "create"
    creates = requests_by_endpoint(report, "create")
    # Every create carried the same token; the resend was answered with the first job.
    assert len(creates) >= 2
    assert {c["job_id"] for c in creates} == {op["remote_job_id"]}
    assert requests_by_endpoint(report, "lookup") == []


def test_create_unknown_is_visible_while_reconciling(tmp_path: Path, db_url: str) -> None:
    """The agent sees create_unknown (not done, told not to resubmit) until the lookup lands."""
    # A long backoff keeps the operation in create_unknown long enough to be read.
    provider = {"polling": {"base_delay_seconds": 3, "max_delay_seconds": 3, "jitter_floor": 1.0}}
    with running_stack(tmp_path, db_url, provider=provider) as stack:
        op_id = start(stack, {"duration": 0.3, "create_fault": "500_after_create"})
        op = stack.wait_state(op_id, {"create_unknown"}, timeout=20)
        assert op["state"] == "create_unknown", op
        assert op["done"] is False
        assert op["remote_job_id"] is None
        assert "do not resubmit" in op["message"]
        final = stack.wait(op_id, timeout=40)
        token = token_of(stack, op_id)
        report = key_report(stack, token)
    assert final["state"] == "succeeded", final
    assert [j["job_id"] for j in report["jobs"]] == [final["remote_job_id"]]


# --- a provider that breaks its idempotency contract ------------------------------------


def _seed_for(kinds: list[str]) -> int:
    """A sim seed whose fault draws (drop below 0.5, delay above) come out as ``kinds``."""
    for seed in range(1000):
        rng = random.Random(seed)
        if all((rng.random() < 0.5) == (kind == "drop") for kind in kinds):
            return seed
    raise AssertionError("no seed found")


def test_a_second_job_for_the_same_token_escalates_contract_violation(
    tmp_path: Path, db_url: str
) -> None:
    """Seed 001: an unfamiliar job id for the same token is an incident; neither id is chosen.

    The provider ignores the idempotency key and its lookup index lags (jobs are invisible
    for 4 s). The first create makes job 1 and its answer is dropped; the lookup does not
    see job 1 yet, so the service resends with the same token; the provider makes job 2
    and answers it 4.5 s later; the confirming lookup by token then returns job 1 (the
    first visible job for the token). Only the first lookup must come within 4 s of the
    drop, which leaves room on a busy machine.
    """
    sim_config = {
        "honor_idempotency": False,
        # One seeded draw per create: the first is dropped, the second delayed.
        "seed": _seed_for(["drop", "delay"]),
        "endpoint_faults": {"create": FaultRates(drop=0.5, delay=0.5, delay_seconds=4.5)},
    }
    request = {"duration": 30, "invisible_for": 4, "webhooks": "never"}
    provider = {"polling": FAST_POLLING, "create": {"timeout_seconds": 10}}
    with running_stack(tmp_path, db_url, provider=provider, sim_config=sim_config) as stack:
        op_id = start(stack, request)
        op = stack.wait_state(op_id, {"escalated"}, timeout=30)
        token = token_of(stack, op_id)
        report = key_report(stack, token)
        history = stack.history(op_id)

    assert op["state"] == "escalated", op
    assert op["done"] is False
    assert op["escalation"]["reason"] == "contract_violation"
    # No job id was silently chosen.
    assert op["remote_job_id"] is None
    jobs = [j["job_id"] for j in report["jobs"]]
    assert len(jobs) == 2
    creates = requests_by_endpoint(report, "create")
    assert [c["fault"] for c in creates] == ["drop", "delay"]
    assert [c["job_id"] for c in creates] == jobs
    # The history tells it all: the lookup that found nothing (why it resent), the resend's
    # job 2 and the confirming lookup's job 1.
    seen = [(e["cause"], e["detail"].get("job_id")) for e in history if e["kind"] == "observation"]
    assert seen == [
        ("create_response", None),
        ("lookup_response", None),
        ("create_response", jobs[1]),
        ("lookup_response", jobs[0]),
    ], history
    assert not any(e["to"] in ("accepted", "observing") for e in history)
    last = [e for e in history if e["kind"] == "transition"][-1]
    assert (last["from"], last["to"]) == ("create_unknown", "escalated")
    assert jobs[0] in last["detail"]["detail"] and jobs[1] in last["detail"]["detail"]


# --- definitive rejection ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "status", "message"),
    [
        ("unauthorized", 401, "credentials refused"),
        ("forbidden", 403, "this account may not create such jobs"),
    ],
)
def test_a_definitive_rejection_fails_with_the_provider_error_kept(
    tmp_path: Path, db_url: str, fault: str, status: int, message: str
) -> None:
    with running_stack(tmp_path, db_url, provider={"polling": FAST_POLLING}) as stack:
        op_id = start(stack, {"create_fault": fault})
        op = stack.wait(op_id, timeout=40)
        token = token_of(stack, op_id)
        report = key_report(stack, token)
        history = stack.history(op_id)

    assert op["state"] == "failed", op
    assert op["done"] is True
    assert op["remote_job_id"] is None
    assert op["error"]["http_status"] == status
    assert op["error"]["provider_error"]["error"]["message"] == message
    assert "FAILED" in op["message"]
    assert report["jobs"] == []
    # A refusal is not ambiguous: one create, no lookup, no resend.
    assert [r["status"] for r in requests_by_endpoint(report, "create")] == [status]
    assert requests_by_endpoint(report, "lookup") == []
    assert ("create_pending", "failed") in transitions(history)
    assert "create_unknown" not in {e["to"] for e in history}
