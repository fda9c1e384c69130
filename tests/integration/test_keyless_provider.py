"""A provider that takes no idempotency key, through the live service: HTTP, MCP, CLI, console.

The service runs on uvicorn with the simulated provider taking creates without an
idempotency key (``require_idempotency_key = false``), described by a file with ``idempotency =
"none"``, no ``[lookup]`` and a ``[create.set]`` field. A request holding the set
field is refused (API 400, MCP tool error), nothing stored; a create whose answer is
dropped after the job was made escalates ``create_unknown`` and is sent again only on
an operator's ``resend`` (API, ``reconciler decide``, the console's button), exactly
once per decision, and each resend made the provider's job count go up by one.
"""

from __future__ import annotations

import copy
import os
import uuid
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.support import forked
from tests.support.console import csrf_of, operator_client
from tests.support.mcp import connect, run, text_of
from tests.support.stack import QUICK_POLLING, ROOT, Stack, running_stack, sim_provider_table

SET_FIELD = "/metadata/reconciler_key"


def keyless_table(sim_url: str) -> dict[str, Any]:
    table = copy.deepcopy(sim_provider_table(sim_url))
    table["create"].pop("idempotency_header")
    table["create"]["idempotency"] = "none"
    table["create"]["set"] = {SET_FIELD: "{idempotency_key}"}
    table.pop("lookup")
    table["polling"].update(QUICK_POLLING)
    table["headers"] = {"anthropic-version": "2023-06-01"}
    return table


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, module_db_url: str) -> Iterator[Stack]:
    with running_stack(
        tmp_path_factory.mktemp("keyless"),
        module_db_url,
        table=keyless_table,
        sim_config={"require_idempotency_key": False},
    ) as s:
        yield s


def operations(stack: Stack) -> int:
    with stack.runtime.db.read() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM operations")).scalar_one())


def creates(stack: Stack) -> int:
    return sum(1 for r in stack.sim.requests if r.endpoint == "create")


def jobs_for(stack: Stack, marker: str) -> int:
    return sum(1 for job in stack.sim.jobs.values() if job.body.get("marker") == marker)


def lost_create(stack: Stack) -> tuple[dict[str, Any], str]:
    """A create whose answer the provider drops after making the job: create_unknown."""
    marker = uuid.uuid4().hex
    created = stack.create({"scenario": "never_finishes", "create_fault": "drop", "marker": marker})
    assert created.status_code == 202, created.text
    op = stack.wait_state(created.json()["id"], {"escalated"}, timeout=20)
    assert op["state"] == "escalated", op
    assert op["escalation"]["reason"] == "create_unknown"
    return op, marker


def test_a_request_holding_a_set_field_is_a_400_and_an_mcp_tool_error(stack: Stack) -> None:
    before = operations(stack), creates(stack)
    request = {"scenario": "success", "metadata": {"reconciler_key": "mine"}}
    response = stack.create(request)
    assert response.status_code == 400
    assert SET_FIELD in response.json()["error"]["message"]

    async def main() -> None:
        async with connect(stack.url, stack.agent_token) as client:
            started = await client.call_tool("start_job", {"provider": "sim", "request": request})
            assert started.is_error and SET_FIELD in text_of(started)

    run(main)
    assert (operations(stack), creates(stack)) == before


def test_a_lost_create_is_never_resent_without_a_decision(stack: Stack) -> None:
    op, marker = lost_create(stack)
    options = {o["action"]: o["description"] for o in op["escalation"]["options"]}
    assert set(options) == {"abandon", "resend"}
    assert "a duplicate job may result" in options["resend"]
    stack.settled([op["id"]])
    assert jobs_for(stack, marker) == 1


def decide(stack: Stack, op_id: str, action: str) -> dict[str, Any]:
    response = stack.client.post(
        f"/v1/operations/{op_id}/decisions",
        json={"action": action},
        headers=stack.headers(operator=True),
    )
    assert response.status_code == 200, response.text
    decided: dict[str, Any] = response.json()
    return decided


def test_resend_over_the_api_and_the_cli_each_send_one_create(
    stack: Stack, tmp_path: Path, module_db_url: str
) -> None:
    op, marker = lost_create(stack)
    assert decide(stack, op["id"], "resend")["state"] in ("create_unknown", "escalated")
    # The same request, so its answer is dropped again: a second job, a second escalation.
    again = stack.wait_state(op["id"], {"escalated"}, timeout=20)
    assert again["escalation"]["decided"] is False
    stack.settled([op["id"]])
    assert jobs_for(stack, marker) == 2

    config = tmp_path / "cli.toml"
    config.write_text(f'database_url = "{module_db_url}"\n')
    cli_args = ["--config", str(config)]
    result = forked.run(["decide", op["id"], "resend", "--by", "ana", *cli_args], os.environ, ROOT)
    assert result.returncode == 0, result.stderr
    assert f"{op['id']}: resend recorded" in result.stdout
    third = stack.wait_state(op["id"], {"escalated"}, timeout=20)
    assert third["escalation"]["decided"] is False
    stack.settled([op["id"]])
    assert jobs_for(stack, marker) == 3
    actors = [
        e["actor"] for e in stack.history(op["id"]) if e["cause"] == "create_resend_authorized"
    ]
    assert actors == ["operator:ops-1", "operator:ana"]


def test_the_console_offers_resend_and_abandon_with_the_warning(stack: Stack) -> None:
    op, marker = lost_create(stack)
    with closing(operator_client(stack.url, stack.operator_token)) as ops:
        page = ops.get(f"/console/operations/{op['id']}")
        assert page.status_code == 200
        assert 'data-action="resend"' in page.text and 'data-action="abandon"' in page.text
        confirm = ops.get(f"/console/operations/{op['id']}/confirm", params={"action": "resend"})
        assert confirm.status_code == 200, confirm.text
        assert "a duplicate job may result" in confirm.text
        done = ops.post(
            f"/console/operations/{op['id']}/decisions",
            data={"action": "resend", "csrf": csrf_of(confirm.text)},
        )
        assert done.status_code == 303, done.text
    again = stack.wait_state(op["id"], {"escalated"}, timeout=20)
    assert again["escalation"]["decided"] is False
    stack.settled([op["id"]])
    assert jobs_for(stack, marker) == 2
