"""``/mcp`` under the service's own limits.

Before: ``GET /mcp`` held an SSE stream open for ever (a ping every 15 s) that outlived
its token, so one agent's 300 streams made every other request 503 at connect; bodies
up to the SDK's ~4 MB were buffered (a 2 MB ``request`` was stored, which the API
refuses); a client hanging up mid-body was an error-level traceback; a quota refusal
was JSON-RPC error code 0. Now: POST only (405 otherwise), the API's body limit and
parser, a per-token cap on open requests, requests ended when their token is revoked
or expires, disconnects at info, quota refusals as tool errors with a retry time.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from reconciler.config import LimitSettings
from reconciler.demo.sim import SimConfig, SimState
from reconciler.demo.sim import create_app as create_sim
from reconciler.inbound.auth import CACHE_SECONDS
from reconciler.runtime import TOKEN_RECHECK_SECONDS
from reconciler.storage.tokens import create_token, revoke_token
from tests.faults.test_front_door import SLACK, refusals
from tests.support import loopback
from tests.support.mcp import rpc_body, rpc_headers, tool_call
from tests.support.process import cli, service_config, service_process
from tests.support.servers import serve_asgi
from tests.support.stack import SIM_TOKEN, WEBHOOK_SECRET, Stack, running_stack
from tests.support.waiting import wait_until

# A job read once, then not for 15 s (its provider's hint): its wait stays open, since it
# neither ends nor stops for a decision (a wait returns when one becomes pending).
NEVER = {"scenario": "never_finishes", "webhooks": "never", "poll_after_seconds": 15}
# A revoked token's open request ends within the cache window, one re-check and slack.
REVOKED_WITHIN = CACHE_SECONDS + TOKEN_RECHECK_SECONDS + 2.0


def _post(url: str, token: str, body: str, method: str = "tools/call", **kw: Any) -> httpx.Response:
    headers = {**rpc_headers(token, method, kw.pop("name", None)), **kw.pop("headers", {})}
    return loopback.post(f"{url}/mcp", content=body, headers=headers, timeout=kw.pop("timeout", 30))


def _list(url: str, token: str) -> httpx.Response:
    return _post(url, token, rpc_body("tools/list", {}), "tools/list")


def _agent(stack: Stack, name: str, expires_in: float | None = None) -> str:
    now = stack.runtime.clock.now()
    expires = now + timedelta(seconds=expires_in) if expires_in is not None else None
    with stack.runtime.db.write() as conn:
        return create_token(conn, name, "agent", now, expires)


def _revoke(stack: Stack, name: str) -> float:
    with stack.runtime.db.write() as conn:
        revoke_token(conn, name, stack.runtime.clock.now())
    return time.monotonic()


@dataclass
class _Wait:
    """A wait_job on /mcp in a thread: when it ended, and how."""

    thread: threading.Thread
    ended: list[tuple[float, int]]
    text: list[str]


# The 2025-11-25 wire: the answer is an SSE stream from the first byte.
LEGACY = {"MCP-Protocol-Version": "2025-11-25"}


def _waiting(
    stack: Stack, token: str, seconds: float = 25.0, headers: dict[str, str] | None = None
) -> _Wait:
    created = stack.client.post(
        "/v1/operations",
        json={"provider": "sim", "request": NEVER},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert created.status_code == 202, created.text
    body = tool_call("wait_job", {"id": created.json()["id"], "timeout_seconds": seconds})
    ended: list[tuple[float, int]] = []
    text: list[str] = []

    def run() -> None:
        try:
            answer = _post(
                stack.url, token, body, name="wait_job", timeout=60, headers=headers or {}
            )
            status = answer.status_code
            text.append(answer.text)
        except httpx.HTTPError:
            status = -1
        ended.append((time.monotonic(), status))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return _Wait(thread, ended, text)


@pytest.fixture
def capped(tmp_path: Path, db_url: str) -> Iterator[Stack]:
    with running_stack(tmp_path, db_url, server={"mcp_requests_per_agent": 2}) as s:
        yield s


def test_get_is_405_and_holds_no_stream(stack: Stack) -> None:
    headers = {**stack.headers(), "Accept": "text/event-stream"}
    started = time.monotonic()
    response = loopback.get(f"{stack.url}/mcp", headers=headers, timeout=5)
    assert response.status_code == 405
    assert response.headers["allow"] == "POST"
    assert "stateless" in response.json()["error"]["message"]
    assert time.monotonic() - started < 2
    assert loopback.delete(f"{stack.url}/mcp", headers=stack.headers()).status_code == 405


def test_the_api_body_limit_holds_on_mcp(stack: Stack) -> None:
    limit = stack.runtime.settings.server.max_body_bytes
    padding = rpc_body("tools/list", {"pad": "x" * (limit + 10)})
    response = _post(stack.url, stack.agent_token, padding, "tools/list")
    assert response.status_code == 413
    error = response.json()["error"]
    assert error["code"] == -32600 and f"limit of {limit} bytes" in error["message"]
    big = tool_call("start_job", {"provider": "sim", "request": {"a": "x" * 2_000_000}})
    assert _post(stack.url, stack.agent_token, big, name="start_job").status_code == 413
    listed = stack.client.get("/v1/operations?done=false", headers=stack.headers())
    assert listed.json()["operations"] == []


def test_mcp_bodies_are_read_by_the_strict_parser(stack: Stack) -> None:
    twice = '{"jsonrpc":"2.0","id":1,"id":2,"method":"tools/list","params":{}}'
    response = _post(stack.url, stack.agent_token, twice, "tools/list")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == -32700
    assert "appears twice" in response.json()["error"]["message"]
    plain = _post(
        stack.url,
        stack.agent_token,
        rpc_body("tools/list", {}),
        "tools/list",
        headers={"Content-Type": "text/plain"},
    )
    assert plain.status_code == 415


def test_one_token_cannot_hold_more_than_its_share_and_revoking_it_ends_its_requests(
    capped: Stack,
) -> None:
    token = _agent(capped, "agent-greedy")
    waits = [_waiting(capped, token) for _ in range(2)]
    deadline = time.monotonic() + 30
    while True:
        # A wait answered early (a 503 while a loaded machine's storage is busy, at its door
        # or at its first read) holds nothing: start it again, until two are open when the
        # probe is refused and still open after the checks below.
        waits = [_waiting(capped, token) if w.ended else w for w in waits]
        probe = _list(capped.url, token)
        assert time.monotonic() < deadline, (
            f"the two waits never held the token's share: {[(w.ended, w.text) for w in waits]}"
        )
        if probe.status_code == 200:
            continue
        assert probe.status_code == 429 and probe.headers["retry-after"] == "1"
        assert probe.json()["error"]["code"] == -32000
        assert "mcp_requests_per_agent" in probe.json()["error"]["message"]
        # Everyone else is still served: another agent on /mcp, the API, the probes.
        assert _list(capped.url, capped.agent_token).status_code == 200
        assert capped.client.get("/healthz").status_code == 200
        if not any(w.ended for w in waits):
            break

    revoked_at = _revoke(capped, "agent-greedy")
    for wait in waits:
        wait.thread.join(timeout=REVOKED_WITHIN + 5)
        assert wait.ended, "a revoked token's wait is still open"
        ended_at, status = wait.ended[0]
        assert ended_at - revoked_at <= REVOKED_WITHIN, ended_at - revoked_at
        assert status == 401
    assert _list(capped.url, token).status_code == 401


def test_a_request_open_when_its_token_expires_is_ended(stack: Stack) -> None:
    token = _agent(stack, "agent-brief", expires_in=3.0)
    started = time.monotonic()
    wait = _waiting(stack, token)
    wait.thread.join(timeout=3.0 + REVOKED_WITHIN + 5)
    assert wait.ended
    ended_at, status = wait.ended[0]
    assert status == 401 and ended_at - started <= 3.0 + REVOKED_WITHIN


def test_a_legacy_stream_open_at_revocation_ends_with_an_error_event(stack: Stack) -> None:
    token = _agent(stack, "agent-legacy")
    wait = _waiting(stack, token, headers=LEGACY)
    # The wait is registered on the server.
    wait_until(lambda: stack.runtime.notifier._waiters, 10, "the legacy wait to start")
    revoked_at = _revoke(stack, "agent-legacy")
    wait.thread.join(timeout=REVOKED_WITHIN + 5)
    assert wait.ended and wait.ended[0][0] - revoked_at <= REVOKED_WITHIN
    assert '"error"' in wait.text[0] and "the request was ended" in wait.text[0]
    # And the wait itself is gone, not left running.
    wait_until(lambda: not stack.runtime.notifier._waiters, 5, "the revoked token's wait to end")


def test_a_client_hanging_up_mid_body_is_logged_at_info(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    where = urlsplit(stack.url)
    head = (
        f"POST /mcp HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {stack.agent_token}\r\n"
        "Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
        "Content-Length: 5000\r\n\r\n"
    ).encode()
    with socket.create_connection((where.hostname, where.port)) as sock:
        sock.sendall(head + b'{"jsonrpc":' + b" " * 100)
    registry = stack.runtime.metrics.registry
    wait_until(
        lambda: registry.get_sample_value(
            "reconciler_client_disconnects_total", {"endpoint": "mcp"}
        ),
        10,
        "the disconnect to be counted",
    )
    lines = [r for r in caplog.records if "client disconnected" in r.getMessage()]
    assert lines and all(r.levelno == logging.INFO and r.exc_info is None for r in lines)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def _limits(stack: Stack, **values: Any) -> None:
    object.__setattr__(stack.runtime.settings, "limits", LimitSettings(**values))


@pytest.mark.parametrize(
    ("limits", "retry"),
    [({"max_operations_in_flight": 1}, "5 s"), ({"max_creates_per_minute": 1}, " s.")],
)
def test_a_quota_refusal_on_start_job_is_a_tool_error_with_the_retry_time(
    stack: Stack, limits: dict[str, int], retry: str
) -> None:
    _limits(stack, **limits)
    start = {"provider": "sim", "request": NEVER}
    first = _post(stack.url, stack.agent_token, tool_call("start_job", start), name="start_job")
    assert "error" not in first.json(), first.text
    again = tool_call("start_job", {**start, "request": {**NEVER, "i": 2}})
    refused = _post(stack.url, stack.agent_token, again, name="start_job").json()
    assert "error" not in refused, refused  # not a JSON-RPC error (it was code 0)
    result = refused["result"]
    text = result["content"][0]["text"]
    assert result["isError"] is True and "Call start_job again in" in text and retry in text


async def _drip_body(port: int, token: str, drip: float) -> float:
    """A /mcp POST whose body never finishes; how long until the server closed it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    opened = time.monotonic()
    writer.write(
        (
            f"POST /mcp HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
            "Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
        ).encode()
    )
    try:
        while not reader.at_eof():
            try:
                await asyncio.wait_for(reader.read(200), drip)
            except TimeoutError:
                writer.write(b" ")
                await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()
    return time.monotonic() - opened


def test_the_front_door_deadlines_hold_on_mcp(tmp_path: Path) -> None:
    """The real process: a /mcp body that drips is cut at the body deadline, counted."""
    sim = SimState(SimConfig(token=SIM_TOKEN, webhook_secret=WEBHOOK_SECRET))
    with serve_asgi(create_sim(state=sim)) as sim_url:
        db_url = f"sqlite:///{tmp_path / 'reconciler.db'}"
        server = {"header_timeout_seconds": 1.0, "body_timeout_seconds": 1.0}
        config, port = service_config(tmp_path, db_url, sim_url, server=server)
        assert cli(config, "db", "upgrade").returncode == 0
        made = cli(config, "tokens", "create", "--name", "a", "--scope", "agent")
        assert made.returncode == 0, made.stderr
        with service_process(config, port) as svc:
            took = asyncio.run(_drip_body(port, made.stdout.strip(), drip=0.2))
            assert took <= 1.0 + SLACK
            assert refusals(svc.url).get("body_timeout", 0) >= 1
        assert "Traceback" not in svc.log.read_text()
