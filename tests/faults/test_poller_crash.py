"""SIGKILL of a real service process while its status request hangs at the provider.

The service runs as ``python -m reconciler serve`` in a subprocess; the simulated
provider runs in the test process, so its request log is read directly. The
status endpoint is made to hang (a ``delay`` fault longer than the test), the
process is killed by its PID while it waits, and a fresh process takes over.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from reconciler.core.records import HistoryRecord, OperationRecord
from reconciler.demo.sim import RequestRecord, SimConfig, SimState
from reconciler.demo.sim import create_app as create_sim
from reconciler.storage.database import Database
from reconciler.storage.tokens import create_token
from tests.support import loopback
from tests.support.faults import history, stored, submit
from tests.support.process import ServiceProcess, cli, service_config, service_process
from tests.support.servers import serve_asgi
from tests.support.stack import SIM_TOKEN, WEBHOOK_SECRET
from tests.support.waiting import wait_until

pytestmark = pytest.mark.both_backends

# A status read may take up to STATUS_TIMEOUT; the lease outlives it, so the holder of a
# live lease is the only reader, and a dead holder's lease frees the operation soon after.
STATUS_TIMEOUT = 6.0
LEASE_SECONDS = 7.0
POLLING = {
    "base_delay_seconds": 0.1,
    "max_delay_seconds": 0.4,
    "deadline_seconds": 90,
    "max_status_requests": 40,
}
HANG_SECONDS = 60.0  # longer than the test: the hung request never answers while it matters
SKEW = 0.05  # the sim's clock and the service's are this machine's wall clock
NEVER = {"scenario": "never_finishes", "webhooks": "never"}


@dataclass
class Rig:
    tmp_path: Path
    db_url: str
    db: Database
    sim: SimState
    sim_url: str
    agent: str
    stack: ExitStack

    def start(self, name: str, ready: bool = True) -> ServiceProcess:
        config, port = service_config(
            self.tmp_path / name,
            self.db_url,
            self.sim_url,
            scheduler={"tick_seconds": 0.2, "lease_seconds": LEASE_SECONDS},
            log_level="WARNING",
            provider=POLLING,
        )
        provider = self.tmp_path / name / "providers" / "sim.toml"
        text = provider.read_text("utf-8")
        section = "[providers.sim.status]\n"
        assert section in text
        provider.write_text(
            text.replace(section, f"{section}timeout_seconds = {STATUS_TIMEOUT}\n"), "utf-8"
        )
        svc = self.stack.enter_context(service_process(config, port, ready=False))
        if ready:
            svc.wait_ready()
        return svc

    def config(self, name: str) -> Path:
        return self.tmp_path / name / "reconciler.toml"

    def finished(self, op_id: str) -> OperationRecord:
        def done() -> OperationRecord | None:
            op = self.row(op_id)
            return op if op.state == "succeeded" else None

        found: OperationRecord = wait_until(done, 30, "the operation to finish")
        return found

    def create(self, svc: ServiceProcess, request: dict[str, Any]) -> str:
        return submit(svc.url, self.agent, {"provider": "sim", "request": request})

    def row(self, op_id: str) -> OperationRecord:
        return stored(self.db, op_id)

    def history(self, op_id: str) -> list[HistoryRecord]:
        return history(self.db, op_id)

    def status_requests(self, job_id: str) -> list[RequestRecord]:
        """Every status request the provider received for the job, answered or not."""
        return [r for r in self.sim.requests if r.endpoint == "status" and r.job_id == job_id]

    def hang_status(self, hang: bool) -> None:
        rates = {"delay": 1.0, "delay_seconds": HANG_SECONDS} if hang else None
        response = loopback.post(
            f"{self.sim_url}/_sim/config", json={"endpoint_faults": {"status": rates}}, timeout=10
        )
        assert response.status_code == 200, response.text

    def finish_job(self, job_id: str) -> None:
        response = loopback.post(
            f"{self.sim_url}/_sim/jobs/{job_id}/complete", json={"state": "succeeded"}, timeout=10
        )
        assert response.status_code == 200, response.text


@contextmanager
def rig(tmp_path: Path, db_url: str) -> Iterator[Rig]:
    with ExitStack() as stack:
        db = Database(db_url)
        stack.callback(db.dispose)
        with db.write() as conn:
            agent = create_token(conn, "agent-1", "agent", datetime.now().astimezone())
        sim = SimState(SimConfig(token=SIM_TOKEN, webhook_secret=WEBHOOK_SECRET))
        sim_url = stack.enter_context(serve_asgi(create_sim(state=sim)))
        yield Rig(tmp_path, db_url, db, sim, sim_url, agent, stack)


def kill_owner_while_status_hangs(
    r: Rig, services: list[ServiceProcess], op_id: str
) -> tuple[OperationRecord, str, ServiceProcess]:
    """Let a few reads happen, make the next one hang, SIGKILL its sender while it hangs.

    Returns the row as the killed worker left it, the job id and the killed process.
    """
    job_id: str = wait_until(lambda: r.row(op_id).remote_job_id, 30, "the job id")
    wait_until(lambda: len(r.status_requests(job_id)) >= 2, 30, "two status reads")
    r.hang_status(True)

    def hanging() -> bool:
        return any(q.answered_at is None for q in r.status_requests(job_id))

    wait_until(hanging, 30, "a status request to hang at the provider")
    holder = r.row(op_id).lease_owner
    assert holder is not None  # the sender holds the lease while it waits
    pid = int(holder.split(":")[-2])  # worker ids are host:pid:random
    [owner] = [svc for svc in services if svc.pid == pid]
    owner.kill()
    r.hang_status(False)
    crashed = r.row(op_id)
    assert crashed.lease_owner == holder
    assert len([q for q in r.status_requests(job_id) if q.answered_at is None]) == 1
    return crashed, job_id, owner


def metric(svc: ServiceProcess, name: str) -> float:
    text = loopback.get(f"{svc.url}/metrics", timeout=10).text
    found = re.search(rf"(?m)^{name} ([0-9.e+]+)$", text)
    return float(found.group(1)) if found else 0.0


def reads_of(entries: list[HistoryRecord]) -> list[HistoryRecord]:
    return [e for e in entries if e.cause == "status_read"]


def test_lease_of_a_killed_worker_is_taken_over_after_expiry(tmp_path: Path, db_url: str) -> None:
    with rig(tmp_path, db_url) as r:
        # Two replicas: the survivor keeps ticking and must still wait for the lease.
        services = [r.start("a", ready=False), r.start("b", ready=False)]
        for svc in services:
            svc.wait_ready()
        op_id = r.create(services[0], NEVER)
        crashed, job_id, killed = kill_owner_while_status_hangs(r, services, op_id)
        [survivor] = [svc for svc in services if svc is not killed]
        assert crashed.lease_expires_at is not None
        expires = crashed.lease_expires_at.timestamp()
        dead_actor = f"worker:{crashed.lease_owner}"
        sent_before = len(r.status_requests(job_id))
        entries_before = r.history(op_id)

        wait_until(lambda: len(r.status_requests(job_id)) > sent_before, 30, "a read after")
        r.finish_job(job_id)
        done = r.finished(op_id)

        requests = r.status_requests(job_id)
        resumed = requests[sent_before]
        assert resumed.at >= expires - SKEW, "a status read before the dead owner's lease expired"
        assert metric(survivor, "reconciler_lease_takeovers_total") >= 1.0

        # The history goes on from where the dead worker left it: same chain, new actor.
        entries = r.history(op_id)
        head = [(e.seq, e.hash) for e in entries_before]
        assert [(e.seq, e.hash) for e in entries[: len(head)]] == head
        assert [e.seq for e in entries] == list(range(1, len(entries) + 1))
        later = reads_of(entries[len(head) :])
        assert later and all(f":{survivor.pid}:" in e.actor for e in later)
        assert dead_actor not in {e.actor for e in later}
        assert [e.to_state for e in entries].count("succeeded") == 1
        assert len(r.sim.jobs[job_id].requests["create"]) == 1  # the record was reloaded
        # Every request sent, the hung one included, is charged.
        assert done.status_requests_used == len(requests) <= done.max_status_requests

        verified = cli(r.config("a"), "audit", "verify")
        assert verified.returncode == 0, verified.stderr
        assert "audit ok" in verified.stdout


def test_request_charged_before_a_crash_counts_and_restart_sends_no_burst(
    tmp_path: Path, db_url: str
) -> None:
    with rig(tmp_path, db_url) as r:
        first = r.start("first")
        op_id = r.create(first, NEVER)
        crashed, job_id, _ = kill_owner_while_status_hangs(r, [first], op_id)

        # The hung request reached the provider and was charged before it was sent.
        sent = r.status_requests(job_id)
        assert crashed.status_requests_used == len(sent)
        observed_before = len(reads_of(r.history(op_id)))
        assert observed_before == len(sent) - 1  # its answer never came
        stored_next = crashed.next_poll_at
        assert stored_next is not None and crashed.lease_expires_at is not None

        # The restarted worker must wait out the dead one's lease (LEASE_SECONDS, dozens of
        # polling intervals): by then a catch-up would send a burst.
        restarted_at = time.time()
        r.start("second")
        wait_until(lambda: len(r.status_requests(job_id)) >= len(sent) + 3, 30, "three reads")
        r.finish_job(job_id)
        done = r.finished(op_id)

        requests = r.status_requests(job_id)
        after = requests[len(sent) :]
        decisions = reads_of(r.history(op_id))[observed_before:]
        # One request per decision, each no earlier than the time the previous one chose.
        assert len(after) == len(decisions)
        earliest = max(stored_next.timestamp(), crashed.lease_expires_at.timestamp(), restarted_at)
        assert after[0].at >= earliest - SKEW
        waits = [d for d in decisions if d.detail and d.detail.get("next_poll_at")]
        assert len(waits) == len(decisions) - 1  # all but the last chose a next read
        for decision, following in zip(waits, after[1:], strict=True):
            assert decision.detail is not None
            scheduled = datetime.fromisoformat(decision.detail["next_poll_at"]).timestamp()
            assert following.at >= scheduled - SKEW, "a status read earlier than its schedule"
        assert done.status_requests_used == len(requests) <= done.max_status_requests
