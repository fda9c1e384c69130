"""The create path over real HTTP: ambiguous creates are reconciled to exactly one job.

Every create outcome (lost answers, refusals, retryable answers, the create deadline, a
second job for one token, a held cancel) is proven step by step in
``tests/steps/test_create_step.py``. Here the service and the simulated provider run on
uvicorn on loopback, so a dropped connection and an answer past the client's timeout
are real ones. Each test asserts what the provider saw (jobs and requests per
idempotency token), what the history holds and what the API answers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from reconciler.storage.tables import OPS
from tests.support import loopback
from tests.support.stack import Stack, running_stack

# Short waits everywhere: a retry after an ambiguous create comes within ~0.2 s.
FAST_POLLING = {"base_delay_seconds": 0.1, "max_delay_seconds": 0.5}


def token_of(stack: Stack, op_id: str) -> str:
    """The idempotency token the service sends to the provider for this operation."""
    with stack.runtime.db.read() as conn:
        token = conn.execute(sa.select(OPS.c.idempotency_token).where(OPS.c.id == op_id)).scalar()
    assert isinstance(token, str) and token
    return token


def key_report(stack: Stack, token: str) -> dict[str, Any]:
    """The sim's view of one idempotency key: its jobs and every request that carried it."""
    response = loopback.get(f"{stack.sim_url}/_sim/keys/{token}", timeout=10)
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


@pytest.mark.parametrize("fault", ["drop", "delay"])
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


@pytest.mark.parametrize("fault", ["500_after_create"])
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


# --- a provider that breaks its idempotency contract ------------------------------------


# --- definitive rejection ----------------------------------------------------------------
