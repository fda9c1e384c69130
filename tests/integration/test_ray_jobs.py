"""The ``ray_jobs`` preset against a real Ray head (``ray[default]``, Jobs REST API on loopback).

One head for this module (10-20 s to start; stopped when the module ends, so its idle
processes cost the rest of the run nothing), one service per module, the
service reaching Ray through a pass-through proxy that one test arms to lose a
create's answer. Each test makes jobs under its own submission ids (the operations'
idempotency tokens) and reads what Ray holds with ``GET /api/jobs/``; each asserts
what Ray did (job count, status, entrypoint) as well as what the service reports.

If Ray cannot start, the tests fail, with the reason; locally, without Ray installed,
they skip (``pip install -e ".[test,ray]"`` brings it; CI always has it).
"""

from __future__ import annotations

import os
import shlex
import tomllib
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from reconciler.app import create_app
from reconciler.config import CallbackSettings, SchedulerSettings, ServerSettings, Settings
from reconciler.runtime import Runtime
from tests.support import loopback
from tests.support.databases import sqlite_url
from tests.support.drop_proxy import DropProxy, drop_proxy
from tests.support.ray_head import RayHead, RayStartFailed, RayUnavailable, ray_head
from tests.support.ray_head import ray_executable as find_ray
from tests.support.servers import serve_asgi
from tests.support.stack import make_tokens, quiescent, worker_of
from tests.support.waiting import wait_until

# The first test also waits for the head to start: 10-20 s on an idle machine, and about
# a minute was seen on a loaded one. One xdist worker runs the whole module (see
# tests/support/scheduling.py), so one head serves it.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

PROVIDER = "ray"
PRESET = Path(__file__).resolve().parents[2] / "service/reconciler/providers/presets/ray_jobs.toml"
# Ray's own pace decides these tests' length: a job takes 2-4 s to start and end. Reads
# every quarter of a second at first, at most every second, keep the wait short without
# hammering the head; the preset's other keys are used as they ship.
TEST_POLLING = {"base_delay_seconds": 0.25, "max_delay_seconds": 1.0, "deadline_seconds": 90}
JOB_TIMEOUT = 60.0
# A job's reads, at most: a job that ends in about 5 s needs a dozen at this pace.
MAX_READS = 60


@pytest.fixture(scope="module")
def ray() -> Iterator[RayHead]:
    try:
        find_ray()
    except RayUnavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"Ray must run in CI: {exc}")
        pytest.skip(str(exc))
    with ExitStack() as stack:
        try:
            head = stack.enter_context(ray_head())
        except RayStartFailed as exc:
            pytest.fail(f"the Ray head did not start: {exc}")
        yield head


