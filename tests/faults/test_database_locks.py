"""The event loop never waits on a database lock; /readyz follows whether writes succeed.

The real service process on SQLite. Another connection holds ``BEGIN EXCLUSIVE``
for several times the write bound (the same property as a 20 s hold, in
seconds), then a full disk on a small tmpfs. Throughout, /healthz answers, every
write request ends within the bound (2xx, or 503 with Retry-After), /readyz is
503 while writes fail and 200 once they succeed, and every acknowledged write
is stored.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from reconciler.core.signatures import decode_whsec, sign_standard_webhook
from reconciler.demo.sim import SimConfig, SimState
from reconciler.demo.sim import create_app as create_sim
from tests.support import loopback
from tests.support.process import cli, make_tokens, service_config, service_process
from tests.support.servers import serve_asgi
from tests.support.stack import SIM_TOKEN, WEBHOOK_SECRET
from tests.support.waiting import wait_until

BOUND = 2.0  # server.write_wait_seconds in these tests
# /healthz takes milliseconds; a loop stalled by the lock would wait at least the write
# bound, and the hold is five bounds. A fraction of the bound is missed on a loaded
# machine by scheduling alone, so the probe allows the bound itself.
HEALTHZ_TIMEOUT = BOUND
SLACK = 3.0  # scheduling on a shared machine; a hang waits out the hold (five bounds)


@dataclass
class Probe:
    """Requests of one kind sent in a loop: (sent at, seconds taken, status or None)."""

    results: list[tuple[float, float, int | None]] = field(default_factory=list)
    retry_after: list[str | None] = field(default_factory=list)


@contextmanager
def probing(
    url: str, kinds: dict[str, Callable[[httpx.Client], httpx.Response]]
) -> Iterator[dict[str, Probe]]:
    probes = {name: Probe() for name in kinds}
    stop = threading.Event()

    def loop(name: str, send: Callable[[httpx.Client], httpx.Response]) -> None:
        with loopback.client(base_url=url, timeout=BOUND + 3 * SLACK) as client:
            while not stop.is_set():
                started = time.monotonic()
                retry_after = None
                try:
                    response = send(client)
                    status: int | None = response.status_code
                    retry_after = response.headers.get("retry-after")
                except httpx.HTTPError:
                    status = None
                probes[name].retry_after.append(retry_after)
                probes[name].results.append((started, time.monotonic() - started, status))
                stop.wait(0.05)

    threads = [threading.Thread(target=loop, args=item, daemon=True) for item in kinds.items()]
    for thread in threads:
        thread.start()
    try:
        yield probes
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=BOUND + 4 * SLACK)


class Writes:
    """Creates and webhook deliveries sent by the probes, to check what was acknowledged."""

    def __init__(self, agent: str) -> None:
        self.agent = agent
        self.created: list[str] = []
        self.events: list[str] = []
        self.key = decode_whsec(WEBHOOK_SECRET)

    def create(self, client: httpx.Client) -> httpx.Response:
        body = {
            "provider": "sim",
            "request": {"scenario": "never_finishes"},
            "idempotency_key": uuid.uuid4().hex,
        }
        response = client.post(
            "/v1/operations", json=body, headers={"Authorization": f"Bearer {self.agent}"}
        )
        if response.status_code in (200, 202):
            self.created.append(response.json()["id"])
        return response

    def webhook(self, client: httpx.Client) -> httpx.Response:
        event_id = f"evt_{uuid.uuid4().hex}"
        body = json.dumps(
            {"type": "job.running", "data": {"job_id": f"job_{uuid.uuid4().hex}"}}
        ).encode()
        headers = sign_standard_webhook(self.key, event_id, int(time.time()), body)
        response = client.post(
            "/webhooks/sim", content=body, headers={**headers, "content-type": "application/json"}
        )
        if 200 <= response.status_code < 300:
            self.events.append(event_id)
        return response


def _check_bounded(probes: dict[str, Probe], hold: tuple[float, float]) -> None:
    for name in ("create", "webhook"):
        probe = probes[name]
        assert probe.results, name
        for _, took, status in probe.results:
            assert status is not None, f"{name}: a request failed without an answer"
            assert status < 300 or status == 503, f"{name}: answered {status}"
            assert took < BOUND + SLACK, f"{name}: a request waited {took:.1f} s"
        during = [s for at, _, s in probe.results if hold[0] + BOUND < at < hold[1] - BOUND]
        assert 503 in during, f"{name}: no write was refused while the lock was held"
        refused = [
            ra for (_, _, s), ra in zip(probe.results, probe.retry_after, strict=True) if s == 503
        ]
        assert all(ra for ra in refused), f"{name}: a 503 without Retry-After"
    _check_healthz(probes)


def _check_healthz(probes: dict[str, Probe]) -> None:
    health = probes["healthz"].results
    failed = [(round(took, 2), status) for _, took, status in health if status != 200]
    assert health and not failed, f"/healthz failed (seconds, status): {failed}"


def _check_ready_flips(probes: dict[str, Probe], hold: tuple[float, float]) -> None:
    ready = probes["readyz"].results
    assert any(s == 503 for at, _, s in ready if hold[0] < at < hold[1]), "/readyz stayed 200"
    assert ready[-1][2] == 200, "/readyz did not come back once writes succeeded"


def _stored(db_path: Path, writes: Writes) -> None:
    with sqlite3.connect(db_path) as conn:
        ops = {r[0] for r in conn.execute("SELECT id FROM operations")}
        events = {r[0] for r in conn.execute("SELECT event_id FROM webhook_events")}
    assert set(writes.created) <= ops, "an acknowledged create was lost"
    assert set(writes.events) <= events, "an acknowledged webhook was lost"


@contextmanager
def service(tmp_path: Path, db_path: Path) -> Iterator[tuple[str, Writes]]:
    sim = SimState(SimConfig(token=SIM_TOKEN, webhook_secret=WEBHOOK_SECRET))
    with serve_asgi(create_sim(state=sim)) as sim_url:
        db_url = f"sqlite:///{db_path}"
        config, port = service_config(
            tmp_path, db_url, sim_url, server={"write_wait_seconds": BOUND}
        )
        assert cli(config, "db", "upgrade").returncode == 0
        agent, _ = make_tokens(db_url)
        with service_process(config, port) as svc:
            yield svc.url, Writes(agent)


def _wait_ready(url: str, timeout: float = 15) -> None:
    wait_until(
        lambda: loopback.get(f"{url}/readyz", timeout=3).status_code == 200,
        timeout,
        "/readyz to return to 200",
    )


def _kinds(writes: Writes) -> dict[str, Callable[[httpx.Client], httpx.Response]]:
    return {
        "healthz": lambda c: c.get("/healthz", timeout=HEALTHZ_TIMEOUT),
        "readyz": lambda c: c.get("/readyz"),
        "create": writes.create,
        "webhook": writes.webhook,
    }


def test_an_outside_exclusive_lock_stalls_only_the_writes(tmp_path: Path) -> None:
    db_path = tmp_path / "reconciler.db"
    hold_seconds = 5 * BOUND
    with service(tmp_path, db_path) as (url, writes), probing(url, _kinds(writes)) as probes:
        time.sleep(1.0)  # some traffic before the lock
        outside = sqlite3.connect(db_path, isolation_level=None, timeout=10)
        outside.execute("BEGIN EXCLUSIVE")
        hold = (time.monotonic(), time.monotonic() + hold_seconds)
        time.sleep(hold_seconds)
        outside.execute("ROLLBACK")
        outside.close()
        _wait_ready(url)
        time.sleep(1.0)  # writes flow again
    _check_bounded(probes, hold)
    _check_ready_flips(probes, hold)
    _stored(db_path, writes)


@contextmanager
def small_tmpfs(where: Path, size: str) -> Iterator[Path]:
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, check=False)


def _fill(directory: Path) -> Path:
    filler = directory / "filler"
    # Unbuffered: a buffered file keeps the tail of a short write and raises ENOSPC again
    # when it is closed (the service's own writes leave the space no multiple of a chunk).
    with filler.open("wb", buffering=0) as fh:
        try:
            while True:
                fh.write(b"\0" * 65536)
        except OSError:
            pass
    return filler


def test_a_full_disk_turns_readyz_and_nothing_acknowledged_is_lost(tmp_path: Path) -> None:
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    # Room for what the service writes before the filler takes the rest (its WAL alone
    # passed 8 MB on a loaded machine, and the disk was full before the filler was).
    with small_tmpfs(tmp_path / "small", "64m") as small:
        db_path = small / "reconciler.db"
        with service(tmp_path, db_path) as (url, writes), probing(url, _kinds(writes)) as probes:
            time.sleep(1.0)
            filler = _fill(small)
            full = (time.monotonic(), 0.0)
            with suppress(AssertionError):  # full or not, the writes are what is checked
                wait_until(
                    lambda: loopback.get(f"{url}/readyz", timeout=3).status_code == 503,
                    20,
                    "/readyz to say the disk is full",
                )
            time.sleep(2 * BOUND)
            filler.unlink()
            full = (full[0], time.monotonic())
            _wait_ready(url)
            time.sleep(1.0)
        _check_healthz(probes)
        for name in ("create", "webhook"):
            for _, took, status in probes[name].results:
                assert status is not None and (status < 300 or status == 503), (name, status)
                assert took < BOUND + SLACK, f"{name}: a request waited {took:.1f} s"
            assert any(s == 503 for at, _, s in probes[name].results if full[0] < at < full[1])
        _check_ready_flips(probes, full)
        _stored(db_path, writes)
