"""Contract test of the ``vertex_batch_prediction`` preset against a replay of Vertex AI.

As the projects.locations.batchPredictionJobs reference describes it: create answers
the BatchPredictionJob itself (not an operation) with ``name``, ``state``
(JOB_STATE_*), ``labels``, ``createTime``; get reads ``/v1/{name}``; list takes
``filter`` (``labels.KEY="VALUE"``), ``pageSize`` and ``pageToken`` and answers
``{batchPredictionJobs, nextPageToken}``; ``:cancel`` answers ``{}``; a finished job
has ``outputInfo`` and ``completionStats`` (int64 as strings); errors are
``{"error": {"code", "message", "status"}}``. No webhooks.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.integration.presets.replay import (
    FAST_CREATE,
    FAST_POLLING,
    Replay,
    answer_created,
    bearer_ok,
    google_credentials,
    google_error,
    observed_states,
    preset_stack,
    rfc3339_now,
)

PARENT = "/v1/projects/PROJECT/locations/us-central1/batchPredictionJobs"
REQUEST = {
    "displayName": "nightly-scores",
    "model": "projects/4242/locations/us-central1/models/77",
    "inputConfig": {"instancesFormat": "jsonl", "gcsSource": {"uris": ["gs://in/x.jsonl"]}},
    "outputConfig": {
        "predictionsFormat": "jsonl",
        "gcsDestination": {"outputUriPrefix": "gs://out/"},
    },
    "labels": {"team": "ranking"},
}
PAGE_SIZE = 2
LABEL_FILTER = re.compile(r'labels\.([a-z0-9_-]+)\s*=\s*"?([^"]*)"?')


def succeeded(state: str = "JOB_STATE_SUCCEEDED", failed: str = "0") -> dict[str, Any]:
    return {
        "state": state,
        "endTime": rfc3339_now(),
        "outputInfo": {"gcsOutputDirectory": "gs://out/prediction-nightly-scores-2024"},
        "completionStats": {"successfulCount": "98", "failedCount": failed, "incompleteCount": "0"},
    }


class JobsAPI:
    def __init__(self, replay: Replay) -> None:
        self.replay = replay

    async def create(self, request: Request) -> Response:
        body = await self.replay.record(request)
        if not bearer_ok(request):
            return google_error(401, "UNAUTHENTICATED", "Request had invalid credentials.")
        if not isinstance(body, dict) or "inputConfig" not in body:
            return google_error(400, "INVALID_ARGUMENT", "input_config is required")
        name = self.replay.new_id("projects/4242/locations/us-central1/batchPredictionJobs/")
        job = {
            **body,
            "name": name,
            "state": "JOB_STATE_PENDING",
            "createTime": rfc3339_now(),
            "updateTime": rfc3339_now(),
        }
        self.replay.add(name, job, body)
        answer = answer_created(self.replay, job)
        if not isinstance(answer, JSONResponse):
            # Jobs of other callers, made after ours: the list spans several pages.
            for n in range(5):
                other = self.replay.new_id(
                    "projects/4242/locations/us-central1/batchPredictionJobs/"
                )
                self.replay.add(
                    other,
                    {"name": other, "state": "JOB_STATE_RUNNING", "labels": {"team": f"other-{n}"}},
                    None,
                    scripted=False,
                )
        return answer

    async def listing(self, request: Request) -> Response:
        await self.replay.record(request)
        jobs = [j.body for j in reversed(self.replay.all_jobs())]
        wanted = LABEL_FILTER.fullmatch(request.query_params.get("filter", "").strip())
        if request.query_params.get("filter") and wanted is None:
            return google_error(400, "INVALID_ARGUMENT", "Unsupported filter.")
        if wanted is not None:
            key, value = wanted.groups()
            jobs = [j for j in jobs if j.get("labels", {}).get(key) == value]
        start = int(request.query_params.get("pageToken") or 0)
        page = jobs[start : start + PAGE_SIZE]
        answer: dict[str, Any] = {"batchPredictionJobs": page}
        if start + PAGE_SIZE < len(jobs):
            answer["nextPageToken"] = str(start + PAGE_SIZE)
        return JSONResponse(answer)

    async def job(self, request: Request) -> Response:
        await self.replay.record(request)
        path: str = request.path_params["name"]
        if request.method == "POST" and path.endswith(":cancel"):
            name = path.removesuffix(":cancel")
            if name not in self.replay.jobs:
                return google_error(404, "NOT_FOUND", f"BatchPredictionJob {name} not found.")
            self.replay.set(
                name,
                {"state": "JOB_STATE_CANCELLING"},
                [{}, {"state": "JOB_STATE_CANCELLED", "endTime": rfc3339_now()}],
            )
            return JSONResponse({})
        found = self.replay.read(path) if request.method == "GET" else None
        if found is None:
            return google_error(404, "NOT_FOUND", f"BatchPredictionJob {path} not found.")
        return JSONResponse(found)


def vertex_app(replay: Replay) -> Starlette:
    api = JobsAPI(replay)
    return Starlette(
        routes=[
            Route(PARENT, api.create, methods=["POST"]),
            Route(PARENT, api.listing, methods=["GET"]),
            Route("/v1/{name:path}", api.job, methods=["GET", "POST"]),
        ]
    )


@contextmanager
def stack(tmp_path: Path, db: str) -> Iterator[Any]:
    """The preset as shipped: its credential from Application Default Credentials."""
    overrides = {"polling": FAST_POLLING, "create": FAST_CREATE}
    with (
        google_credentials(tmp_path),
        preset_stack(
            tmp_path,
            db,
            "vertex_batch_prediction",
            vertex_app,
            overrides=overrides,
        ) as s,
    ):
        yield s


def test_a_job_walks_job_states_to_succeeded_with_output_info_as_result(
    tmp_path: Path, sqlite_db: str
) -> None:
    with stack(tmp_path, sqlite_db) as s:
        s.replay.script = [
            {"state": "JOB_STATE_QUEUED"},
            {"state": "JOB_STATE_RUNNING"},
            succeeded(),
        ]
        op_id = s.start(REQUEST)
        op = s.finish(op_id)
        assert op["state"] == "succeeded", op
        assert "gs://out/prediction" in json.dumps(op["result"]), op["result"]
        sent = s.replay.only_job().request
        assert sent["labels"] == {"team": "ranking", "reconciler_key": s.token(op_id)}
        assert observed_states(s.history(op_id))[:2] == ["JOB_STATE_QUEUED", "JOB_STATE_RUNNING"]


def test_partially_succeeded_is_completed_with_errors_and_failed_keeps_the_error(
    tmp_path: Path, sqlite_db: str
) -> None:
    with stack(tmp_path, sqlite_db) as s:
        s.replay.script = [succeeded("JOB_STATE_PARTIALLY_SUCCEEDED", failed="2")]
        op = s.finish(s.start(REQUEST))
        assert op["state"] == "completed_with_errors", op

        quota = {"code": 8, "message": "Quota exceeded for aiplatform.googleapis.com"}
        s.replay.script = [{"state": "JOB_STATE_FAILED", "error": quota}]
        op = s.finish(s.start({**REQUEST, "displayName": "second"}))
        assert op["state"] == "failed" and "Quota exceeded" in json.dumps(op["error"]), op


def test_cancel_goes_through_cancelling_to_cancelled(tmp_path: Path, sqlite_db: str) -> None:
    with stack(tmp_path, sqlite_db) as s:
        s.replay.script = [{"state": "JOB_STATE_RUNNING"}]
        op_id = s.start(REQUEST)
        op = s.cancel_when(op_id, "JOB_STATE_RUNNING", "running")
        assert op["state"] == "cancelled", op
        assert "JOB_STATE_CANCELLING" in observed_states(s.history(op_id))


def test_job_state_unspecified_is_unknown(tmp_path: Path, sqlite_db: str) -> None:
    with stack(tmp_path, sqlite_db) as s:
        s.replay.script = [{"state": "JOB_STATE_UNSPECIFIED"}]
        op = s.finish(s.start(REQUEST))
        assert op["state"] == "escalated" and op["escalation"]["reason"] == "unknown_state", op


def test_a_lost_create_is_found_by_its_label(tmp_path: Path, sqlite_db: str) -> None:
    with stack(tmp_path, sqlite_db) as s:
        s.replay.script = [succeeded()]
        s.replay.drop_next_create = True
        op_id = s.start(REQUEST)
        op = s.finish(op_id)
        assert op["state"] == "succeeded", op
        key = s.token(op_id)
        mine = s.jobs_with_key(op_id, "labels")
        assert len(mine) == 1 and op["remote_job_id"] == mine[0].id
        assert len(s.replay.requests("POST", PARENT)) == 1, "the create was resent"
        listed = s.replay.requests("GET", PARENT)
        assert listed and listed[0].query["filter"] == f'labels.reconciler_key="{key}"'
