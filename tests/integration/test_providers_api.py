"""``GET /v1/providers`` for agents and operators, and ``request_schema`` at intake."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from reconciler.storage import trust
from tests.support.console import operator_client
from tests.support.stack import SIM_TOKEN, WEBHOOK_SECRET, Stack, running_stack

SCHEMA = {
    "type": "object",
    "required": ["scenario"],
    "properties": {"scenario": {"type": "string", "enum": ["success", "partial"]}},
}


@pytest.fixture
def stack(tmp_path: Path, db_url: str) -> Iterator[Stack]:
    with running_stack(tmp_path, db_url, provider={"request_schema": SCHEMA}) as running:
        yield running


def count(stack: Stack) -> int:
    with stack.runtime.db.read() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM operations")).scalar_one())


def test_agents_see_what_they_may_start(stack: Stack) -> None:
    response = stack.client.get("/v1/providers", headers=stack.headers())
    assert response.status_code == 200
    (sim,) = response.json()["providers"]
    assert sim == {
        "name": "sim",
        "preset": None,
        "description": sim["description"],
        "request_schema": SCHEMA,
        "set_by_service": [],
        "can_cancel": True,
        "max_deadline_seconds": 120.0,
        "max_status_requests": 60,
    }
    assert sim["description"].startswith("A simulated job provider")


def test_operators_also_see_webhook_settings_but_never_a_secret(stack: Stack) -> None:
    response = stack.client.get("/v1/providers", headers=stack.headers(operator=True))
    text = response.text
    (sim,) = response.json()["providers"]
    assert sim["webhook"] == {
        "scheme": "standard-webhooks",
        "tolerance_seconds": 300,
        "max_body_bytes": 262144,
        "event_id": "header:webhook-id",
        "job_id": "/data/job_id",
        "secrets_env": "SIM_WEBHOOK_SECRETS",
        "secrets_set": True,
    }
    trust = sim["webhook_trust"]
    assert (trust["mode"], trust["state"], trust["trust_after"]) == ("adaptive", "learning", 20)
    assert {"webhook_first_share", "misses", "last_verified_webhook_at"} <= set(trust)
    assert WEBHOOK_SECRET not in text and WEBHOOK_SECRET.removeprefix("whsec_") not in text
    assert SIM_TOKEN not in text


def test_both_doors_read_webhook_trust_off_the_event_loop(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    read: list[tuple[str, bool]] = []
    real = trust.trust_views

    def spy(conn: Any, policies: Any) -> Any:
        try:
            asyncio.get_running_loop()
            read.extend((provider, True) for provider in policies)
        except RuntimeError:
            read.extend((provider, False) for provider in policies)
        return real(conn, policies)

    monkeypatch.setattr(trust, "trust_views", spy)
    api = stack.client.get("/v1/providers", headers=stack.headers(operator=True))
    assert api.status_code == 200 and api.json()["providers"][0]["webhook_trust"]
    with closing(operator_client(stack.url, stack.operator_token)) as console:
        page = console.get("/console/providers")
    assert page.status_code == 200 and "provider-sim" in page.text
    assert read == [("sim", False), ("sim", False)], "a trust read ran on the event loop"


def test_no_token_is_401(stack: Stack) -> None:
    response = stack.client.get("/v1/providers")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthenticated"


@pytest.mark.parametrize(
    ("request_", "fragment"),
    [
        ({}, "'request.scenario' is required by the request_schema of provider 'sim'"),
        ({"scenario": "explode"}, "'request.scenario' does not match"),
    ],
)
def test_a_request_that_fails_the_schema_is_400_and_stores_nothing(
    stack: Stack, request_: dict[str, object], fragment: str
) -> None:
    response = stack.create(request_, idempotency_key="schema")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_request"
    assert fragment in response.json()["error"]["message"]
    assert count(stack) == 0
    accepted = stack.create({"scenario": "success", "duration": 0.1}, idempotency_key="schema")
    assert accepted.status_code == 202, json.dumps(accepted.json())


def test_a_provider_names_its_preset_and_what_the_service_sets(
    tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from reconciler.providers import loader

    presets = tmp_path / "presets"
    presets.mkdir()
    (presets / "sim_like.toml").write_text(
        "# The simulator, as a preset.\n[http]\nmax_connections = 3\n"
    )
    monkeypatch.setattr(loader, "PRESETS_DIR", presets)
    provider = {"preset": "sim_like", "create": {"set": {"/tag": "{operation_id}"}}}
    with running_stack(tmp_path, db_url, provider=provider) as stack:
        assert stack.runtime.providers["sim"].http.max_connections == 3
        for operator in (False, True):
            response = stack.client.get("/v1/providers", headers=stack.headers(operator=operator))
            (sim,) = response.json()["providers"]
            assert (sim["preset"], sim["set_by_service"]) == ("sim_like", ["/tag"])
