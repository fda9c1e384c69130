"""``GET /v1/operations/{id}/wait``: the long-poll agents use instead of polling loops.

Completion is triggered with the simulator's ``POST /_sim/jobs/{id}/complete``
(its webhook hint brings the confirming status read forward); how soon a
waiter returns is measured from the ``done_at`` the service wrote.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from reconciler.app import create_app
from reconciler.config import ServerSettings
from reconciler.runtime import Runtime
from reconciler.storage.operations import load_operation
from tests.support import loopback
from tests.support.servers import serve_asgi
from tests.support.stack import Stack, running_stack
from tests.support.waiting import wait_until, wait_until_async

# The target is 100 ms from the end-state write to the waiter's answer; the assertion is
# looser because other suites share this machine's two cores.
WAKE_BOUND = 0.5
NEVER = {"scenario": "never_finishes"}
POLLING = {"polling": {"base_delay_seconds": 0.2, "max_delay_seconds": 1.0}}


@contextmanager
def replica(
    stack: Stack, *, background: bool, server: ServerSettings | None = None
) -> Iterator[tuple[str, Runtime]]:
    """Another service on the stack's database; ``background=False``: API only, no worker."""
    settings = stack.runtime.settings
    if server is not None:
        settings = settings.model_copy(update={"server": server})
    runtime = Runtime.build(settings, environ=stack.runtime.environ)
    with serve_asgi(create_app(runtime, background=background)) as url:
        yield url, runtime


def observing(stack: Stack) -> dict[str, Any]:
    response = stack.create(NEVER)
    assert response.status_code == 202, response.text
    op = stack.wait_state(response.json()["id"], {"observing"}, timeout=10)
    assert op["state"] == "observing", op
    return op


def complete_at_provider(stack: Stack, op: dict[str, Any]) -> None:
    response = loopback.post(
        f"{stack.sim_url}/_sim/jobs/{op['remote_job_id']}/complete",
        json={"state": "succeeded"},
        timeout=10,
    )
    response.raise_for_status()


def done_at(op: dict[str, Any]) -> float:
    return datetime.fromisoformat(op["done_at"].replace("Z", "+00:00")).timestamp()


class Waiter(threading.Thread):
    """One long-poll in the background; records the answer and when it arrived."""

    def __init__(self, url: str, stack: Stack, op_id: str, timeout: float) -> None:
        super().__init__(daemon=True)
        self.request = (f"{url}/v1/operations/{op_id}/wait", stack.headers(), timeout)
        self.response: httpx.Response | None = None
        self.returned_at = 0.0

    def run(self) -> None:
        url, headers, timeout = self.request
        params = {"timeout_seconds": timeout}
        self.response = loopback.get(url, params=params, headers=headers, timeout=timeout + 10)
        self.returned_at = time.time()

    def result(self) -> dict[str, Any]:
        self.join(timeout=30)
        assert self.response is not None and self.response.status_code == 200
        op: dict[str, Any] = self.response.json()
        return op


def parked(runtime: Runtime, op_id: str, count: int = 1) -> bool:
    # The notifier keeps one shared event per operation and a count of its waiters.
    return runtime.notifier._counts.get(op_id, 0) >= count


def woken_after(url: str, stack: Stack, runtime: Runtime) -> float:
    """Seconds from the end-state write to a parked waiter's answer, for one operation."""
    op = observing(stack)
    waiter = Waiter(url, stack, op["id"], timeout=15)
    waiter.start()
    wait_until(lambda: parked(runtime, op["id"]), 10, "the waiter to park")
    complete_at_provider(stack, op)
    answer = waiter.result()
    assert answer["done"] is True and answer["state"] == "succeeded"
    return waiter.returned_at - done_at(answer)


def best_of(attempts: int, measure: Callable[[], float]) -> float:
    """The smallest of up to ``attempts`` measurements, stopping once one is within bound.

    Load from other suites only ever adds latency; a waiter that is not woken by the
    change itself misses the bound every time.
    """
    seen = [measure()]
    while seen[-1] >= WAKE_BOUND and len(seen) < attempts:
        seen.append(measure())
    return min(seen)


