"""One input rule at every door: text no database can store is refused by field, before any
lookup or write, on SQLite and on PostgreSQL.

A NUL (``\\u0000``) is legal JSON and legal in a URL (``%00``), and SQLite stores it, but
PostgreSQL's text and jsonb refuse it: before the rule, a NUL in an operation id, a
filter or an idempotency key reached the driver and answered 500 with an error-level
traceback, and one inside ``request`` or ``metadata`` was stored on SQLite. A lone
surrogate cannot be encoded at all. The HTTP API answers 400 naming the field, an MCP
tool a tool error, a task request ``-32602``, the console 400 and the CLI one line.
Duplicate member names (two parsers reading one body differently) are a 400, and a
body that does not say it is JSON a 415.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from starlette.requests import Request

from reconciler.cli import main as cli_main
from reconciler.console.web import read_form
from reconciler.core.errors import InvalidRequest
from tests.support import loopback
from tests.support.mcp import rpc_body, rpc_headers, tool_call
from tests.support.stack import CALLBACK_SECRET, Stack

NUL = "\u0000"
SURROGATE = "\ud800"


@pytest.fixture
def errors_logged(caplog: pytest.LogCaptureFixture) -> Iterator[list[logging.LogRecord]]:
    """The error-level records of the test (a refused input is never one)."""
    caplog.set_level(logging.INFO)
    found: list[logging.LogRecord] = []
    yield found
    found.extend(r for r in caplog.records if r.levelno >= logging.ERROR)
    assert not found, [r.getMessage() for r in found]


def _json(stack: Stack, operator: bool = False) -> dict[str, str]:
    return {**stack.headers(operator=operator), "Content-Type": "application/json"}


def _refused(response: httpx.Response, field: str, status: int = 400) -> None:
    assert response.status_code == status, response.text
    assert f"'{field}'" in response.json()["error"]["message"], response.text


def _stored(stack: Stack) -> list[Any]:
    listing = stack.client.get("/v1/operations?done=false", headers=stack.headers())
    done = stack.client.get("/v1/operations?done=true", headers=stack.headers())
    return [*listing.json()["operations"], *done.json()["operations"]]


# -- the HTTP API --------------------------------------------------------------------------

CREATES = {
    "idempotency_key": {"idempotency_key": f"k{NUL}"},
    "request": {"request": {"name": f"a{NUL}b"}},
    "request nested": {"request": {"a": [{"b": {"c": NUL}}]}},
    "request member name": {"request": {f"k{NUL}": 1}},
    "metadata": {"metadata": {"note": NUL}},
    "metadata member name": {"metadata": {"deep": {f"{NUL}": "x"}}},
    "callback_url": {"callback_url": f"http://127.0.0.1/{NUL}"},
}


@pytest.mark.parametrize("case", list(CREATES))
def test_a_nul_anywhere_in_a_create_is_400_naming_the_field_and_nothing_is_stored(
    stack: Stack, case: str, errors_logged: list[logging.LogRecord]
) -> None:
    body = {"provider": "sim", "request": {}, **CREATES[case]}
    response = stack.client.post("/v1/operations", json=body, headers=stack.headers())
    _refused(response, case.split(" ")[0])
    assert "NUL" in response.json()["error"]["message"]
    assert _stored(stack) == []


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/operations/op_%00x"),
        ("GET", "/v1/operations/op_%00x/history"),
        ("GET", "/v1/operations/op_%00x/wait?timeout_seconds=0"),
        ("POST", "/v1/operations/op_%00x/cancel"),
    ],
)
def test_a_nul_in_an_operation_id_is_400_before_any_lookup(
    stack: Stack, method: str, path: str, errors_logged: list[logging.LogRecord]
) -> None:
    _refused(stack.client.request(method, path, headers=stack.headers()), "id")


def test_a_nul_in_the_id_of_a_decision_is_400(
    stack: Stack, errors_logged: list[logging.LogRecord]
) -> None:
    response = stack.client.post(
        "/v1/operations/op_%00x/decisions", json={"action": "abandon"}, headers=_json(stack, True)
    )
    _refused(response, "id")


@pytest.mark.parametrize("query", ["provider=%00", "state=%00", "cursor=%00", "provider=a%00b"])
def test_a_nul_in_a_list_filter_is_400(
    stack: Stack, query: str, errors_logged: list[logging.LogRecord]
) -> None:
    response = stack.client.get(f"/v1/operations?{query}", headers=stack.headers())
    _refused(response, query.split("=")[0])


def test_a_nul_in_a_history_cursor_is_400(
    stack: Stack, errors_logged: list[logging.LogRecord]
) -> None:
    op_id = stack.create({"scenario": "never_finishes", "webhooks": "never"}).json()["id"]
    response = stack.client.get(
        f"/v1/operations/{op_id}/history?cursor=%00", headers=stack.headers()
    )
    _refused(response, "cursor")


def test_a_nul_in_a_cancel_reason_is_400(
    stack: Stack, errors_logged: list[logging.LogRecord]
) -> None:
    op_id = stack.create({"scenario": "never_finishes", "webhooks": "never"}).json()["id"]
    response = stack.client.post(
        f"/v1/operations/{op_id}/cancel", json={"reason": f"x{NUL}"}, headers=stack.headers()
    )
    _refused(response, "reason")
    assert stack.get(op_id)["state"] != "cancel_pending"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/operations", '{"provider":"sim","request":{},"provider":"other"}'),
        ("/v1/operations", '{"provider":"sim","request":{"a":1,"a":2}}'),
        ("/v1/operations/op_x/cancel", '{"reason":"a","reason":"b"}'),
    ],
)
def test_duplicate_member_names_are_400(stack: Stack, path: str, body: str) -> None:
    response = stack.client.post(path, content=body, headers=_json(stack))
    assert response.status_code == 400, response.text
    assert "appears twice" in response.json()["error"]["message"]
    assert _stored(stack) == []


def test_a_body_that_is_not_declared_json_is_415(stack: Stack) -> None:
    body = '{"provider":"sim","request":{}}'
    for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = stack.headers()
        if content_type:
            headers["Content-Type"] = content_type
        response = stack.client.post("/v1/operations", content=body, headers=headers)
        assert response.status_code == 415, response.text
        assert "application/json" in response.json()["error"]["message"]
    assert _stored(stack) == []
    typed = {**stack.headers(), "Content-Type": "application/merge-patch+json; charset=utf-8"}
    assert stack.client.post("/v1/operations", content=body, headers=typed).status_code == 202
    # A cancel without a body needs no type; one with a body does.
    op_id = _stored(stack)[0]["id"]
    plain = {**stack.headers(), "Content-Type": "text/plain"}
    cancel = stack.client.post(f"/v1/operations/{op_id}/cancel", content="{}", headers=plain)
    assert cancel.status_code == 415
    assert stack.client.post(f"/v1/operations/{op_id}/cancel", headers=stack.headers()).is_success


# -- MCP: tools, and the tasks path ----------------------------------------------------------


def _mcp(stack: Stack, body: str, method: str = "tools/call", name: str | None = None) -> Any:
    response = loopback.post(
        f"{stack.url}/mcp", content=body, headers=rpc_headers(stack.agent_token, method, name)
    )
    return response


@pytest.mark.parametrize("bad", [SURROGATE, NUL])
@pytest.mark.parametrize(
    ("tool", "field"), [("get_job", "id"), ("cancel_job", "id"), ("list_jobs", "provider")]
)
def test_an_unstorable_tool_argument_is_a_tool_error_naming_it(
    stack: Stack, tool: str, field: str, bad: str, errors_logged: list[logging.LogRecord]
) -> None:
    response = _mcp(stack, tool_call(tool, {field: f"op_{bad}"}), name=tool)
    assert response.status_code == 200, response.text
    result = response.json()["result"]
    assert result["isError"] is True
    assert f"'{field}'" in result["content"][0]["text"]


def test_an_unstorable_start_job_argument_is_a_tool_error_and_nothing_is_stored(
    stack: Stack, errors_logged: list[logging.LogRecord]
) -> None:
    for arguments in (
        {"provider": "sim", "request": {"a": NUL}},
        {"provider": "sim", "request": {}, "metadata": {NUL: 1}},
        {"provider": "sim", "request": {}, "idempotency_key": SURROGATE},
    ):
        result = _mcp(stack, tool_call("start_job", arguments), name="start_job").json()["result"]
        assert result["isError"] is True, result
    assert _stored(stack) == []


@pytest.mark.parametrize("bad", [SURROGATE, NUL])
@pytest.mark.parametrize("method", ["tasks/get", "tasks/cancel", "tasks/update"])
def test_an_unstorable_task_id_is_invalid_params_not_an_internal_error(
    stack: Stack, method: str, bad: str, errors_logged: list[logging.LogRecord]
) -> None:
    body = rpc_body(method, {"taskId": f"op_{bad}"})
    response = _mcp(stack, body, method=method, name="op_")
    error = response.json()["error"]
    assert error["code"] == -32602, error
    assert "'taskId'" in error["message"]


def test_get_job_does_not_echo_a_huge_id(stack: Stack) -> None:
    huge = "x" * 900_000
    response = _mcp(stack, tool_call("get_job", {"id": huge}), name="get_job")
    assert response.status_code == 200
    assert len(response.content) < 2_000
    assert "900000 characters" in response.json()["result"]["content"][0]["text"]
    unknown = _mcp(stack, tool_call("y" * 900_000, {}), name="y")
    assert len(unknown.content) < 2_000


# -- the console ---------------------------------------------------------------------------


def test_a_nul_in_a_console_form_is_400_naming_the_field() -> None:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"csrf=x&action=a%00b", "more_body": False}

    scope = {
        "type": "http",
        "method": "POST",
        "headers": [(b"content-type", b"application/x-www-form-urlencoded")],
    }
    with pytest.raises(InvalidRequest, match="'action' holds a NUL"):
        anyio.run(read_form, Request(scope, receive))


# -- the CLI -------------------------------------------------------------------------------


CREATE = ["tokens", "create", "--name", "a", "--scope", "agent"]
ROTATE = ["tokens", "rotate-callback-secret", "--name", "a"]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ([*CREATE, "--expires-in", "5"], "a unit"),
        ([*CREATE, "--expires-in", "100000000000d"], "at most 3660 days"),
        ([*ROTATE, "--window", "99999999999d"], "at most"),
        ([*ROTATE, "--window", "30"], "a unit"),
        (["tokens", "create", "--name", "a\udcff", "--scope", "agent"], "'--name'"),
        (["ops", "show", "op_\udcff"], "'operation'"),
    ],
)
def test_the_cli_refuses_bad_arguments_in_one_line(
    args: list[str],
    says: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RECONCILER_CONFIG", raising=False)
    monkeypatch.setenv("RECONCILER_CALLBACK_SECRET", CALLBACK_SECRET)
    monkeypatch.setenv("RECONCILER_DATABASE_URL", f"sqlite:///{tmp_path / 'never-made.db'}")
    assert cli_main(args) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err
    assert not (tmp_path / "never-made.db").exists()
