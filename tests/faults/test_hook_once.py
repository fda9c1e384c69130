"""SIGKILL after a hook's effect and before its step is recorded, then a restart.

The crash point is the hook's own (``tests.support.hooks``: it makes a marker file
and SIGKILLs its process once its effect is done), so the kill lands exactly in
the window between "the hook returned" and "its step is recorded". A plain hook
runs again with the same idempotency key (at-least-once); a transactional hook's
row was written in the transaction that would have recorded its step, so the crash
took both, and the restart writes it once: exactly one row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from reconciler.demo.sim import SimConfig, SimState
from reconciler.demo.sim import create_app as create_sim
from reconciler.storage.database import Database
from reconciler.storage.tokens import create_token
from tests.support import hooks
from tests.support.faults import submit
from tests.support.hooks import serve_receiver
from tests.support.process import ServiceProcess, service_config, service_env, service_process
from tests.support.servers import serve_asgi
from tests.support.stack import SIM_TOKEN, WEBHOOK_SECRET
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.both_backends]

LEASE_SECONDS = 3.0  # the restarted service takes over once the killed one's lease expired
JOB = {"scenario": "success", "duration": 0.3}


def _crash_and_restart(
    tmp_path: Path, db_url: str, hook_list: Sequence[str | Mapping[str, Any]]
) -> tuple[str, Database, Path]:
    """One operation through a service that dies in its hook, then through a fresh one."""
    db = Database(db_url)
    hooks.create_effects_table(db)
    with db.write() as conn:
        agent = create_token(conn, "agent-1", "agent", datetime.now().astimezone())
    log, marker = tmp_path / "hooks.log", tmp_path / "killed"
    env = service_env({hooks.LOG_ENV: str(log), hooks.KILL_ENV: str(marker)})
    sim = SimState(SimConfig(token=SIM_TOKEN, webhook_secret=WEBHOOK_SECRET))
    with serve_asgi(create_sim(state=sim)) as sim_url, serve_receiver() as (receiver, cb_url):

        def start(name: str) -> tuple[Path, int]:
            return service_config(
                tmp_path / name,
                db_url,
                sim_url,
                hooks=hook_list,
                scheduler={"tick_seconds": 0.2, "lease_seconds": LEASE_SECONDS},
                log_level="WARNING",
            )

        config, port = start("first")
        sim.config.webhook_url = f"http://127.0.0.1:{port}/webhooks/sim"
        with service_process(config, port, env=env, ready=False) as first:
            first.wait_ready()
            body = {"provider": "sim", "request": JOB, "callback_url": f"{cb_url}/cb/once"}
            op_id = submit(first.url, agent, body)
            wait_until(lambda: first.proc.poll() is not None, 60, "the hook's crash point")
            assert first.proc.returncode == -9 and marker.exists()
        assert hooks.completion_steps(db, op_id)[f"hook:{_target(hook_list[0])}"]["status"] == (
            "running"
        )
        assert receiver.deliveries() == []

        config, port = start("second")
        sim.config.webhook_url = f"http://127.0.0.1:{port}/webhooks/sim"
        with service_process(config, port, env=env, ready=False) as second:
            second.wait_ready()
            _finish(second, db, op_id)
        assert receiver.by_webhook_id() == {op_id: 1}
    return op_id, db, log


def _target(spec: str | Mapping[str, Any]) -> str:
    return spec if isinstance(spec, str) else str(spec["target"])


def _finish(svc: ServiceProcess, db: Database, op_id: str) -> None:
    wait_until(lambda: hooks.completion_finished(db, op_id), 60, "the restarted completion")
    assert svc.proc.poll() is None


def test_a_transactional_hook_killed_before_its_step_is_recorded_writes_once(
    tmp_path: Path, db_url: str
) -> None:
    spec = {"target": hooks.EFFECT, "transactional": True}
    op_id, db, _ = _crash_and_restart(tmp_path, db_url, [spec, hooks.RECORD])
    try:
        key = hooks.hook_key(op_id, hooks.EFFECT)
        # The killed run's row went with its transaction; the restart's is the only one.
        assert hooks.effects_by_key(db) == {key: 1}
        steps = hooks.completion_steps(db, op_id)
        assert (steps[f"hook:{hooks.EFFECT}"]["status"], steps["callback"]["status"]) == (
            "done",
            "done",
        )
        assert steps[f"hook:{hooks.EFFECT}"]["attempts"] == 2
    finally:
        db.dispose()


def test_a_plain_hook_killed_before_its_step_is_recorded_runs_again_with_its_key(
    tmp_path: Path, db_url: str
) -> None:
    op_id, db, log = _crash_and_restart(tmp_path, db_url, [hooks.RECORD_THEN_CRASH])
    try:
        key = hooks.hook_key(op_id, hooks.RECORD_THEN_CRASH)
        # At-least-once, said plainly: its effect happened twice, both times with one key.
        assert hooks.finished_by_key(log) == {key: 2}
        step = hooks.completion_steps(db, op_id)[f"hook:{hooks.RECORD_THEN_CRASH}"]
        assert (step["status"], step["attempts"], step["idempotency_key"]) == ("done", 2, key)
    finally:
        db.dispose()