@pytest.mark.both_backends
def test_wait_returns_right_after_completion(tmp_path: Path, db_url: str):
    with running_stack(tmp_path, db_url, provider=POLLING) as stack:
        assert best_of(3, lambda: woken_after(stack.url, stack, stack.runtime)) < WAKE_BOUND


def test_wait_returns_not_done_at_its_timeout(tmp_path: Path, db_url: str):
    with running_stack(tmp_path, db_url, provider=POLLING) as stack:
        op = observing(stack)
        started = time.monotonic()
        response = stack.client.get(
            f"/v1/operations/{op['id']}/wait",
            params={"timeout_seconds": 0.5},
            headers=stack.headers(),
        )
        elapsed = time.monotonic() - started
        assert response.status_code == 200
        assert response.json()["done"] is False
        assert response.json()["state"] == "observing"
        assert 0.45 <= elapsed < 5.0


def test_wait_timeout_is_capped_by_server_wait_max_seconds(tmp_path: Path, db_url: str):
    with (
        running_stack(tmp_path, db_url, provider=POLLING) as stack,
        replica(stack, background=False, server=ServerSettings(wait_max_seconds=0.5)) as (
            url,
            _,
        ),
    ):
        op = observing(stack)
        for params in ({"timeout_seconds": 20}, {}):
            started = time.monotonic()
            response = loopback.get(
                f"{url}/v1/operations/{op['id']}/wait",
                params=params,
                headers=stack.headers(),
                timeout=30,
            )
            elapsed = time.monotonic() - started
            assert response.status_code == 200
            assert response.json()["done"] is False
            assert 0.45 <= elapsed < 5.0, params


@pytest.mark.parametrize("value", ["abc", "-1", "nan", ""])
def test_bad_timeout_is_400(tmp_path: Path, db_url: str, value: str):
    with running_stack(tmp_path, db_url, provider=POLLING) as stack:
        op = observing(stack)
        response = stack.client.get(
            f"/v1/operations/{op['id']}/wait",
            params={"timeout_seconds": value},
            headers=stack.headers(),
        )
        assert response.status_code == 400, response.text
        assert "timeout_seconds" in response.json()["error"]["message"]


@pytest.mark.both_backends
def test_waiter_on_one_replica_is_woken_by_a_completion_on_another(
    tmp_path: Path, db_url: str, backend: str
):
    if backend != "postgres":
        pytest.skip("replicas learn of each other's changes through PostgreSQL LISTEN/NOTIFY")
    with (
        running_stack(tmp_path, db_url, provider=POLLING) as stack,
        replica(stack, background=False) as (url_a, runtime_a),
    ):
        assert best_of(3, lambda: woken_after(url_a, stack, runtime_a)) < WAKE_BOUND
        # A has no worker: every completion was B's.
        listed = stack.client.get("/v1/operations", headers=stack.headers(operator=True))
        for op in listed.json()["operations"]:
            actors = {e["actor"] for e in stack.history(op["id"])}
            assert f"worker:{runtime_a.worker_id}" not in actors
            assert f"worker:{stack.runtime.worker_id}" in actors


