"""Poison operations in a real service process: bounded, escalated, and counted across SIGKILL.

The service runs as its own process against the poison provider on loopback
(``tests/support/poison_provider.py``), whose file's adapter has a defect: one job's
result fetch raises, another's status read does. Before, such a step was claimed again
at once, for ever and across restarts (about 8,000 attempts an operation in 75 s, a
traceback each). Now each failure is counted with the moment of the next try; the
process is SIGKILLed between two failures and a new one goes on with the count it
left, so the escalation (``internal_error``, naming the step and the exception's type)
comes at the fourth failure in all. A healthy operation beside them finishes. The logs
of both processes hold one traceback per operation and burst and one line per failure.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from reconciler.core.records import HistoryRecord, OperationRecord
from reconciler.storage.database import Database
from reconciler.storage.tokens import create_token
from tests.support.faults import history, stored, submit
from tests.support.poison_provider import (
    SECRET_WORD,
    PoisonProvider,
    write_service_config,
)
from tests.support.process import ServiceProcess, service_env, service_process
from tests.support.servers import serve_asgi, unused_port
from tests.support.waiting import wait_until

pytestmark = pytest.mark.both_backends

BASE_SECONDS = 0.5  # the first retry waits 0.25-0.5 s, the second 0.5-1 s: room to kill between
ATTEMPTS = 4


@pytest.fixture
def provider() -> Iterator[tuple[PoisonProvider, str]]:
    poison = PoisonProvider()
    with serve_asgi(poison.app) as url:
        poison.base_url = url
        yield poison, url


def config(tmp_path: Path, db_url: str, provider_url: str, port: int) -> Path:
    return write_service_config(
        tmp_path / f"reconciler-{port}.toml",
        db_url,
        provider_url,
        port,
        step_retry_base_seconds=BASE_SECONDS,
        step_retry_max_seconds=2,
        step_retry_attempts=ATTEMPTS,
    )


def failures(entries: list[HistoryRecord]) -> list[HistoryRecord]:
    return [e for e in entries if e.cause == "step_failed"]


def test_a_poison_step_is_bounded_escalated_and_its_count_survives_a_sigkill(
    tmp_path: Path, db_url: str, provider: tuple[PoisonProvider, str]
) -> None:
    poison, provider_url = provider
    db = Database(db_url)
    try:
        with db.write() as conn:
            agent = create_token(conn, "agent-1", "agent", datetime.now().astimezone())
        first_port, second_port = unused_port(), unused_port()
        logs: list[Path] = []
        with service_process(
            config(tmp_path, db_url, provider_url, first_port), first_port, env=service_env()
        ) as first:
            logs.append(first.log)
            ops = {
                kind: submit(first.url, agent, {"provider": "poison", "request": request})
                for kind, request in (
                    ("collect", {"poison": "raise"}),
                    ("status", {"poison": "raise_status"}),
                    ("healthy", {"duration": 0.2}),
                )
            }

            def failed_twice() -> OperationRecord | None:
                op = stored(db, ops["collect"])
                return op if op.step_failures == 2 else None

            before = wait_until(failed_twice, 60, "the collection to fail twice", poll=0.02)
            assert before.lease_owner is None  # the failure's write gave the lease back
            first.kill()
            killed_pid = first.pid
        assert len(failures(history(db, ops["collect"]))) == 2

        with service_process(
            config(tmp_path, db_url, provider_url, second_port), second_port, env=service_env()
        ) as second:
            logs.append(second.log)
            for kind in ("collect", "status"):
                wait_until(
                    lambda k=kind: stored(db, ops[k]).state == "escalated",  # type: ignore[misc]
                    60,
                    f"the {kind} poison to escalate",
                )
            wait_until(lambda: stored(db, ops["healthy"]).state == "succeeded", 60, "healthy")
            _check_escalations(db, ops, killed_pid, second)
            # The provider saw one status request per status-read failure, and at most one
            # more: a read in flight at the SIGKILL (charged before it was sent, its failure
            # never recorded). Every request it saw was charged first.
            status_op = stored(db, ops["status"])
            assert status_op.remote_job_id is not None
            seen = poison.count("status", status_op.remote_job_id)
            assert seen == status_op.status_requests_used
            assert ATTEMPTS <= seen <= ATTEMPTS + 1
            collect_job = stored(db, ops["collect"]).remote_job_id
            assert collect_job is not None and poison.count("result", collect_job) == 0
        _check_logs(logs, ops)
    finally:
        db.dispose()


def _check_escalations(
    db: Database, ops: dict[str, str], killed_pid: int, second: ServiceProcess
) -> None:
    words = {"collect": "result collection", "status": "status read"}
    for kind, word in words.items():
        op = stored(db, ops[kind])
        assert op.step_failures == ATTEMPTS and op.next_poll_at is None
        entries = history(db, ops[kind])
        notes = failures(entries)
        assert [n.detail["attempt"] for n in notes if n.detail] == list(range(1, ATTEMPTS + 1))
        # Never at once: each retry waited at least the jitter floor of its backoff step.
        for n, (earlier, later) in enumerate(itertools.pairwise(notes)):
            assert (later.at - earlier.at).total_seconds() >= 0.5 * BASE_SECONDS * 2**n - 0.05
        [escalation] = [e for e in entries if e.kind == "escalation"]
        assert escalation.detail is not None
        assert escalation.detail["reason"] == "internal_error"
        assert f"{word} step failed {ATTEMPTS} times" in escalation.detail["detail"]
        assert "RuntimeError" in escalation.detail["detail"]
        # The file has no [cancel]: a retry or stopping.
        assert escalation.detail["options"] == ["retry", "abandon"]
        assert SECRET_WORD not in repr([e.detail for e in entries])
    # The collection's count went on in the new process where the killed one left it.
    notes = failures(history(db, ops["collect"]))
    assert [f":{killed_pid}:" in n.actor for n in notes] == [True, True, False, False]
    assert all(f":{second.pid}:" in n.actor for n in notes[2:])


def _check_logs(logs: list[Path], ops: dict[str, str]) -> None:
    lines = [line for log in logs for line in log.read_text("utf-8").splitlines()]
    text = "\n".join(lines)
    assert SECRET_WORD not in text
    for kind in ("collect", "status"):
        mine = [json.loads(line) for line in lines if ops[kind] in line]
        failed = [m for m in mine if "step failed" in m["msg"]]
        assert len(failed) == ATTEMPTS
        # One traceback for the burst (its first failure); a line for each further one.
        assert ["Traceback" in m.get("exc", "") for m in failed] == [True] + [False] * (
            ATTEMPTS - 1
        )
        said = [m for m in mine if m["msg"].endswith("escalated: internal_error")]
        assert len(said) == 1
