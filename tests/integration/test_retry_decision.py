"""``retry``, the ``internal_error`` option, through every door an operator decides at.

The service runs on uvicorn against the poison provider (its adapter's result fetch
raises for the poisoned job), with retries a few milliseconds apart, so an operation
escalates ``internal_error`` within a second. ``retry`` on the HTTP decisions endpoint,
``reconciler decide`` and the console's option button each send the operation back to
the step that failed with its failure count started afresh: it fails twice more and
asks again. The file has no ``[cancel]``, so ``cancel`` is not offered.
"""

from __future__ import annotations

import html
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from tests.support.console import csrf_of, operator_client
from tests.support.poison_provider import PoisonProvider, provider_table
from tests.support.process import cli_here
from tests.support.servers import serve_asgi
from tests.support.stack import Stack, running_stack
from tests.support.waiting import wait_until

ATTEMPTS = 2


@pytest.fixture
def stack(tmp_path: Path, db_url: str) -> Iterator[Stack]:
    poison = PoisonProvider()
    with serve_asgi(poison.app) as url:
        poison.base_url = url
        scheduler = {
            "step_retry_base_seconds": 0.02,
            "step_retry_max_seconds": 0.05,
            "step_retry_attempts": ATTEMPTS,
        }
        with running_stack(
            tmp_path, db_url, table=lambda _: provider_table(url), scheduler=scheduler
        ) as s:
            yield s


def escalated(stack: Stack, op_id: str, decided: int = 0) -> dict[str, Any]:
    """The operation once its internal_error escalation (after ``decided`` decided ones) is open."""

    def open_again() -> dict[str, Any] | None:
        op = stack.get(op_id, operator=True)
        history = stack.client.get(f"/v1/operations/{op_id}/history", headers=stack.headers(True))
        escalations = [e for e in history.json()["entries"] if e["kind"] == "escalation"]
        ready = op["state"] == "escalated" and len(escalations) == decided + 1
        return op if ready else None

    op: dict[str, Any] = wait_until(open_again, 20, f"{op_id} to escalate again")
    assert op["escalation"]["reason"] == "internal_error"
    assert [o["action"] for o in op["escalation"]["options"]] == ["retry", "abandon"]
    return op


def attempts(stack: Stack, op_id: str) -> list[int]:
    history = stack.client.get(f"/v1/operations/{op_id}/history", headers=stack.headers(True))
    return [
        e["detail"]["attempt"] for e in history.json()["entries"] if e["cause"] == "step_failed"
    ]


def poisoned(stack: Stack) -> str:
    created = stack.create({"poison": "raise"})
    assert created.status_code == 202, created.text
    op_id: str = created.json()["id"]
    escalated(stack, op_id)
    return op_id


def test_retry_on_the_decisions_endpoint_runs_the_step_again(stack: Stack) -> None:
    op_id = poisoned(stack)
    answer = stack.client.post(
        f"/v1/operations/{op_id}/decisions", json={"action": "retry"}, headers=stack.headers(True)
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["state"] in ("result_collecting", "escalated")
    escalated(stack, op_id, decided=1)
    assert attempts(stack, op_id) == [1, 2, 1, 2]
    # Not offered where it was not: cancel, or a second decision on the decided one.
    refused = stack.client.post(
        f"/v1/operations/{op_id}/decisions", json={"action": "cancel"}, headers=stack.headers(True)
    )
    assert refused.status_code == 409 and "'cancel' was not offered" in refused.text


def test_reconciler_decide_retry(stack: Stack, tmp_path: Path) -> None:
    op_id = poisoned(stack)
    config = tmp_path / "cli.toml"
    config.write_text(f'database_url = "{stack.runtime.settings.database_url}"\n')
    done = cli_here(config, "decide", op_id, "retry", "--by", "ana")
    assert done.returncode == 0, done.stderr
    assert f"{op_id}: retry recorded" in done.stdout
    stack.runtime.notifier.wake()
    escalated(stack, op_id, decided=1)
    assert attempts(stack, op_id) == [1, 2, 1, 2]


def test_the_console_offers_retry_as_a_button(stack: Stack) -> None:
    op_id = poisoned(stack)
    with closing(operator_client(stack.url, stack.operator_token)) as client:
        page = html.unescape(client.get(f"/console/operations/{op_id}").text)
        assert 'data-action="retry"' in page and 'data-action="cancel"' not in page
        assert "retry the step that failed" in page
        confirm = client.get(f"/console/operations/{op_id}/confirm", params={"action": "retry"})
        assert confirm.status_code == 200, confirm.text
        escalation = stack.get(op_id, operator=True)
        form = {"csrf": csrf_of(confirm.text), "action": "retry"}
        done = client.post(f"/console/operations/{op_id}/decisions", data=form)
        assert done.status_code == 303, done.text
        assert done.headers["location"].endswith(f"/operations/{op_id}#decided")
        shown = html.unescape(client.get(done.headers["location"]).text)
        assert "Decision recorded: ran the failed step again — ops-1" in shown
    escalated(stack, op_id, decided=1)
    assert escalation["escalation"]["decided"] is False
    assert attempts(stack, op_id) == [1, 2, 1, 2]