@dataclass
class RayService:
    url: str
    runtime: Runtime
    proxy: DropProxy
    agent_token: str
    workers: list[Any]
    client: httpx.Client = field(init=False)

    def __post_init__(self) -> None:
        self.client = loopback.client(base_url=self.url, timeout=30.0)
        self.headers = {"Authorization": f"Bearer {self.agent_token}"}

    def submit(self, request: dict[str, Any], **fields: Any) -> httpx.Response:
        body = {"provider": PROVIDER, "request": request, **fields}
        return self.client.post("/v1/operations", json=body, headers=self.headers)

    def start(self, request: dict[str, Any], **fields: Any) -> dict[str, Any]:
        response = self.submit(request, **fields)
        assert response.status_code == 202, response.text
        op: dict[str, Any] = response.json()
        return op

    def get(self, op_id: str) -> dict[str, Any]:
        response = self.client.get(f"/v1/operations/{op_id}", headers=self.headers)
        response.raise_for_status()
        op: dict[str, Any] = response.json()
        return op

    def wait_for(self, op_id: str, what: str, check: Any) -> dict[str, Any]:
        seen: dict[str, Any] = {}

        def holds() -> bool:
            seen.update(self.get(op_id))
            return bool(check(seen))

        try:
            wait_until(holds, JOB_TIMEOUT, what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last {seen}; history {self.story(op_id)}") from None
        return seen

    def finish(self, op_id: str) -> dict[str, Any]:
        self.wait_for(op_id, "the operation to end", lambda op: op["done"])
        wait_until(lambda: self.idle(op_id), 10, "the workers to go idle")
        return self.get(op_id)

    def idle(self, op_id: str) -> bool:
        return all(w.in_flight == 0 for w in self.workers) and quiescent(self.runtime.db, op_id)

    def history(self, op_id: str) -> list[dict[str, Any]]:
        response = self.client.get(f"/v1/operations/{op_id}/history", headers=self.headers)
        response.raise_for_status()
        entries: list[dict[str, Any]] = response.json()["entries"]
        return entries

    def story(self, op_id: str) -> list[tuple[Any, ...]]:
        return [(e["kind"], e.get("to"), e.get("cause")) for e in self.history(op_id)]


@pytest.fixture(scope="module")
def service(ray: RayHead, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayService]:
    tmp = tmp_path_factory.mktemp("ray-service")
    with ExitStack() as stack:
        db_url = stack.enter_context(sqlite_url(tmp))
        proxy, proxy_url = stack.enter_context(drop_proxy(ray.url))
        providers_dir = tmp / "no-provider-files"
        providers_dir.mkdir()
        table = {"preset": "ray_jobs", "base_url": proxy_url, "polling": TEST_POLLING}
        settings = Settings(
            database_url=db_url,
            providers_dir=str(providers_dir),
            providers={PROVIDER: table},
            server=ServerSettings(wait_max_seconds=10.0),
            scheduler=SchedulerSettings(tick_seconds=0.1, lease_seconds=30.0),
            callbacks=CallbackSettings(allow_hosts=("127.0.0.1",)),
        )
        runtime = Runtime.build(settings, environ={})
        agent, _ = make_tokens(runtime)
        app = create_app(runtime)
        url = stack.enter_context(serve_asgi(app))
        svc = RayService(url, runtime, proxy, agent, [worker_of(app)])
        try:
            yield svc
        finally:
            svc.client.close()


def printing(text: str) -> str:
    """A shell entrypoint that prints ``text`` with the head's Python."""
    return f"python -c {shlex.quote(f'print({text!r})')}"


def ray_jobs_with(ray: RayHead, entrypoint: str) -> list[dict[str, Any]]:
    return [job for job in ray.jobs() if job.get("entrypoint") == entrypoint]


def reads(op: dict[str, Any]) -> int:
    used: int = op["budget"]["status_requests_used"]
    return used


def test_a_job_succeeds_with_its_output_as_the_result(ray: RayHead, service: RayService):
    marker = f"hello from ray {uuid.uuid4().hex[:8]}"
    entrypoint = printing(marker)
    op = service.finish(service.start({"entrypoint": entrypoint})["id"])
    assert op["state"] == "succeeded", service.story(op["id"])
    assert op["remote_state"] == "SUCCEEDED"
    assert marker in op["result"]["data"]["logs"]
    [job] = ray_jobs_with(ray, entrypoint)
    assert job["submission_id"] == op["remote_job_id"]
    assert job["status"] == "SUCCEEDED" and job["driver_exit_code"] == 0
    assert 1 <= reads(op) <= MAX_READS


def test_a_failing_entrypoint_fails_with_rays_message(ray: RayHead, service: RayService):
    tag = uuid.uuid4().hex[:8]
    entrypoint = f"python -c {shlex.quote(f'import sys; print({tag!r}); sys.exit(3)')}"
    op = service.finish(service.start({"entrypoint": entrypoint})["id"])
    assert op["state"] == "failed", service.story(op["id"])
    assert op["remote_state"] == "FAILED" and op["result"] is None
    [job] = ray_jobs_with(ray, entrypoint)
    assert job["status"] == "FAILED" and job["error_type"] == "JOB_ENTRYPOINT_COMMAND_ERROR"
    # Ray's own words, as Ray gave them: the exit code and the tail of the job's log.
    assert "exit code 3" in job["message"]
    assert "exit code 3" in str(op["error"]) and tag in str(op["error"])


def test_cancel_of_a_running_job_ends_cancelled_when_ray_reports_stopped(
    ray: RayHead, service: RayService
):
    entrypoint = f"sleep 60 # {uuid.uuid4().hex[:8]}"
    op_id = service.start({"entrypoint": entrypoint})["id"]
    service.wait_for(op_id, "Ray to run the job", lambda op: op["remote_state"] == "RUNNING")
    response = service.client.post(
        f"/v1/operations/{op_id}/cancel", json={"reason": "not needed"}, headers=service.headers
    )
    assert response.status_code == 202, response.text
    op = service.finish(op_id)
    assert op["state"] == "cancelled", service.story(op_id)
    assert op["remote_state"] == "STOPPED"
    [job] = ray_jobs_with(ray, entrypoint)
    assert job["status"] == "STOPPED"
    # Stopped, not run out: the entrypoint would have slept a full minute.
    assert job["end_time"] - job["start_time"] < 30_000
    stops = service.proxy.seen("POST", f"/api/jobs/{job['submission_id']}/stop")
    assert [stop.status for stop in stops] == [200]


def test_the_same_idempotency_key_twice_is_one_operation_and_one_ray_job(
    ray: RayHead, service: RayService
):
    entrypoint = printing(f"once {uuid.uuid4().hex[:8]}")
    key = f"nightly-{uuid.uuid4().hex[:8]}"
    first = service.submit({"entrypoint": entrypoint}, idempotency_key=key)
    second = service.submit({"entrypoint": entrypoint}, idempotency_key=key)
    assert first.status_code == 202, first.text
    assert second.status_code == 200, second.text
    assert second.json()["id"] == first.json()["id"]
    op = service.finish(first.json()["id"])
    again = service.submit({"entrypoint": entrypoint}, idempotency_key=key)
    assert again.status_code == 200 and again.json()["id"] == op["id"]
    assert op["state"] == "succeeded", service.story(op["id"])
    assert [job["submission_id"] for job in ray_jobs_with(ray, entrypoint)] == [op["remote_job_id"]]


def test_a_lost_create_answer_makes_exactly_one_ray_job(ray: RayHead, service: RayService):
    entrypoint = printing(f"lost answer {uuid.uuid4().hex[:8]}")
    jobs_before = len(ray.jobs())
    creates_before = len(service.proxy.seen("POST", "/api/jobs/"))
    service.proxy.drop_next("POST", "/api/jobs/")
    op = service.finish(service.start({"entrypoint": entrypoint})["id"])
    assert op["state"] == "succeeded", service.story(op["id"])
    creates = service.proxy.seen("POST", "/api/jobs/")[creates_before:]
    # Ray made the job; its answer never reached the service, which knew it.
    assert creates[0].status == 200 and creates[0].dropped
    assert ("transition", "create_unknown", "create_ambiguous") in service.story(op["id"])
    [job] = ray_jobs_with(ray, entrypoint)
    assert job["submission_id"] == op["remote_job_id"] and job["status"] == "SUCCEEDED"
    assert len(ray.jobs()) == jobs_before + 1
    # Any create sent again carried the same submission id and Ray refused it as a duplicate.
    assert all(c.status == 500 for c in creates[1:])


def test_a_request_holding_the_submission_id_is_refused_and_makes_no_job(
    ray: RayHead, service: RayService
):
    jobs_before = len(ray.jobs())
    response = service.submit({"entrypoint": "echo never", "submission_id": "mine"})
    assert response.status_code == 400, response.text
    assert "/submission_id" in response.json()["error"]["message"]
    assert len(ray.jobs()) == jobs_before
    assert ray.job("mine").status_code == 404


def test_rays_answers_are_what_the_preset_expects(ray: RayHead):
    """The preset's facts, read from the real server: a duplicate submission id is
    answered as the preset's duplicate rule says, an unknown id is a 404, the job reads
    under its submission id (the preset's lookup and status paths), and it is listed once."""
    preset = tomllib.loads(PRESET.read_text("utf-8"))
    duplicate = preset["create"]["duplicate"]
    submission_id = f"probe-{uuid.uuid4().hex[:8]}"
    body = {"entrypoint": "echo probe", "submission_id": submission_id}
    with loopback.client(base_url=ray.url, timeout=30) as client:
        made = client.post("/api/jobs/", json=body)
        assert made.status_code == 200, made.text
        assert made.json()["submission_id"] == submission_id
        again = client.post("/api/jobs/", json=body)
        assert again.status_code in duplicate["status"]
        assert duplicate["body_contains"] in again.text
        read = client.get(preset["lookup"]["path"].format(idempotency_key=submission_id))
        assert read.status_code == 200 and read.json()["submission_id"] == submission_id
        assert read.json()["status"] in {w for words in preset["states"].values() for w in words}
        assert client.get(f"/api/jobs/{submission_id}-unknown").status_code == 404
        assert client.post(f"/api/jobs/{submission_id}-unknown/stop").status_code == 404
    assert [j["submission_id"] for j in ray.jobs()].count(submission_id) == 1
