"""Google's hour-long tokens through google-auth, against a token endpoint of the tests'
own on loopback that verifies the service account's signed assertion (RFC 7523) and
issues tokens an API then refuses once they expire.

A job longer than a token's life succeeds with no 401, with far fewer token requests
than status reads; a token endpoint that refuses the account is authorization_denied.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from fixtures.runs_api import TOKEN, RunsApi

from tests.support.runs_rig import runs_table
from tests.support.servers import serve_asgi
from tests.support.steps import StepRig, step_rig
from tests.support.token_authority import GOOGLE_SCOPE, TokenAuthority, service_account_file

pytestmark = pytest.mark.anyio

SLOW = {"base_delay_seconds": 240, "max_delay_seconds": 300, "deadline_seconds": 6 * 3600}


@pytest.fixture
def authority(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TokenAuthority]:
    authority = TokenAuthority()
    with serve_asgi(authority.google_app(), lifespan="off") as url:
        key_file = tmp_path / "service-account.json"
        authority.public_key = service_account_file(key_file, f"{url}/token")
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key_file))
        yield authority


@asynccontextmanager
async def google_rig(
    tmp_path: Path, db_url: str, api: RunsApi, authority: TokenAuthority
) -> AsyncIterator[StepRig]:
    table = runs_table(
        auth={"type": "google", "scopes": [GOOGLE_SCOPE]},
        polling={**SLOW, "max_status_requests": 200},
    )
    handler = authority.guarded(api.handle, "no-token-host.test", TOKEN)
    async with step_rig(tmp_path, db_url, table=table, handler=handler) as rig:
        authority.clock = rig.clock
        yield rig


async def test_a_batch_longer_than_a_token_runs_on_refreshed_tokens(
    tmp_path: Path, db_url: str, authority: TokenAuthority
) -> None:
    api = RunsApi(finish_after_gets=40)
    async with google_rig(tmp_path, db_url, api, authority) as rig:
        op_id = rig.submit({"task": "predict"})
        await rig.run(op_id, ["succeeded"])
        op = rig.row(op_id)
        hours = (op.updated_at - op.created_at).total_seconds() / 3600
        assert hours > 2 and api.calls["get"] >= 39
        assert authority.refused_calls == 0
        assert 2 <= authority.requests <= hours + 2  # about one token an hour
        source = rig.runtime.adapters["sim"].credential.source  # type: ignore[attr-defined]
        assert source == "Google Application Default Credentials: a service account file"


async def test_an_account_the_endpoint_refuses_is_authorization_denied(
    tmp_path: Path, db_url: str, authority: TokenAuthority
) -> None:
    authority.refuse = True
    api = RunsApi()
    async with google_rig(tmp_path, db_url, api, authority) as rig:
        op_id = rig.submit({"task": "predict"})
        op = await rig.step(op_id)
        assert op.state == "failed" and op.error["code"] == "authorization_denied"
        assert "Google refused the credential" in op.error["provider_message"]
        assert api.calls["submit"] == 0 and authority.requests == 1