@pytest.mark.both_backends
def test_two_hundred_waiters_share_one_wakeup(tmp_path: Path, db_url: str):
    waiters = 200
    with running_stack(tmp_path, db_url, provider=POLLING) as stack:
        op = observing(stack)
        threads_before = threading.active_count()

        async def scenario() -> tuple[list[httpx.Response], list[float], int]:
            limits = httpx.Limits(max_connections=waiters + 10)
            async with loopback.async_client(
                base_url=stack.url, limits=limits, timeout=60
            ) as client:
                returned: list[float] = []

                async def wait_one() -> httpx.Response:
                    response = await client.get(
                        f"/v1/operations/{op['id']}/wait",
                        params={"timeout_seconds": 30},
                        headers=stack.headers(),
                    )
                    returned.append(time.time())
                    return response

                tasks = [asyncio.create_task(wait_one()) for _ in range(waiters)]

                def all_parked() -> bool:
                    assert not any(t.done() for t in tasks), "a waiter returned early"
                    return parked(stack.runtime, op["id"], waiters)

                await wait_until_async(all_parked, 20, "the waiters to park")
                threads_parked = threading.active_count()
                done = await client.post(
                    f"{stack.sim_url}/_sim/jobs/{op['remote_job_id']}/complete",
                    json={"state": "succeeded"},
                )
                done.raise_for_status()
                responses = await asyncio.gather(*tasks)
            return responses, returned, threads_parked

        responses, returned, threads_parked = asyncio.run(scenario())
        # Parked waiters cost no thread each: one shared event for the operation.
        assert threads_parked - threads_before < 50
        assert stack.runtime.notifier.waiting == 0  # all woken and cleared
        answers = [r.json() for r in responses]
        assert all(r.status_code == 200 for r in responses)
        assert all(a["done"] is True and a["state"] == "succeeded" for a in answers)
        # Woken by the completion, not by their own 30 s timeout. Each woken waiter still
        # reloads the operation itself, so 200 answers take a few seconds to drain here.
        finished = done_at(answers[0])
        assert finished <= min(returned) and max(returned) - finished < 15


@pytest.mark.both_backends
def test_a_change_between_wake_up_and_resubscribing_is_not_missed(tmp_path: Path, db_url: str):
    # A change made in this process hands its waiters the committed record. When that
    # record does not settle the wait, a later change may already have come (and found
    # no subscriber): the waiter must read, not wait on the handed record until timeout.
    with running_stack(tmp_path, db_url, provider=POLLING) as stack:
        op = observing(stack)
        rt = stack.runtime
        with rt.db.read() as conn:
            stale = load_operation(conn, op["id"])
        waiter = Waiter(stack.url, stack, op["id"], timeout=20)
        waiter.start()
        wait_until(lambda: parked(rt, op["id"]), 10, "the waiter to park")
        with rt.db.write() as conn:  # the later change, whose notification nobody heard
            conn.execute(
                sa.text("UPDATE operations SET state = 'succeeded' WHERE id = :id"),
                {"id": op["id"]},
            )
        rt.notifier.changed(op["id"], stale)
        answer = waiter.result()
        assert answer["state"] == "succeeded" and answer["done"] is True


@pytest.mark.both_backends
def test_a_wait_returns_when_a_decision_becomes_pending_and_when_it_is_made(
    tmp_path: Path, db_url: str
):
    """The job stops at its deadline: ``done`` stays false while an operator decides, so a
    wait cannot return for ``done``; it returns when the decision becomes pending, and a
    wait parked on the pending decision returns when the decision is recorded."""
    with running_stack(tmp_path, db_url, provider=POLLING) as stack:
        # Long enough for the wait to park on the running job first (a wait that begins on
        # a pending decision waits for the decision instead).
        response = stack.create({**NEVER, "webhooks": "never"}, deadline_seconds=5.0)
        assert response.status_code == 202, response.text
        op_id = response.json()["id"]
        running = Waiter(stack.url, stack, op_id, timeout=20)
        running.start()
        wait_until(lambda: parked(stack.runtime, op_id), 10, "the waiter to park")
        stopped = running.result()
        assert stopped["state"] == "result_timed_out"
        assert (stopped["done"], stopped["awaiting_decision"]) == (False, True)
        assert stopped["done_at"] is None  # nothing reads as final while a person decides
        pending_since = epoch(stopped["escalation"]["created_at"])
        assert running.returned_at - pending_since < 5.0  # not the 20 s timeout

        pending = Waiter(stack.url, stack, op_id, timeout=20)
        pending.start()
        wait_until(lambda: parked(stack.runtime, op_id), 10, "the waiter to park")
        decided = stack.client.post(
            f"/v1/operations/{op_id}/decisions",
            json={"action": "extend", "extra_seconds": 60},
            headers=stack.headers(operator=True),
        )
        assert decided.status_code == 200, decided.text
        decided_at = time.time()
        answer = pending.result()
        assert answer["state"] == "observing" and answer["escalation"]["decided"] is True
        assert (answer["done"], answer["awaiting_decision"]) == (False, False)
        assert pending.returned_at - decided_at < 5.0  # woken by the decision


def epoch(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
