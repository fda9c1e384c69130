"""SIGKILL right after each of the larger transactions of the lifecycle, then a restart.

A step's last write also prepares the next step: the transaction of the confirming
status read counts the result fetch, the one that records the result starts the first
completion step, and each step's record starts the next one. The service runs as
``python -m reconciler serve`` (killed by its PID) while the step that transaction
prepared is in flight: a result fetch that hangs, the first hook, a callback that
hangs. The restarted service must finish the operation with every guarantee kept:
what was counted stays counted (one fetch more, never one uncounted), a step marked
started runs again with the same key, a finished step never runs again, the callback
keeps its ``webhook-id``, and the history verifies.

SQLite only: which write a boundary follows is the engine's order, the same on both
databases; PostgreSQL's commits and leases under SIGKILL are proven by the lease
takeover (test_poller_crash.py), the transactional hooks (test_hook_once.py) and the
soak's kills.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest

from reconciler.core.records import HistoryRecord, OperationRecord
from reconciler.demo.sim import RequestRecord, SimConfig, SimState
from reconciler.demo.sim import create_app as create_sim
from reconciler.storage.database import Database
from reconciler.storage.tokens import create_token
from tests.support import hooks, loopback
from tests.support.faults import history, stored, submit
from tests.support.hooks import CallbackReceiver, Reply, serve_receiver
from tests.support.process import ServiceProcess, cli, service_config, service_env, service_process
from tests.support.servers import serve_asgi
from tests.support.stack import SIM_TOKEN, WEBHOOK_SECRET
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

# The restarted service takes over once the killed one's lease has expired.
LEASE_SECONDS = 3.0
HANG_SECONDS = 60.0  # longer than the test: a hung call never answers while it matters
# Only the webhook drives the read: the first fallback read is far away.
POLLING = {"base_delay_seconds": 30, "max_delay_seconds": 60}
JOB = {"scenario": "success", "duration": 0.3, "webhooks": "normal", "webhook_on_running": False}


@dataclass
class Rig:
    tmp_path: Path
    db: Database
    sim: SimState
    sim_url: str
    receiver: CallbackReceiver
    cb_url: str
    agent: str
    log: Path
    stack: ExitStack

    def start(self, name: str, hook_list: Sequence[str], *, sleep: float = 0) -> ServiceProcess:
        config, port = service_config(
            self.tmp_path / name,
            self.db.url,
            self.sim_url,
            hooks=hook_list,
            scheduler={"tick_seconds": 0.2, "lease_seconds": LEASE_SECONDS},
            log_level="WARNING",
            provider=POLLING,
        )
        self.sim.config.webhook_url = f"http://127.0.0.1:{port}/webhooks/sim"
        env = service_env({hooks.LOG_ENV: str(self.log), hooks.SLEEP_ENV: str(sleep)})
        svc = self.stack.enter_context(service_process(config, port, env=env, ready=False))
        svc.wait_ready()
        return svc

    def create(self, svc: ServiceProcess, name: str) -> str:
        body = {"provider": "sim", "request": JOB, "callback_url": f"{self.cb_url}/cb/{name}"}
        return submit(svc.url, self.agent, body)

    def row(self, op_id: str) -> OperationRecord:
        return stored(self.db, op_id)

    def history(self, op_id: str) -> list[HistoryRecord]:
        return history(self.db, op_id)

    def requests(self, job_id: str, endpoint: str) -> list[RequestRecord]:
        return [r for r in self.sim.requests if r.endpoint == endpoint and r.job_id == job_id]

    def hang(self, endpoint: str, hang: bool) -> None:
        rates = {"delay": 1.0, "delay_seconds": HANG_SECONDS} if hang else None
        response = loopback.post(
            f"{self.sim_url}/_sim/config", json={"endpoint_faults": {endpoint: rates}}, timeout=10
        )
        assert response.status_code == 200, response.text

    def finished(self, op_id: str) -> OperationRecord:
        wait_until(lambda: hooks.completion_finished(self.db, op_id), 60, "the completion")
        return self.row(op_id)

    def audit_ok(self, name: str) -> None:
        verified = cli(self.tmp_path / name / "reconciler.toml", "audit", "verify")
        assert verified.returncode == 0, verified.stderr
        assert "audit ok" in verified.stdout


@contextmanager
def rig(tmp_path: Path, db_url: str) -> Iterator[Rig]:
    with ExitStack() as stack:
        db = Database(db_url)
        stack.callback(db.dispose)
        with db.write() as conn:
            agent = create_token(conn, "agent-1", "agent", datetime.now().astimezone())
        sim = SimState(SimConfig(token=SIM_TOKEN, webhook_secret=WEBHOOK_SECRET))
        sim_url = stack.enter_context(serve_asgi(create_sim(state=sim)))
        receiver, cb_url = stack.enter_context(serve_receiver())
        log = tmp_path / "hooks.log"
        yield Rig(tmp_path, db, sim, sim_url, receiver, cb_url, agent, log, stack)


def transitions(entries: list[HistoryRecord], to: str) -> int:
    return sum(1 for e in entries if e.kind == "transition" and e.to_state == to)


def steps_of(db: Database, op_id: str) -> dict[str, tuple[str, int]]:
    return {
        name: (r["status"], r["attempts"]) for name, r in hooks.completion_steps(db, op_id).items()
    }


def test_kill_while_the_result_fetch_hangs_fetches_once_more_and_completes_once(
    tmp_path: Path, db_url: str
) -> None:
    """The confirming read's transaction counted the fetch; the crash loses only its answer."""
    with rig(tmp_path, db_url) as r:
        first = r.start("first", [hooks.RECORD])
        r.hang("result", True)
        op_id = r.create(first, "fetch")
        job_id: str = wait_until(lambda: r.row(op_id).remote_job_id, 30, "the job id")
        wait_until(
            lambda: any(q.answered_at is None for q in r.requests(job_id, "result")),
            30,
            "the result fetch to hang at the provider",
        )
        first.kill()
        r.hang("result", False)
        crashed = r.row(op_id)
        reads = r.requests(job_id, "status")
        # One transaction recorded the read, moved to collection and counted the fetch.
        assert crashed.state == "result_collecting"
        assert crashed.result_attempts == 1
        assert crashed.status_requests_used == len(reads) == 1
        assert r.receiver.deliveries() == []

        r.start("second", [hooks.RECORD])
        done = r.finished(op_id)
        assert done.state == "succeeded"
        fetches = r.requests(job_id, "result")
        assert len(fetches) == 2 and done.result_attempts == 2
        # The end was confirmed once: no status read after the restart.
        assert len(r.requests(job_id, "status")) == 1 == done.status_requests_used
        assert hooks.finished_by_key(r.log) == {hooks.hook_key(op_id, hooks.RECORD): 1}
        assert r.receiver.by_webhook_id() == {op_id: 1}
        assert steps_of(r.db, op_id) == {
            f"hook:{hooks.RECORD}": ("done", 1),
            "callback": ("done", 1),
        }
        entries = r.history(op_id)
        assert transitions(entries, "result_collecting") == 1
        assert transitions(entries, "succeeded") == 1
        r.audit_ok("second")


