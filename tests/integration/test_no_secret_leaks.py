"""No secret appears in a log line, an API answer, an error, a metric or the database.

A full run of the real service process (JSON logs to a file) through success, failure,
a provider that refuses our credential, forged webhooks, an escalation, a cancel and an
agent callback; then every byte the service wrote or answered, and what the CLI commands
printed (run through its ``main`` in this process), is searched for the secrets it was
given.
"""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

from reconciler.demo.sim import SimConfig, SimState
from reconciler.demo.sim import create_app as create_sim
from tests.support import loopback
from tests.support.hooks import serve_receiver
from tests.support.process import cli_here, service_config, service_env, service_process
from tests.support.servers import serve_asgi
from tests.support.stack import CALLBACK_SECRET, SIM_TOKEN, WEBHOOK_SECRET
from tests.support.waiting import wait_until

AUDIT_KEY = "audit-key-that-must-never-show-1234"


def _secrets(agent: str, operator: str) -> dict[str, str]:
    found = {
        "provider token": SIM_TOKEN,
        "webhook secret": WEBHOOK_SECRET,
        "webhook secret body": WEBHOOK_SECRET.removeprefix("whsec_"),
        "callback secret": CALLBACK_SECRET,
        "callback secret body": CALLBACK_SECRET.removeprefix("whsec_"),
        "audit key": AUDIT_KEY,
        "agent token": agent,
        "operator token": operator,
    }
    for name in ("webhook secret body", "callback secret body"):
        found[f"{name} (bytes)"] = base64.b64decode(found[name]).decode("latin-1")
    return found


def _wait_all(client: httpx.Client, ids: list[str], headers: dict[str, str]) -> list[Any]:
    seen: list[Any] = []

    def settled() -> bool:
        seen[:] = [client.get(f"/v1/operations/{i}", headers=headers).json() for i in ids]
        return all(op["done"] or op["state"] == "escalated" for op in seen)

    wait_until(settled, 60, "every operation done or escalated", poll=0.1)
    return seen


def test_a_full_run_leaks_no_secret(tmp_path: Path, db_url: str) -> None:
    answers: list[str] = []
    sim = SimState(SimConfig(token=SIM_TOKEN, webhook_secret=WEBHOOK_SECRET))
    with serve_asgi(create_sim(state=sim)) as sim_url, serve_receiver() as (receiver, cb_url):
        config, port = service_config(
            tmp_path,
            db_url,
            sim_url,
            log_level="DEBUG",
            provider={"deadline_seconds": 20, "max_status_requests": 20},
        )
        env = service_env({"RECONCILER_AUDIT_KEY": AUDIT_KEY})
        assert cli_here(config, "db", "upgrade", env=env).returncode == 0
        made = [
            cli_here(config, "tokens", "create", "--name", name, "--scope", scope, env=env)
            for name, scope in (("agent-1", "agent"), ("ops-1", "operator"))
        ]
        agent, operator = (m.stdout.strip() for m in made)
        log = tmp_path / "service.log"
        with service_process(config, port, env=env, log=log) as service:
            sim.config.webhook_url = f"{service.url}/webhooks/sim"
            client = loopback.client(base_url=service.url, timeout=30)
            headers = {"Authorization": f"Bearer {agent}"}
            requests = [
                {"scenario": "success", "duration": 0.5},
                {"scenario": "late_failure", "duration": 0.5},
                {"scenario": "success", "duration": 0.5, "auth_fault": 401},
                {"scenario": "unknown_state", "duration": 0.3},
                {"scenario": "slow_success", "duration": 5},
            ]
            ids = []
            for i, request in enumerate(requests):
                response = client.post(
                    "/v1/operations",
                    headers=headers,
                    json={
                        "provider": "sim",
                        "request": request,
                        "idempotency_key": f"k{i}",
                        "callback_url": f"{cb_url}/cb/agent",
                    },
                )
                answers.append(response.text)
                ids.append(response.json()["id"])
            answers.append(
                client.post(
                    f"/v1/operations/{ids[-1]}/cancel",
                    headers=headers,
                    json={"reason": "leak test"},
                ).text
            )
            # Forged and broken deliveries, bad tokens, bad input.
            answers.append(
                client.post(
                    "/webhooks/sim",
                    content=b'{"x":1}',
                    headers={
                        "webhook-id": "evt_forged",
                        "webhook-timestamp": str(int(time.time())),
                        "webhook-signature": "v1," + base64.b64encode(b"0" * 32).decode(),
                    },
                ).text
            )
            answers.append(
                client.get("/v1/operations", headers={"Authorization": f"Bearer {agent}x"}).text
            )
            answers.append(client.post("/v1/operations", headers=headers, content=b"{").text)
            final = _wait_all(client, ids, headers)
            answers.extend(json.dumps(op) for op in final)
            for op_id in ids:
                answers.append(
                    client.get(
                        f"/v1/operations/{op_id}/history",
                        headers={"Authorization": f"Bearer {operator}"},
                    ).text
                )
            answers.append(client.get("/metrics").text)
            answers.append(client.get("/openapi.json").text)
            operator_headers = {"Authorization": f"Bearer {operator}"}
            answers.append(client.get("/v1/providers", headers=operator_headers).text)
            client.close()
        assert {op["state"] for op in final} >= {"succeeded", "failed", "escalated"}
        assert receiver.deliveries(), "the callback path was not exercised"
        answers.append(cli_here(config, "ops", "list", env=env).stdout)
        answers.append(cli_here(config, "ops", "history", ids[0], env=env).stdout)
        verify = cli_here(config, "audit", "verify", env=env)
        assert verify.returncode == 0, verify.stderr
        answers.append(verify.stdout + verify.stderr)

    engine = sa.create_engine(db_url)
    with engine.connect() as conn:
        dump = "\n".join(
            repr(row)
            for table in (
                "operations",
                "history",
                "webhook_events",
                "escalations",
                "completion_steps",
                "api_tokens",
            )
            for row in conn.execute(sa.text(f"SELECT * FROM {table}"))
        )
    engine.dispose()
    logs = log.read_text("utf-8", errors="replace")
    assert '"trace_id"' in logs or "trace_id" in logs  # JSON lines carry the trace id
    places = {"logs": logs, "answers": "\n".join(answers), "database": dump}
    for secret_name, secret in _secrets(agent, operator).items():
        for place, text in places.items():
            assert secret not in text, f"the {secret_name} appears in the {place}"
