"""SIGKILL of a real service process inside a completion hook, then a restart.

The service runs as ``python -m reconciler serve`` in a subprocess; the provider
simulator and the agent's callback receiver run in the test process.
"""

from __future__ import annotations

import os
import signal
from contextlib import ExitStack
from pathlib import Path

import pytest

from reconciler.core.clock import SystemClock
from reconciler.demo.sim import SimConfig, SimState
from reconciler.demo.sim import create_app as create_sim
from reconciler.storage.database import Database
from reconciler.storage.tokens import create_token
from tests.support import hooks, loopback
from tests.support.hooks import serve_receiver
from tests.support.process import service_process
from tests.support.servers import serve_asgi, unused_port
from tests.support.stack import (
    CALLBACK_SECRET,
    SIM_TOKEN,
    SIM_TOML,
    WEBHOOK_SECRET,
    quiescent,
)
from tests.support.waiting import wait_until

HOOKS = (hooks.RECORD, hooks.SLOW, hooks.AUDIT)
SLOW_STEP = f"hook:{hooks.SLOW}"
# The restarted service takes over once the killed one's lease has expired.
LEASE_SECONDS = 5

pytestmark = [pytest.mark.slow, pytest.mark.both_backends]


def write_config(tmp_path: Path, db_url: str, sim_url: str, port: int) -> Path:
    providers = tmp_path / "providers"
    providers.mkdir()
    text = SIM_TOML.read_text("utf-8").replace('"http://127.0.0.1:9000"', f'"{sim_url}"')
    assert sim_url in text
    (providers / "sim.toml").write_text(text, "utf-8")
    config = tmp_path / "reconciler.toml"
    hook_list = ", ".join(f'"{h}"' for h in HOOKS)
    config.write_text(
        f'database_url = "{db_url}"\n'
        f'providers_dir = "{providers}"\n'
        f"hooks = [{hook_list}]\n"
        'log_level = "WARNING"\n'
        f'[server]\nhost = "127.0.0.1"\nport = {port}\n'
        f"[scheduler]\ntick_seconds = 0.2\nlease_seconds = {LEASE_SECONDS}\n"
        '[callbacks]\nallow_hosts = ["127.0.0.1"]\n',
        "utf-8",
    )
    return config


def test_sigkill_inside_a_hook_reruns_only_that_step_with_the_same_key(
    tmp_path: Path, db_url: str
) -> None:
    """The honest guarantee for a crash in the middle of a step.

    A step that *finished* is recorded and never runs again. A step that was
    interrupted (marked running, never done) may have had its effect, and the
    service cannot know: it runs again after the restart with the SAME
    idempotency key, so the hook can make its own side effect idempotent. It then
    finishes once, and the steps after it (the next hook, the callback) run once.
    """
    log = tmp_path / "hooks.log"
    db = Database(db_url)
    with db.write() as conn:
        agent = create_token(conn, "agent-1", "agent", SystemClock().now())
        operator = create_token(conn, "ops-1", "operator", SystemClock().now())
    sim = SimState(SimConfig(token=SIM_TOKEN, webhook_secret=WEBHOOK_SECRET))
    port = unused_port()
    url = f"http://127.0.0.1:{port}"
    sim.config.webhook_url = f"{url}/webhooks/sim"
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("RECONCILER_")}
    env = {
        **base_env,
        "SIM_TOKEN": SIM_TOKEN,
        "SIM_WEBHOOK_SECRETS": WEBHOOK_SECRET,
        "RECONCILER_CALLBACK_SECRET": CALLBACK_SECRET,
        hooks.LOG_ENV: str(log),
    }
    with ExitStack() as stack:
        stack.callback(db.dispose)
        sim_url = stack.enter_context(serve_asgi(create_sim(state=sim)))
        receiver, cb_url = stack.enter_context(serve_receiver())
        config = write_config(tmp_path, db_url, sim_url, port)
        output = tmp_path / "service.log"
        api = stack.enter_context(loopback.client(base_url=url, timeout=10))

        first = stack.enter_context(
            service_process(config, port, env={**env, hooks.SLEEP_ENV: "60"}, log=output)
        )
        created = api.post(
            "/v1/operations",
            json={
                "provider": "sim",
                "request": {"scenario": "success", "duration": 0.3},
                "callback_url": f"{cb_url}/cb/crash",
            },
            headers={"Authorization": f"Bearer {agent}"},
        )
        assert created.status_code == 202, created.text
        op_id = created.json()["id"]
        slow_key = hooks.hook_key(op_id, hooks.SLOW)

        wait_until(lambda: hooks.started_by_key(log)[slow_key] == 1, 60, "the slow hook to start")
        os.kill(first.pid, signal.SIGKILL)
        assert first.proc.wait(timeout=10) == -signal.SIGKILL

        # Killed inside the slow hook: the first hook finished, nothing after it ran.
        assert hooks.started_by_key(log) == {slow_key: 1}
        assert hooks.finished_by_key(log) == {hooks.hook_key(op_id, hooks.RECORD): 1}
        assert receiver.deliveries() == []
        steps = hooks.completion_steps(db, op_id)
        assert steps[SLOW_STEP]["status"] == "running"

        stack.enter_context(
            service_process(config, port, env={**env, hooks.SLEEP_ENV: "0"}, log=output)
        )
        wait_until(
            lambda: hooks.completion_finished(db, op_id),
            30,
            "the restarted service to finish the completion",
        )
        # Unleased with nothing due: the one task that ran it is over, none can start.
        wait_until(lambda: quiescent(db, op_id), 30, "the restarted worker to let go")

        assert (
            api.get(f"/v1/operations/{op_id}", headers={"Authorization": f"Bearer {agent}"}).json()[
                "state"
            ]
            == "succeeded"
        )
        # The interrupted step ran again with the same key and finished once.
        assert hooks.started_by_key(log) == {slow_key: 2}
        assert hooks.finished_by_key(log) == {
            hooks.hook_key(op_id, hooks.RECORD): 1,
            slow_key: 1,
            hooks.hook_key(op_id, hooks.AUDIT): 1,
        }
        # The callback, a later step, was delivered exactly once.
        assert receiver.by_webhook_id() == {op_id: 1}
        steps = hooks.completion_steps(db, op_id)
        assert {name: (r["status"], r["attempts"]) for name, r in steps.items()} == {
            f"hook:{hooks.RECORD}": ("done", 1),
            SLOW_STEP: ("done", 2),
            f"hook:{hooks.AUDIT}": ("done", 1),
            "callback": ("done", 1),
        }
        assert steps[SLOW_STEP]["idempotency_key"] == slow_key
        history = api.get(
            f"/v1/operations/{op_id}/history", headers={"Authorization": f"Bearer {operator}"}
        ).json()["entries"]
        slow_done = [e for e in history if e["cause"] == f"step_done:{SLOW_STEP}"]
        assert [(e["detail"]["attempt"], e["detail"]["idempotency_key"]) for e in slow_done] == [
            (2, slow_key)
        ]
