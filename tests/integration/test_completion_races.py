"""The completion handler runs every downstream step once, whatever races to finish the operation.

Each test counts what really ran: the hook log (one fsynced line per run, per
idempotency key; see ``tests.support.hooks``), the deliveries a real callback
receiver saw per ``webhook-id``, and the ``completion_steps`` rows (one attempt
each). The counts are taken once every worker is idle and nothing is due on the
operations: no stray second run can start after that, so the counts are final.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from reconciler.app import create_app
from reconciler.runtime import Runtime
from reconciler.storage.tables import EVENTS
from tests.support import hooks, loopback
from tests.support.hooks import CallbackReceiver, serve_receiver
from tests.support.servers import serve_asgi
from tests.support.stack import Stack, running_stack, worker_of
from tests.support.waiting import wait_until

pytestmark = pytest.mark.both_backends

HOOKS = (hooks.RECORD, hooks.RECORD_ASYNC, hooks.AUDIT)


@pytest.fixture
def hook_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "hooks.log"
    monkeypatch.setenv(hooks.LOG_ENV, str(path))
    return path


@contextmanager
def replica(stack: Stack) -> Iterator[Runtime]:
    """A second service (own runtime, worker and scheduler) on the stack's database."""
    runtime = Runtime.build(stack.runtime.settings, environ=stack.runtime.environ)
    app = create_app(runtime)
    with serve_asgi(app):
        stack.workers.append(worker_of(app))
        yield runtime


def start(stack: Stack, request: dict[str, Any], callback_url: str) -> str:
    response = stack.create(request, callback_url=callback_url)
    assert response.status_code == 202, response.text
    op_id: str = response.json()["id"]
    return op_id


def wait_closed(stack: Stack, op_ids: Sequence[str], timeout: float = 30.0) -> None:
    db = stack.runtime.db
    wait_until(
        lambda: all(hooks.completion_finished(db, op_id) for op_id in op_ids),
        timeout,
        "every completion handler to close",
    )
    stack.settled(op_ids)


def assert_each_step_once(
    stack: Stack, op_ids: Sequence[str], log: Path, receiver: CallbackReceiver
) -> None:
    finished = hooks.finished_by_key(log)
    expected_steps = {f"hook:{h}": ("done", 1) for h in HOOKS} | {"callback": ("done", 1)}
    for op_id in op_ids:
        for hook in HOOKS:
            assert finished[hooks.hook_key(op_id, hook)] == 1, (op_id, hook, finished)
        steps = hooks.completion_steps(stack.runtime.db, op_id)
        assert {name: (r["status"], r["attempts"]) for name, r in steps.items()} == expected_steps
        # Hooks run in their configured order.
        order = [run.hook for run in hooks.read_runs(log) if run.op_id == op_id]
        assert order == list(HOOKS)
    assert sum(finished.values()) == len(op_ids) * len(HOOKS), finished
    assert receiver.by_webhook_id() == Counter({op_id: 1 for op_id in op_ids})


def test_webhook_and_tick_together_run_each_step_once(tmp_path: Path, db_url: str, hook_log: Path):
    """Status reads every 50 ms on a 20 ms tick while the provider's webhooks arrive."""
    polling = {"base_delay_seconds": 0.05, "max_delay_seconds": 0.05, "jitter_floor": 1.0}
    with (
        serve_receiver() as (receiver, cb_url),
        running_stack(
            tmp_path, db_url, provider={"polling": polling}, hooks=HOOKS, tick_seconds=0.02
        ) as stack,
    ):
        op_ids = [
            start(
                stack,
                {"scenario": "success", "duration": 0.3 + 0.05 * i, "webhooks": "normal"},
                f"{cb_url}/cb/tick",
            )
            for i in range(6)
        ]
        wait_closed(stack, op_ids)
        reads = 0
        for op_id in op_ids:
            assert stack.get(op_id)["state"] == "succeeded"
            entries = stack.history(op_id)
            assert any(e["kind"] == "hint" for e in entries), op_id  # the webhook path
            reads += sum(e["cause"] == "status_read" for e in entries)
        # The tick path: reads on schedule beyond the one confirming read per operation.
        assert reads > len(op_ids)
        assert_each_step_once(stack, op_ids, hook_log, receiver)


def test_two_workers_on_one_database_run_each_step_once(
    tmp_path: Path, db_url: str, hook_log: Path
):
    polling = {"base_delay_seconds": 0.05, "max_delay_seconds": 0.1}
    with (
        serve_receiver() as (receiver, cb_url),
        running_stack(
            tmp_path, db_url, provider={"polling": polling}, hooks=HOOKS, tick_seconds=0.05
        ) as stack,
        replica(stack) as other,
    ):
        op_ids = [
            start(stack, {"scenario": "success", "duration": 0.2 + 0.05 * i}, f"{cb_url}/cb/two")
            for i in range(8)
        ]
        wait_closed(stack, op_ids)
        actors = {e["actor"] for op_id in op_ids for e in stack.history(op_id)}
        # The race is real only if both workers took part.
        assert f"worker:{stack.runtime.worker_id}" in actors
        assert f"worker:{other.worker_id}" in actors
        for op_id in op_ids:
            assert stack.get(op_id)["state"] == "succeeded"
        assert_each_step_once(stack, op_ids, hook_log, receiver)


def test_ten_duplicate_completion_webhooks_run_each_step_once(
    tmp_path: Path, db_url: str, hook_log: Path
):
    # Slow polling: the completion webhook is what brings the final status read forward.
    polling = {"base_delay_seconds": 5, "max_delay_seconds": 5}
    request = {
        "scenario": "success",
        "duration": 0.3,
        "webhooks": "duplicate",
        "duplicates": 10,
        "webhook_on_running": False,
    }
    with (
        serve_receiver() as (receiver, cb_url),
        running_stack(tmp_path, db_url, provider={"polling": polling}, hooks=HOOKS) as stack,
    ):
        op_ids = [start(stack, request, f"{cb_url}/cb/dup") for _ in range(3)]
        wait_closed(stack, op_ids, timeout=20)
        for op_id in op_ids:
            op = stack.get(op_id)
            assert op["state"] == "succeeded"
            deliveries = loopback.get(
                f"{stack.sim_url}/_sim/deliveries",
                params={"job_id": op["remote_job_id"]},
                timeout=10,
            ).json()["attempts"]
            final = [d for d in deliveries if d["type"] == "job.succeeded"]
            assert len(final) == 10 and all(d["ok"] for d in final)
            (event_id,) = {d["event_id"] for d in final}
            events = EVENTS
            with stack.runtime.db.read() as conn:
                duplicates = conn.execute(
                    sa.select(events.c.duplicates).where(events.c.event_id == event_id)
                ).scalar_one()
            assert duplicates == 9
            hints = [e for e in stack.history(op_id) if e["cause"] == f"webhook:{event_id}"]
            assert len(hints) <= 1  # a seen event id has no second effect
        assert_each_step_once(stack, op_ids, hook_log, receiver)
