"""Two workers on one database poll the same operations: one owner per status read.

Two schedulers in one process (two ``Runtime``s, each with its own app, worker and
APScheduler loop) and two service processes (``reconciler serve``) each poll the
same ~30 operations against the simulated provider, whose status answers are
slowed down so that overlapping reads would show. From the provider's request log
and the operations' histories the tests check that no two status requests for one
operation overlapped, that no operation went over its budget, and that every
operation completed exactly once.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from reconciler.app import create_app
from reconciler.config import CallbackSettings, SchedulerSettings, ServerSettings, Settings
from reconciler.core.records import HistoryRecord, OperationRecord
from reconciler.demo.sim import FaultRates, RequestRecord, SimConfig, SimState
from reconciler.demo.sim import create_app as create_sim
from reconciler.runtime import Runtime
from reconciler.storage import operations as store
from reconciler.storage.database import Database
from reconciler.storage.history import history_of
from tests.support import hooks, loopback
from tests.support.process import make_tokens, service_config, service_env, service_process
from tests.support.servers import serve_asgi
from tests.support.stack import (
    CALLBACK_SECRET,
    SIM_TOKEN,
    WEBHOOK_SECRET,
    sim_provider_table,
)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.both_backends

OPERATIONS = 30
BUDGET = 40
POLLING: dict[str, Any] = {
    "base_delay_seconds": 0.05,
    "max_delay_seconds": 0.3,
    "jitter_floor": 0.5,
    "deadline_seconds": 60,
    "max_status_requests": BUDGET,
}
# Every status answer takes this long: a second reader would overlap the first.
STATUS_DELAY = 0.1
SKEW = 0.02
TICK = 0.1
ENVIRON = {
    "SIM_TOKEN": SIM_TOKEN,
    "SIM_WEBHOOK_SECRETS": WEBHOOK_SECRET,
    "RECONCILER_CALLBACK_SECRET": CALLBACK_SECRET,
}


def slow_sim() -> SimState:
    status = FaultRates(delay=1.0, delay_seconds=STATUS_DELAY)
    config = SimConfig(
        token=SIM_TOKEN, webhook_secret=WEBHOOK_SECRET, endpoint_faults={"status": status}
    )
    return SimState(config)


def job_request(index: int) -> dict[str, Any]:
    # Slow-ish jobs of different lengths; every third also sends webhooks (hints).
    return {
        "scenario": "success",
        "duration": 1.5 + (index % 6) * 0.3,
        "webhooks": "normal" if index % 3 == 0 else "never",
        "n": index,
    }


@dataclass
class Replicas:
    urls: list[str]
    sim: SimState
    agent: str
    operator: str

    def headers(self, operator: bool = False) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.operator if operator else self.agent}"}

    def create(self, index: int) -> str:
        url = self.urls[index % len(self.urls)]
        key = f"two-workers-{index}"
        body = {"provider": "sim", "request": job_request(index), "idempotency_key": key}
        for _ in range(5):
            response = loopback.post(
                f"{url}/v1/operations", json=body, headers=self.headers(), timeout=30
            )
            if response.status_code != 503:  # a busy database: retry with the same key
                break
            time.sleep(0.5)
        assert response.status_code in (200, 202), response.text
        op_id: str = response.json()["id"]
        return op_id

    def create_all(self) -> list[str]:
        # In parallel, as agents would: each answer may wait briefly for the job id.
        with ThreadPoolExecutor(max_workers=10) as pool:
            return list(pool.map(self.create, range(OPERATIONS)))

    def get(self, op_id: str, index: int = 0) -> dict[str, Any]:
        url = self.urls[index % len(self.urls)]
        response = loopback.get(f"{url}/v1/operations/{op_id}", headers=self.headers(), timeout=30)
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    def status_reads(self, job_id: str) -> list[RequestRecord]:
        """The status requests the provider saw for the job, by arrival time."""
        return sorted(self.sim.jobs[job_id].requests["status"], key=lambda r: r.at)

    def wait_all_done(self, ids: list[str], timeout: float = 120.0) -> dict[str, dict[str, Any]]:
        # 7 s alone; over 60 s was seen with the whole suite at a load of ten times the cores.
        done: dict[str, dict[str, Any]] = {}

        def all_done() -> bool:
            for index, op_id in enumerate(ids):
                if op_id not in done:
                    op = self.get(op_id, index)
                    if op["done"]:
                        done[op_id] = op
            return len(done) == len(ids)

        wait_until(all_done, timeout, f"{len(ids)} operations done")
        return done


@contextmanager
def in_process_replicas(tmp_path: Path, db_url: str) -> Iterator[Replicas]:
    """Two runtimes, each with its own app, worker and scheduler, on one database."""
    with ExitStack() as stack:
        sim = slow_sim()
        sim_url = stack.enter_context(serve_asgi(create_sim(state=sim)))
        providers_dir = tmp_path / "no-provider-files"
        providers_dir.mkdir(exist_ok=True)
        settings = Settings(
            database_url=db_url,
            providers_dir=str(providers_dir),
            providers={"sim": sim_provider_table(sim_url, polling=POLLING)},
            hooks=(hooks.RECORD,),
            server=ServerSettings(wait_max_seconds=30.0),
            scheduler=SchedulerSettings(tick_seconds=TICK, lease_seconds=10.0),
            callbacks=CallbackSettings(allow_hosts=("127.0.0.1",)),
        )
        urls = []
        for _ in range(2):
            runtime = Runtime.build(settings, environ=ENVIRON)
            urls.append(stack.enter_context(serve_asgi(create_app(runtime))))
        sim.config.webhook_url = f"{urls[0]}/webhooks/sim"
        agent, operator = make_tokens(db_url)
        yield Replicas(urls, sim, agent, operator)


@contextmanager
def process_replicas(tmp_path: Path, db_url: str, hook_log: Path) -> Iterator[Replicas]:
    """Two ``reconciler serve`` processes on one database."""
    with ExitStack() as stack:
        sim = slow_sim()
        sim_url = stack.enter_context(serve_asgi(create_sim(state=sim)))
        agent, operator = make_tokens(db_url)
        env = service_env({hooks.LOG_ENV: str(hook_log)})
        services = []
        for name in ("a", "b"):
            config, port = service_config(
                tmp_path / name,
                db_url,
                sim_url,
                hooks=[hooks.RECORD],
                scheduler={"tick_seconds": TICK, "lease_seconds": 10.0},
                log_level="WARNING",
                provider=POLLING,
            )
            services.append(
                stack.enter_context(service_process(config, port, env=env, ready=False))
            )
        for service in services:  # both start at once; then wait for each
            service.wait_ready()
        urls = [service.url for service in services]
        sim.config.webhook_url = f"{urls[0]}/webhooks/sim"
        yield Replicas(urls, sim, agent, operator)


def check_one_reader_at_a_time(
    op: OperationRecord, entries: list[HistoryRecord], reads: list[RequestRecord]
) -> None:
    """The provider's own log: each status request for the operation was answered before
    the next one arrived, so no two were ever in flight together (each answer takes
    ``STATUS_DELAY``, so an overlap could not hide). Every request was charged first."""
    assert len(reads) == op.status_requests_used <= op.max_status_requests
    for index, (read, following) in enumerate(itertools.pairwise(reads)):
        assert read.answered_at is not None
        assert following.at >= read.answered_at, (op.id, index, "overlapping status requests")
    # Each answer the service recorded came from one of those requests (a write lost to a
    # busy database may leave a charged request without its observation, never the reverse).
    observed = [e for e in entries if e.cause == "status_read"]
    assert 1 <= len(observed) <= len(reads)


def check_completed_once(op: OperationRecord, entries: list[HistoryRecord]) -> None:
    assert op.state == "succeeded", (op.id, op.state)
    ends = [e for e in entries if e.kind == "transition" and e.to_state == "succeeded"]
    assert len(ends) == 1
    assert [e.cause for e in entries].count("completion_finished") == 1
    assert [e.cause for e in entries].count(f"step_done:hook:{hooks.RECORD}") == 1


def _unfinished(db: Database, ids: list[str]) -> list[str]:
    """Where each operation whose completion did not finish stands: its lease and last steps."""
    lines = [f"now={datetime.now(UTC)}"]
    with db.read() as conn:
        for op_id in ids:
            if hooks.completion_finished(db, op_id):
                continue
            op = store.get_operation(conn, op_id)
            assert op is not None
            causes = [e.cause for e in history_of(conn, op_id)][-5:]
            lines.append(
                f"{op_id} {op.state} pending={op.completion_pending} lane={op.completion_lane} "
                f"due={op.next_poll_at} lease={op.lease_owner}@{op.lease_expires_at} "
                f"last={causes}"
            )
    return lines


def check_all(replicas: Replicas, db_url: str, ids: list[str], hook_log: Path) -> None:
    replicas.wait_all_done(ids)
    actors: set[str] = set()
    shared = 0
    db = Database(db_url)
    try:
        # Done is the end state; the completion (the hook) follows it: wait for that too.
        try:
            wait_until(
                lambda: all(hooks.completion_finished(db, op_id) for op_id in ids),
                120,
                "every completion finished",
                poll=0.1,
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}; unfinished: {_unfinished(db, ids)}") from None
        with db.read() as conn:
            found = {op_id: store.get_operation(conn, op_id) for op_id in ids}
            histories = {op_id: history_of(conn, op_id) for op_id in ids}
    finally:
        db.dispose()
    for op_id in ids:
        op, entries = found[op_id], histories[op_id]
        assert op is not None and op.remote_job_id is not None
        check_completed_once(op, entries)
        check_one_reader_at_a_time(op, entries, replicas.status_reads(op.remote_job_id))
        readers = {e.actor for e in entries if e.cause == "status_read"}
        actors |= readers
        shared += len(readers) > 1
    # Both workers did status reads, and operations changed hands between them.
    assert len(actors) == 2, actors
    assert shared > 0
    runs = hooks.finished_by_key(hook_log)
    assert sorted(runs) == sorted(hooks.hook_key(op_id, hooks.RECORD) for op_id in ids)
    assert set(runs.values()) == {1}


def test_two_schedulers_in_one_process_share_operations_safely(
    tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    hook_log = tmp_path / "hooks.log"
    monkeypatch.setenv(hooks.LOG_ENV, str(hook_log))
    with in_process_replicas(tmp_path, db_url) as replicas:
        ids = replicas.create_all()
        check_all(replicas, db_url, ids, hook_log)


def test_two_service_processes_share_operations_safely(tmp_path: Path, db_url: str) -> None:
    hook_log = tmp_path / "hooks.log"
    with process_replicas(tmp_path, db_url, hook_log) as replicas:
        ids = replicas.create_all()
        check_all(replicas, db_url, ids, hook_log)
