"""SIGKILL inside a commit that several operations' writes share (PostgreSQL), then a restart.

Twelve operations are held at a plain hook until the test lets them all go at once;
their next hook is transactional, and each of its writes queues at the writer
together with the others. The hook kills its process at the second effect written in
one transaction (``tests.support.hooks.effect_then_crash_when_joined``), so the crash
lands inside a joined transaction, after its first writes and before its commit. None
of that transaction may survive, and nothing before it may be lost: after a restart
every operation finishes, each transactional effect exists exactly once, each step is
done, and no callback recorded as sent is sent again.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from reconciler.demo.sim import SimConfig, SimState
from reconciler.demo.sim import create_app as create_sim
from reconciler.storage.database import Database
from reconciler.storage.tokens import create_token
from tests.support import hooks
from tests.support.faults import submit
from tests.support.hooks import serve_receiver
from tests.support.process import service_config, service_env, service_process
from tests.support.servers import serve_asgi
from tests.support.stack import SIM_TOKEN, WEBHOOK_SECRET
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

OPERATIONS = 12
LEASE_SECONDS = 3.0  # the restarted service takes over once the killed one's lease expired
JOB = {"scenario": "success", "duration": 0.2}
HOOKS = [hooks.GATED, {"target": hooks.EFFECT_THEN_CRASH_JOINED, "transactional": True}]


def test_a_joined_commit_killed_before_it_commits_loses_and_doubles_nothing(
    tmp_path: Path, pg_url: str
) -> None:
    db = Database(pg_url)
    hooks.create_effects_table(db)
    with db.write() as conn:
        agent = create_token(conn, "agent-1", "agent", datetime.now().astimezone())
    log, marker, gate = tmp_path / "hooks.log", tmp_path / "killed", tmp_path / "gate"
    env = service_env(
        {hooks.LOG_ENV: str(log), hooks.KILL_ENV: str(marker), hooks.GATE_ENV: str(gate)}
    )
    sim = SimState(SimConfig(token=SIM_TOKEN, webhook_secret=WEBHOOK_SECRET))
    try:
        with serve_asgi(create_sim(state=sim)) as sim_url, serve_receiver() as (receiver, cb_url):

            def start(name: str) -> tuple[Path, int]:
                config, port = service_config(
                    tmp_path / name,
                    pg_url,
                    sim_url,
                    hooks=HOOKS,
                    scheduler={"tick_seconds": 0.2, "lease_seconds": LEASE_SECONDS},
                    log_level="WARNING",
                )
                sim.config.webhook_url = f"http://127.0.0.1:{port}/webhooks/sim"
                return config, port

            config, port = start("first")
            with service_process(config, port, env=env, ready=False) as first:
                first.wait_ready()
                ids = [
                    submit(
                        first.url,
                        agent,
                        {"provider": "sim", "request": JOB, "callback_url": f"{cb_url}/cb/{i}"},
                    )
                    for i in range(OPERATIONS)
                ]
                wait_until(
                    lambda: sum(r.started for r in hooks.read_runs(log)) == OPERATIONS,
                    60,
                    "every operation at the gated hook",
                )
                gate.touch()
                wait_until(lambda: first.proc.poll() is not None, 60, "the joined commit's crash")
                assert first.proc.returncode == -9 and marker.exists()
            # The killed transaction carried at least two effects; none of it is stored.
            effect = f"hook:{hooks.EFFECT_THEN_CRASH_JOINED}"
            status = {i: hooks.completion_steps(db, i) for i in ids}
            running = [i for i in ids if status[i][effect]["status"] == "running"]
            assert len(running) >= 2
            assert not set(running) & {k.split(":")[0] for k in hooks.effects_by_key(db)}
            called = {i for i in ids if status[i]["callback"]["status"] == "done"}

            config, port = start("second")
            with service_process(config, port, env=env, ready=False) as second:
                second.wait_ready()
                for op_id in ids:
                    wait_until(
                        lambda op_id=op_id: hooks.completion_finished(db, op_id),
                        60,
                        "the restarted completion",
                    )
                assert second.proc.poll() is None
            assert hooks.effects_by_key(db) == {
                hooks.hook_key(i, hooks.EFFECT_THEN_CRASH_JOINED): 1 for i in ids
            }
            for op_id in ids:
                steps = hooks.completion_steps(db, op_id)
                assert {s["status"] for s in steps.values()} == {"done"}, steps
            # A callback recorded before the crash is never sent again; one sent but not yet
            # recorded is sent again with the same webhook-id (the receiver's dedupe key).
            delivered = receiver.by_webhook_id()
            assert set(delivered) == set(ids)
            assert all(delivered[i] == 1 for i in called)
    finally:
        db.dispose()