def test_kill_inside_the_first_hook_runs_it_again_and_nothing_before_it(
    tmp_path: Path, db_url: str
) -> None:
    """The result's transaction also started the first hook: it may have run, so it runs
    again with the same key; the result is not fetched again."""
    hook_list = [hooks.SLOW, hooks.RECORD]
    with rig(tmp_path, db_url) as r:
        first = r.start("first", hook_list, sleep=HANG_SECONDS)
        op_id = r.create(first, "hook")
        slow_key = hooks.hook_key(op_id, hooks.SLOW)
        wait_until(lambda: hooks.started_by_key(r.log)[slow_key] == 1, 60, "the slow hook")
        first.kill()
        crashed = r.row(op_id)
        assert crashed.state == "succeeded" and crashed.completion_pending
        assert steps_of(r.db, op_id)[f"hook:{hooks.SLOW}"] == ("running", 1)
        assert hooks.finished_by_key(r.log) == {}
        job_id = crashed.remote_job_id
        assert job_id is not None and len(r.requests(job_id, "result")) == 1

        r.start("second", hook_list, sleep=0)
        r.finished(op_id)
        assert hooks.started_by_key(r.log) == {slow_key: 2}
        assert hooks.finished_by_key(r.log) == {
            slow_key: 1,
            hooks.hook_key(op_id, hooks.RECORD): 1,
        }
        assert r.receiver.by_webhook_id() == {op_id: 1}
        assert steps_of(r.db, op_id) == {
            f"hook:{hooks.SLOW}": ("done", 2),
            f"hook:{hooks.RECORD}": ("done", 1),
            "callback": ("done", 1),
        }
        assert len(r.requests(job_id, "result")) == 1
        assert transitions(r.history(op_id), "succeeded") == 1
        r.audit_ok("second")


def test_kill_while_the_callback_hangs_delivers_again_with_the_same_id(
    tmp_path: Path, db_url: str
) -> None:
    """The hook's record started the callback in the same transaction: the hook is done
    for good, and the callback, marked started, is delivered again under its webhook-id."""
    with rig(tmp_path, db_url) as r:
        r.receiver.script("hang", [Reply(204, delay=HANG_SECONDS), Reply(204)])
        first = r.start("first", [hooks.RECORD])
        op_id = r.create(first, "hang")
        wait_until(lambda: r.receiver.deliveries("hang"), 60, "the callback to arrive")
        first.kill()
        crashed = r.row(op_id)
        assert crashed.completion_pending
        assert steps_of(r.db, op_id) == {
            f"hook:{hooks.RECORD}": ("done", 1),
            "callback": ("running", 1),
        }

        r.start("second", [hooks.RECORD])
        r.finished(op_id)
        deliveries = r.receiver.deliveries("hang")
        assert [d.webhook_id for d in deliveries] == [op_id, op_id]
        assert hooks.finished_by_key(r.log) == {hooks.hook_key(op_id, hooks.RECORD): 1}
        assert steps_of(r.db, op_id) == {
            f"hook:{hooks.RECORD}": ("done", 1),
            "callback": ("done", 2),
        }
        entries = r.history(op_id)
        assert sum(1 for e in entries if e.cause == "completion_finished") == 1
        assert sum(1 for e in entries if e.cause == "step_done:callback") == 1
        r.audit_ok("second")
