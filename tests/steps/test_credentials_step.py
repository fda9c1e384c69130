"""Credentials that expire: fetched before first use, refreshed before they expire (never
per call), renewed once after a 401, and refused without a loop.

The provider is ``fixtures/runs_api.py`` behind a token authority of the tests' own
(``tests/support/token_authority.py``) that issues tokens on the test's clock and
answers 401 to a token that expired, was revoked, or was never issued.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fixtures.runs_api import TOKEN, RunsApi

from tests.support.runs_rig import runs_table
from tests.support.steps import StepRig, step_rig
from tests.support.token_authority import CLIENT_ID, CLIENT_SECRET, TokenAuthority

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

TOKEN_HOST = "auth.test"
OAUTH2 = {
    "type": "oauth2",
    "token_url": f"http://{TOKEN_HOST}/oauth2/token",
    "client_id_env": "RUNS_CLIENT_ID",
    "client_secret_env": "RUNS_CLIENT_SECRET",
    "scope": "runs.read runs.write",
}
CLIENT = {"RUNS_CLIENT_ID": CLIENT_ID, "RUNS_CLIENT_SECRET": CLIENT_SECRET}
# A job that runs for hours, read every few minutes.
SLOW = {"base_delay_seconds": 240, "max_delay_seconds": 300, "deadline_seconds": 6 * 3600}


@asynccontextmanager
async def oauth2_rig(
    tmp_path: Path, db_url: str, api: RunsApi
) -> AsyncIterator[tuple[StepRig, TokenAuthority]]:
    """The runs API behind a token authority on the rig's clock, reached with oauth2."""
    authority = TokenAuthority()
    table = runs_table(auth=OAUTH2, polling={**SLOW, "max_status_requests": 200})
    handler = authority.guarded(api.handle, TOKEN_HOST, TOKEN)
    async with step_rig(tmp_path, db_url, table=table, handler=handler, environ=CLIENT) as rig:
        authority.clock = rig.clock
        yield rig, authority


async def started(rig: StepRig) -> tuple[str, str]:
    op_id = rig.submit({"task": "export"})
    op = await rig.step(op_id)
    assert op.state == "observing" and op.remote_job_id is not None
    return op_id, op.remote_job_id


async def test_a_job_longer_than_its_tokens_never_meets_a_401(tmp_path: Path, db_url: str) -> None:
    api = RunsApi(finish_after_gets=40)
    async with oauth2_rig(tmp_path, db_url, api) as (rig, authority):
        op_id, _ = await started(rig)
        await rig.run(op_id, ["succeeded"])
        reads = api.calls["get"]
        hours = (rig.row(op_id).updated_at - rig.row(op_id).created_at).total_seconds() / 3600
        assert hours > 2 and reads >= 39
        assert authority.refused_calls == 0  # no call ever carried an expired token
        # One token an hour (refreshed a tenth of its life early), never one per call.
        assert authority.requests <= hours + 2
        assert authority.requests * 10 < reads
        # No token is kept anywhere an agent or an operator reads.
        kept = str(rig.history(op_id)) + str(rig.view(op_id))
        assert not any(token in kept for token in authority.tokens)


async def test_a_revoked_token_is_renewed_once_and_the_call_sent_again(
    tmp_path: Path, db_url: str
) -> None:
    api = RunsApi()
    async with oauth2_rig(tmp_path, db_url, api) as (rig, authority):
        op_id, run_id = await started(rig)
        authority.revoke_all()  # the provider rotated its keys: every token out is dead
        api.finish(run_id)
        await rig.run(op_id, ["succeeded"])
        assert authority.refused_calls == 1  # the one answer that led to a fresh token
        renewed = [e for e in rig.history(op_id) if (e.detail or {}).get("credential_renewed")]
        assert len(renewed) == 1 and renewed[0].detail["http_status"] == 200
        assert authority.requests == 2


async def test_a_credential_a_fresh_token_does_not_cure_is_authorization_denied(
    tmp_path: Path, db_url: str
) -> None:
    """The API refuses every token (the client lost its grant): two token requests and
    two status calls, then a person decides; never a loop."""
    api = RunsApi()
    async with oauth2_rig(tmp_path, db_url, api) as (rig, authority):
        op_id, _ = await started(rig)
        authority.lifetime_seconds = -1.0  # every token it issues from now on is dead
        authority.revoke_all()
        op = await rig.run(op_id, ["escalated"])
        assert rig.view(op_id)["escalation"]["reason"] == "authorization_denied"
        assert authority.refused_calls == 2 and api.calls["get"] == 0
        assert authority.requests <= 3
        assert op.status_requests_used == 1


async def test_a_token_endpoint_that_refuses_us_is_asked_once_not_per_call(
    tmp_path: Path, db_url: str
) -> None:
    api = RunsApi()
    async with oauth2_rig(tmp_path, db_url, api) as (rig, authority):
        op_id, _ = await started(rig)
        authority.refuse = True
        authority.revoke_all()
        await rig.run(op_id, ["escalated"])
        message = rig.view(op_id)["escalation"]["message"]
        assert "authorization_denied" in message
        assert "refused this client (HTTP 401: invalid_client: unknown client)" in message
        asked = authority.requests
        # A second job now: its create is not sent, and the endpoint is not asked again
        # before its retry delay.
        second = rig.submit({"task": "again"})
        op = await rig.step(second)
        assert op.state == "failed" and op.error["code"] == "authorization_denied"
        assert authority.requests == asked and api.calls["submit"] == 1
        assert CLIENT_SECRET not in str(rig.history(second)) + str(rig.view(second))


async def test_a_token_file_rotates_without_a_restart(tmp_path: Path, db_url: str) -> None:
    """A mounted secret: the file is swapped (a new inode, as Kubernetes does) and the next
    call carries the new token; an API that rotated first gets one 401, then the file."""
    path = tmp_path / "token"
    accepted = {"one"}
    seen: list[str] = []
    api = RunsApi()

    def handler(request: Any) -> Any:
        token = request.headers.get("authorization", "").removeprefix("Bearer ")
        seen.append(token)
        if token not in accepted:
            return _unauthorized()
        request.headers["authorization"] = f"Bearer {TOKEN}"
        return api.handle(request)

    _swap(path, "one\n")
    table = runs_table(auth={"type": "bearer", "token_file": str(path)})
    async with step_rig(tmp_path, db_url, table=table, handler=handler) as rig:
        op_id, run_id = await started(rig)
        _swap(path, "two")
        accepted.add("two")
        rig.advance_to_due(op_id)
        await rig.tick()
        assert seen[-1] == "two"
        # The API rotates first: the read gets a 401, the file is read again, and once
        # the file has the new token the call goes out again.
        accepted.clear()
        accepted.add("three")
        _swap(path, "three")
        os.utime(path, ns=(0, 0))  # a timestamp the change check cannot tell apart
        api.finish(run_id)
        await rig.run(op_id, ["succeeded"])
        assert seen.count("three") >= 2 and "Bearer" not in str(rig.history(op_id))


def _swap(path: Path, text: str) -> None:
    fresh = path.with_suffix(".new")
    fresh.write_text(text)
    fresh.replace(path)


def _unauthorized() -> Any:
    return httpx.Response(401, json={"message": "unknown token"})
