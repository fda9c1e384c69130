"""SIGKILL of the service while the job id is not established yet, then a restart.

The service runs as ``python -m reconciler serve`` in a subprocess (killed by its PID);
the simulated provider runs on uvicorn in the test process, so the test can read what
it received. After the restart on the same database the operation must complete with
exactly one job at the provider for its idempotency token.

SQLite only: the create intent is recorded before the call on both databases alike (the
engine's order); PostgreSQL's commits and leases under SIGKILL are proven by the lease
takeover (test_poller_crash.py), the transactional hooks (test_hook_once.py) and the
soak's kills.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from reconciler.core.records import HistoryRecord
from reconciler.demo.sim import SimConfig, SimState
from reconciler.demo.sim import create_app as create_sim
from reconciler.storage.database import Database
from reconciler.storage.history import history_of
from tests.support import loopback
from tests.support.process import ServiceProcess, cli, service_config, service_process
from tests.support.servers import serve_asgi
from tests.support.stack import SIM_TOKEN, WEBHOOK_SECRET
from tests.support.waiting import wait_until

LEASE_SECONDS = 2.0
READY_SECONDS = 90.0


@pytest.fixture
def sim() -> Iterator[tuple[SimState, str]]:
    state = SimState(SimConfig(token=SIM_TOKEN, webhook_secret=WEBHOOK_SECRET))
    with serve_asgi(create_sim(state=state)) as url:
        yield state, url


def setup_service(
    tmp_path: Path, db_url: str, sim: tuple[SimState, str], **provider: Any
) -> tuple[Path, int, str]:
    """Config, port and an agent token made with the CLI against the same database."""
    state, sim_url = sim
    config, port = service_config(
        tmp_path,
        db_url,
        sim_url,
        scheduler={"lease_seconds": LEASE_SECONDS},
        log_level="WARNING",
        provider=provider,
    )
    state.config.webhook_url = f"http://127.0.0.1:{port}/webhooks/sim"
    made = cli(config, "tokens", "create", "--name", "agent-1", "--scope", "agent")
    assert made.returncode == 0, made.stderr
    return config, port, made.stdout.strip()


@contextmanager
def running(config: Path, port: int) -> Iterator[ServiceProcess]:
    """The service process, ready; start-up may be slow when the machine is busy."""
    with service_process(config, port, ready=False) as svc:
        svc.wait_ready(timeout=READY_SECONDS)
        yield svc


def row(db: Database, op_id: str) -> Any:
    with db.read() as conn:
        return conn.execute(
            sa.text(
                "SELECT state, create_attempts, idempotency_token, remote_job_id "
                "FROM operations WHERE id = :id"
            ),
            {"id": op_id},
        ).one()


def wait_row(db: Database, op_id: str, ok: Any, timeout: float = 30) -> Any:
    return wait_until(
        lambda: (current := row(db, op_id)) is not None and ok(current) and current,
        timeout,
        f"the row of {op_id} to change",
    )


def start(svc: ServiceProcess, token: str, request: dict[str, Any]) -> str:
    response = loopback.post(
        f"{svc.url}/v1/operations",
        json={"provider": "sim", "request": request},
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )
    assert response.status_code == 202, response.text
    op_id: str = response.json()["id"]
    return op_id


def wait_done(svc: ServiceProcess, token: str, op_id: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    op: dict[str, Any] = {"done": False}
    while not op["done"] and time.monotonic() < deadline:
        response = loopback.get(
            f"{svc.url}/v1/operations/{op_id}/wait",
            params={"timeout_seconds": max(0.1, min(5.0, deadline - time.monotonic()))},
            headers={"Authorization": f"Bearer {token}"},
            timeout=15,
        )
        assert response.status_code == 200, response.text
        op = response.json()
    return op


def history(db: Database, op_id: str) -> list[HistoryRecord]:
    with db.read() as conn:
        return history_of(conn, op_id)


def provider_requests(state: SimState, token: str, endpoint: str) -> list[Any]:
    return [r for r in state.requests_for_key(token) if r.endpoint == endpoint]


def test_kill_while_the_create_call_hangs_then_restart_makes_one_job(
    tmp_path: Path, db_url: str, db: Database, sim: tuple[SimState, str]
) -> None:
    state, _ = sim
    # The create call waits up to 30 s and the provider answers after 60 s: it hangs.
    config, port, token = setup_service(tmp_path, db_url, sim, timeout_seconds=30)
    with running(config, port) as svc:
        op_id = start(svc, token, {"duration": 0.3, "create_fault": "delay", "create_delay": 60})
        before = wait_row(db, op_id, lambda r: r.create_attempts == 1)
        idem = before.idempotency_token
        # Kill once the provider has made the job and is holding the answer back.
        wait_until(lambda: state.jobs_for_key(idem), 30, "the provider to make the job")
        assert len(state.jobs) == 1
        assert [r.status for r in provider_requests(state, idem, "create")] == [None]
        svc.kill()
    crashed = row(db, op_id)
    # The attempt was charged before sending, and the crash left the operation in place.
    assert (crashed.state, crashed.create_attempts, crashed.remote_job_id) == (
        "create_pending",
        1,
        None,
    )

    with running(config, port) as svc:
        op = wait_done(svc, token, op_id)
    assert op["state"] == "succeeded", op
    jobs = state.jobs_for_key(idem)
    assert [j.job_id for j in jobs] == [op["remote_job_id"]]
    assert len(state.jobs) == 1
    creates = provider_requests(state, idem, "create")
    # Only the hanging call: with an attempt on record the restarted service looks the
    # token up first (the job exists) instead of sending the create again.
    assert len(creates) == 1
    lookups = provider_requests(state, idem, "lookup")
    assert lookups and lookups[0].status == 200
    assert row(db, op_id).create_attempts == 1


def test_kill_while_waiting_to_reconcile_then_restart_makes_one_job(
    tmp_path: Path, db_url: str, db: Database, sim: tuple[SimState, str]
) -> None:
    state, _ = sim
    # Exactly 5 s between the ambiguous create and the lookup: time to kill in between.
    config, port, token = setup_service(
        tmp_path, db_url, sim, base_delay_seconds=5, max_delay_seconds=5, jitter_floor=1.0
    )
    with running(config, port) as svc:
        op_id = start(svc, token, {"duration": 0.3, "create_fault": "500_after_create"})
        waiting = wait_row(db, op_id, lambda r: r.state == "create_unknown")
        svc.kill()
    idem = waiting.idempotency_token
    crashed = row(db, op_id)
    assert (crashed.state, crashed.create_attempts, crashed.remote_job_id) == (
        "create_unknown",
        1,
        None,
    )
    # Killed before it reconciled: one create (answered 500), no lookup yet.
    assert [r.status for r in provider_requests(state, idem, "create")] == [500]
    assert provider_requests(state, idem, "lookup") == []

    with running(config, port) as svc:
        op = wait_done(svc, token, op_id)
    assert op["state"] == "succeeded", op
    assert [j.job_id for j in state.jobs_for_key(idem)] == [op["remote_job_id"]]
    assert len(state.jobs) == 1
    # Reconciled by the lookup after the restart; no second create was sent.
    assert len(provider_requests(state, idem, "create")) == 1
    assert provider_requests(state, idem, "lookup")
    accepted = [h for h in history(db, op_id) if h.to_state == "accepted"]
    assert len(accepted) == 1
    assert accepted[0].from_state == "create_unknown"
    assert accepted[0].detail["via"] == "lookup"
