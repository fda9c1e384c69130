"""The last defence: stored text no encoder can write never makes a door fail.

Before provider answers were checked, a status answer's error with a NUL and a lone
surrogate was stored; then ``GET /v1/operations/{id}`` and ``/wait`` answered 500, the
list failed on every page holding it (for its agent and for operators), the console's
operation page answered 500 and MCP ``get_job`` an empty body. Here such a row is
written directly (as one stored then would be) and read through every door: each
answers, and shows the text with visible escapes. One poisoned row never breaks a list.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest
import sqlalchemy as sa

from reconciler.core.clock import SystemClock
from reconciler.outbound.callbacks import CallbackClient
from reconciler.storage import operations as store
from reconciler.storage.operation_reads import view_of
from reconciler.storage.tables import HISTORY, OPS, PAYLOAD_TABLE
from tests.support import loopback
from tests.support.console import operator_client
from tests.support.hooks import serve_receiver
from tests.support.mcp import rpc_headers, tool_call
from tests.support.process import cli
from tests.support.stack import Stack

pytestmark = pytest.mark.both_backends

BAD = "bad\x00nul \ud800 x"
SHOWN = "bad\\u0000nul \\ud800 x"
NEVER = {"scenario": "never_finishes", "webhooks": "never"}


def poison(stack: Stack, op_id: str) -> None:
    """Write provider text no database should have taken, as it was stored before."""
    db = stack.runtime.db
    with db.write() as conn:
        row = store.load_operation(conn, op_id)
        values: dict[str, Any] = {
            "error": {"code": "provider_failed", "provider_error": {"message": BAD}},
            "progress": {"note": BAD, f"k{BAD}": 1},
        }
        if db.sqlite:
            values["remote_state"] = "queued\x00"  # PostgreSQL's text refuses a NUL outright
        conn.execute(sa.update(OPS).where(OPS.c.id == op_id).values(**values))
        result = {"data": {"rows": [BAD]}, "summary": {"note": BAD}, "failed_items": [BAD]}
        conn.execute(
            sa.insert(PAYLOAD_TABLE).values(operation_id=op_id, name="result", value=result)
        )
        conn.execute(
            sa.insert(HISTORY).values(
                operation_id=op_id,
                seq=row.history_seq + 1,
                at=datetime.now(UTC),
                kind="observation",
                actor="worker:old",
                cause="status_read",
                detail={"remote_state": BAD, "http_status": 200},
                prev_hash=row.history_head,
                hash="0" * 64,
            )
        )


@pytest.fixture
def poisoned(stack: Stack) -> Iterator[str]:
    # Parked once escalated: nothing the worker does rewrites the row after it is poisoned.
    op_id = stack.create(NEVER, max_status_requests=1).json()["id"]
    stack.wait_state(op_id, {"escalated"})
    poison(stack, op_id)
    yield op_id


def shows_escaped(value: Any) -> None:
    text = json.dumps(value)  # ensure_ascii: the text as it arrived, escapes and all
    assert json.dumps(SHOWN)[1:-1] in text, text[:500]
    assert "\\ud800" not in text.replace("\\\\ud800", "")  # no lone surrogate came through


def test_the_api_shows_stored_text_escaped_at_every_door(stack: Stack, poisoned: str) -> None:
    healthy = stack.create(NEVER).json()["id"]
    for operator in (False, True):
        headers = stack.headers(operator)
        got = stack.client.get(f"/v1/operations/{poisoned}", headers=headers)
        assert got.status_code == 200, got.text
        assert got.json()["error"]["detail"]["provider_error"]["message"] == SHOWN
        assert got.json()["progress"]["detail"] == {"note": SHOWN, f"k{SHOWN}": 1}
        assert got.json()["result"]["data"] == {"rows": [SHOWN]}
        waited = stack.client.get(
            f"/v1/operations/{poisoned}/wait", params={"timeout_seconds": 0.1}, headers=headers
        )
        assert waited.status_code == 200 and waited.json()["id"] == poisoned
        listed = stack.client.get("/v1/operations", params={"limit": 50}, headers=headers)
        assert listed.status_code == 200, listed.text
        ids = [op["id"] for op in listed.json()["operations"]]
        assert poisoned in ids and healthy in ids  # one poisoned row never breaks a list
        history = stack.client.get(f"/v1/operations/{poisoned}/history", headers=headers)
        assert history.status_code == 200, history.text
        shows_escaped(history.json())


def test_the_console_shows_stored_text_escaped(stack: Stack, poisoned: str) -> None:
    with closing(operator_client(stack.url, stack.operator_token)) as client:
        page = client.get(f"/console/operations/{poisoned}")
        assert page.status_code == 200, page.text[:500]
        assert "\\ud800" in page.text and "\ud800" not in page.text
        inbox = client.get("/console")
        assert inbox.status_code == 200 and poisoned in inbox.text


def test_mcp_shows_stored_text_escaped(stack: Stack, poisoned: str) -> None:
    for name, arguments in (("get_job", {"id": poisoned}), ("list_jobs", {"limit": 50})):
        answer = loopback.post(
            f"{stack.url}/mcp",
            content=tool_call(name, arguments),
            headers=rpc_headers(stack.agent_token, "tools/call", name),
            timeout=30,
        )
        assert answer.status_code == 200 and answer.text, answer.text
        result = answer.json()["result"]
        assert not result.get("isError"), result
        shows_escaped(result["structuredContent"])


def test_the_command_line_shows_stored_text_escaped(
    stack: Stack, poisoned: str, tmp_path: Path
) -> None:
    config = tmp_path / "cli.toml"
    config.write_text(f"database_url = {json.dumps(stack.runtime.settings.database_url)}\n")
    # A process of its own: its stdout is UTF-8, as a terminal's, which a lone surrogate
    # cannot be written to.
    for args in (("show", poisoned), ("list",), ("history", poisoned)):
        done = cli(config, "ops", *args)
        assert done.returncode == 0, done.stderr
        assert poisoned in done.stdout
    assert SHOWN in cli(config, "ops", "show", poisoned).stdout  # JSON's own escapes
    assert "\\ud800" in cli(config, "ops", "history", poisoned).stdout


def test_the_callback_body_shows_stored_text_escaped(stack: Stack, poisoned: str) -> None:
    with stack.runtime.db.read() as conn:
        view = view_of(conn, store.load_operation(conn, poisoned), SystemClock().now())
    key = stack.runtime.callback_key
    assert key is not None

    async def deliver(url: str) -> int | None:
        client = CallbackClient(signing_key=key, allow_hosts=("127.0.0.1",), clock=SystemClock())
        try:
            event = {"type": "operation.completed", "operation": view}
            outcome = await client.deliver(f"{url}/cb/agent", poisoned, event)
        finally:
            await client.aclose()
        return outcome.http_status

    with serve_receiver() as (receiver, url):
        assert anyio.run(deliver, url) == 204
        [delivery] = receiver.deliveries("agent")
    body = json.loads(delivery.body)
    assert body["operation"]["error"]["detail"]["provider_error"]["message"] == SHOWN
