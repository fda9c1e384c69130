"""Contract test of the ``openai_batch`` preset against a replay of the OpenAI Batch API.

The replay answers as the Batch and Files references describe: a batch object with a
``status`` word, unix-second timestamps, ``request_counts``, ``output_file_id`` and
``error_file_id``; the list is newest first with ``first_id``/``last_id``/``has_more``
and an ``after`` cursor; errors are ``{"error": {"message", "type", "param", "code"}}``;
webhooks are thin Standard Webhooks events (``data.id`` only).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.integration.presets.replay import (
    API_TOKEN,
    FAST_CREATE,
    FAST_POLLING,
    SLOW_POLLING,
    WEBHOOK_SECRET,
    Replay,
    answer_created,
    bearer_ok,
    jsonl,
    now_unix,
    observed_states,
    openai_error,
    openai_event,
    post,
    preset_stack,
)

ENVIRON = {"OPENAI_API_KEY": API_TOKEN, "OPENAI_WEBHOOK_SECRET": WEBHOOK_SECRET}
REQUEST = {
    "input_file_id": "file-input01",
    "endpoint": "/v1/chat/completions",
    "completion_window": "24h",
    "metadata": {"project": "nightly-eval"},
}
OTHER_CLIENTS_BATCHES = 130  # made right after ours: the lookup must read a second page


def batch_object(replay: Replay, request: dict[str, Any]) -> dict[str, Any]:
    created = now_unix()
    return {
        "id": replay.new_id("batch_"),
        "object": "batch",
        "endpoint": request.get("endpoint"),
        "errors": None,
        "input_file_id": request.get("input_file_id"),
        "completion_window": request.get("completion_window"),
        "status": "validating",
        "output_file_id": None,
        "error_file_id": None,
        "created_at": created,
        "in_progress_at": None,
        "expires_at": created + 86400,
        "finalizing_at": None,
        "completed_at": None,
        "failed_at": None,
        "expired_at": None,
        "cancelling_at": None,
        "cancelled_at": None,
        "request_counts": {"total": 0, "completed": 0, "failed": 0},
        "metadata": request.get("metadata"),
    }


class BatchAPI:
    """The Batch and Files endpoints, over one ``Replay``."""

    def __init__(self, replay: Replay) -> None:
        self.replay = replay

    async def create(self, request: Request) -> Response:
        body = await self.replay.record(request)
        if not bearer_ok(request):
            return openai_error(401, "Incorrect API key provided.")
        if not isinstance(body, dict) or "input_file_id" not in body:
            return openai_error(400, "Missing required parameter: 'input_file_id'.")
        batch = batch_object(self.replay, body)
        self.replay.add(batch["id"], batch, body)
        answer = answer_created(self.replay, batch)
        if not isinstance(answer, JSONResponse):
            # The answer is lost, and other clients keep making batches after ours.
            for _ in range(OTHER_CLIENTS_BATCHES):
                other = batch_object(self.replay, {**REQUEST, "metadata": {"owner": "other"}})
                self.replay.add(other["id"], other, None, scripted=False)
        return answer

    async def listing(self, request: Request) -> Response:
        await self.replay.record(request)
        limit = int(request.query_params.get("limit", "20"))
        after = request.query_params.get("after")
        batches = [j.body for j in reversed(self.replay.all_jobs())]  # newest first
        ids = [b["id"] for b in batches]
        if after is not None:
            if after not in ids:
                return openai_error(400, f"Invalid 'after': no batch {after}.")
            batches = batches[ids.index(after) + 1 :]
        page = batches[:limit]
        first, last = (page[0]["id"], page[-1]["id"]) if page else (None, None)
        return JSONResponse(
            {
                "object": "list",
                "data": page,
                "first_id": first,
                "last_id": last,
                "has_more": len(batches) > limit,
            }
        )

    async def retrieve(self, request: Request) -> Response:
        await self.replay.record(request)
        batch_id = request.path_params["batch_id"]
        found = self.replay.read(batch_id)
        if found is None:
            return openai_error(404, f"No batch found with id '{batch_id}'.")
        return JSONResponse(found)

    async def cancel(self, request: Request) -> Response:
        await self.replay.record(request)
        batch_id = request.path_params["batch_id"]
        if batch_id not in self.replay.jobs:
            return openai_error(404, f"No batch found with id '{batch_id}'.")
        self.replay.set(
            batch_id,
            {"status": "cancelling", "cancelling_at": now_unix()},
            [{}, {"status": "cancelled", "cancelled_at": now_unix()}],
        )
        return JSONResponse(self.replay.peek(batch_id))

    async def content(self, request: Request) -> Response:
        await self.replay.record(request)
        data = self.replay.files.get(request.path_params["file_id"])
        if data is None:
            return openai_error(404, "No such File object")
        # The Files API serves file content as octet-stream, JSONL or not.
        return Response(data, media_type="application/octet-stream")


def openai_app(replay: Replay) -> Starlette:
    api = BatchAPI(replay)
    return Starlette(
        routes=[
            Route("/v1/batches", api.create, methods=["POST"]),
            Route("/v1/batches", api.listing, methods=["GET"]),
            Route("/v1/batches/{batch_id}", api.retrieve, methods=["GET"]),
            Route("/v1/batches/{batch_id}/cancel", api.cancel, methods=["POST"]),
            Route("/v1/files/{file_id}/content", api.content, methods=["GET"]),
        ]
    )


def output_line(n: int, status: int = 200) -> dict[str, Any]:
    body: dict[str, Any] = (
        {"id": f"chatcmpl-{n}", "object": "chat.completion", "choices": []}
        if status == 200
        else {"error": {"message": "bad request", "type": "invalid_request_error"}}
    )
    return {
        "id": f"batch_req_{n}",
        "custom_id": f"request-{n}",
        "response": {"status_code": status, "request_id": f"req_{n}", "body": body},
        "error": None,
    }


def stack(tmp_path: Path, db: str, polling: dict[str, Any], **more: Any) -> Any:
    overrides = {"polling": polling, "create": FAST_CREATE, **more}
    return preset_stack(
        tmp_path, db, "openai_batch", openai_app, overrides=overrides, environ=ENVIRON
    )


def test_a_batch_walks_its_states_and_its_two_jsonl_files_make_completed_with_errors(
    tmp_path: Path, sqlite_db: str
) -> None:
    with stack(tmp_path, sqlite_db, FAST_POLLING) as s:
        s.replay.files["file-out01"] = jsonl([output_line(1), output_line(2)])
        s.replay.files["file-err01"] = jsonl([output_line(3, status=400)])
        s.replay.script = [
            {
                "status": "in_progress",
                "in_progress_at": now_unix(),
                "request_counts": {"total": 3, "completed": 0, "failed": 0},
            },
            {"request_counts": {"total": 3, "completed": 2, "failed": 0}},
            {
                "status": "finalizing",
                "finalizing_at": now_unix(),
                "request_counts": {"total": 3, "completed": 2, "failed": 1},
            },
            {
                "status": "completed",
                "completed_at": now_unix(),
                "output_file_id": "file-out01",
                "error_file_id": "file-err01",
            },
        ]
        op_id = s.start(REQUEST)
        op = s.finish(op_id)
        assert op["state"] == "completed_with_errors", op
        job = s.replay.only_job()
        # The agent's own metadata is kept and the service's key is added beside it.
        assert job.request["metadata"] == {
            "project": "nightly-eval",
            "reconciler_key": s.token(op_id),
        }
        created = s.replay.requests("POST", "/v1/batches")[0]
        assert created.headers["authorization"] == f"Bearer {API_TOKEN}"
        assert s.replay.requests("GET", "/v1/files/file-out01/content")
        assert s.replay.requests("GET", "/v1/files/file-err01/content")
        result = op["result"]
        assert result["summary"]["total"] == 3 and result["summary"]["failed"] == 1, result
        remote_states = observed_states(s.history(op_id))
        for word in ("in_progress", "finalizing", "completed"):
            assert word in remote_states, remote_states


def test_a_thin_webhook_brings_the_read_forward_and_other_types_change_nothing(
    tmp_path: Path, sqlite_db: str
) -> None:
    with stack(tmp_path, sqlite_db, SLOW_POLLING) as s:
        s.replay.files["file-out02"] = jsonl([output_line(1), output_line(2)])
        s.replay.script = [
            {"status": "in_progress", "request_counts": {"total": 2, "completed": 0, "failed": 0}}
        ]
        op_id = s.start(REQUEST)
        batch_id = s.remote_job(op_id)
        # The create answered `validating`; the first read is 120 s away.
        reads = len(s.replay.requests("GET", f"/v1/batches/{batch_id}"))

        body, headers = openai_event("batch.completed", batch_id, 1)
        forged = {**headers, "webhook-signature": "v1," + "A" * 43 + "="}
        assert post(s.webhook_url, body, forged).status_code == 401
        other, other_headers = openai_event("fine_tuning.job.succeeded", batch_id, 2)
        answer = post(s.webhook_url, other, other_headers)
        assert answer.status_code in (200, 202), answer.text
        assert not [e for e in s.history(op_id) if e["kind"] == "hint"]
        assert len(s.replay.requests("GET", f"/v1/batches/{batch_id}")) == reads

        s.replay.set(
            batch_id,
            {
                "status": "completed",
                "output_file_id": "file-out02",
                "request_counts": {"total": 2, "completed": 2, "failed": 0},
            },
        )
        answer = post(s.webhook_url, body, headers)
        assert answer.status_code in (200, 202), answer.text
        # Polling waits 120 s between reads: only the hint can finish it now.
        op = s.finish(op_id, timeout=15)
        assert op["state"] == "succeeded", op


def test_a_failed_batch_fails_with_the_providers_errors_kept(
    tmp_path: Path, sqlite_db: str
) -> None:
    with stack(tmp_path, sqlite_db, FAST_POLLING) as s:
        errors = {
            "object": "list",
            "data": [
                {
                    "code": "invalid_json_line",
                    "line": 1,
                    "message": "This line is not parseable as valid JSON.",
                    "param": None,
                }
            ],
        }
        s.replay.script = [{"status": "failed", "failed_at": now_unix(), "errors": errors}]
        op_id = s.start(REQUEST)
        op = s.finish(op_id)
        assert op["state"] == "failed", op
        assert "invalid_json_line" in json.dumps(op["error"]), op["error"]


def test_cancel_goes_through_cancelling_to_cancelled(tmp_path: Path, sqlite_db: str) -> None:
    with stack(tmp_path, sqlite_db, FAST_POLLING) as s:
        s.replay.script = [{"status": "in_progress"}]
        op_id = s.start(REQUEST)
        op = s.cancel_when(op_id, "in_progress", "in progress")
        assert op["state"] == "cancelled", op
        job = s.replay.only_job()
        assert s.replay.requests("POST", f"/v1/batches/{job.id}/cancel")


def test_a_lost_create_is_found_by_listing_batches_page_by_page(
    tmp_path: Path, sqlite_db: str
) -> None:
    with stack(tmp_path, sqlite_db, FAST_POLLING) as s:
        s.replay.files["file-out03"] = jsonl([output_line(1)])
        s.replay.script = [
            {
                "status": "completed",
                "output_file_id": "file-out03",
                "request_counts": {"total": 1, "completed": 1, "failed": 0},
            }
        ]
        s.replay.drop_next_create = True
        op_id = s.start(REQUEST)
        op = s.finish(op_id)
        assert op["state"] == "succeeded", op
        mine = s.jobs_with_key(op_id, "metadata")
        assert len(mine) == 1 and op["remote_job_id"] == mine[0].id
        assert len(s.replay.requests("POST", "/v1/batches")) == 1, "the create was resent"
        pages = s.replay.requests("GET", "/v1/batches")
        assert len(pages) >= 2 and "after" in pages[1].query, [p.query for p in pages]
        assert op["escalation"] is None


def test_a_lost_create_beyond_the_pages_read_escalates_and_is_never_resent(
    tmp_path: Path, sqlite_db: str
) -> None:
    # One page of 100 is read; ours is on the second, behind other clients' batches. The
    # lookups go on until the create window closes: a short one.
    window = {**FAST_CREATE, "create_deadline_seconds": 6}
    with stack(tmp_path, sqlite_db, FAST_POLLING, lookup={"pages": 1}, create=window) as s:
        s.replay.drop_next_create = True
        op_id = s.start(REQUEST)
        op = s.wait_for(
            op_id,
            lambda op: op["state"] == "escalated" or bool(op["remote_job_id"]),
            "an escalation, or a job id (from a resend)",
        )
        mine = s.jobs_with_key(op_id, "metadata")
        assert len(mine) == 1, "a second batch was made for one operation"
        assert op["state"] == "escalated" and op["escalation"]["reason"] == "create_unknown", op
        s.settled(op_id)
        assert len(s.replay.requests("POST", "/v1/batches")) == 1
