"""Contract test of the ``anthropic_batches`` preset against a replay of Message Batches.

As the Message Batches reference describes it: a ``message_batch`` with
``processing_status`` in_progress / canceling / ended, ``request_counts`` (processing,
succeeded, errored, canceled, expired), RFC 3339 times, and, once ended, a
``results_url`` serving JSON Lines ``{custom_id, result: {type, ...}}``. Every call
needs ``x-api-key`` and ``anthropic-version``; errors are
``{"type": "error", "error": {"type", "message"}}``. No webhooks.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
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
    Replay,
    answer_created,
    assert_create_unknown,
    jsonl,
    observed_states,
    preset_stack,
    rfc3339_now,
)

ENVIRON = {"ANTHROPIC_API_KEY": API_TOKEN}
PARAMS = {"model": "claude-sonnet-4-5", "max_tokens": 64}
REQUEST = {
    "requests": [
        {
            "custom_id": f"q{n}",
            "params": {**PARAMS, "messages": [{"role": "user", "content": f"Q{n}"}]},
        }
        for n in (1, 2, 3)
    ]
}
ZERO = {"processing": 0, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}


def error(status: int, kind: str, message: str) -> JSONResponse:
    return JSONResponse(
        {"type": "error", "error": {"type": kind, "message": message}}, status_code=status
    )


def succeeded(custom_id: str) -> dict[str, Any]:
    message = {
        "id": f"msg_{custom_id}",
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": "ok"}],
        "stop_reason": "end_turn",
    }
    return {"custom_id": custom_id, "result": {"type": "succeeded", "message": message}}


def errored(custom_id: str) -> dict[str, Any]:
    inner = {"type": "invalid_request_error", "message": "max_tokens: field required"}
    return {
        "custom_id": custom_id,
        "result": {"type": "errored", "error": {"type": "error", "error": inner}},
    }


class BatchesAPI:
    def __init__(self, replay: Replay) -> None:
        self.replay = replay

    def refused(self, request: Request) -> Response | None:
        if request.headers.get("x-api-key") != API_TOKEN:
            return error(401, "authentication_error", "invalid x-api-key")
        if request.headers.get("anthropic-version") != "2023-06-01":
            return error(400, "invalid_request_error", "anthropic-version: header is required")
        return None

    async def create(self, request: Request) -> Response:
        body = await self.replay.record(request)
        refused = self.refused(request)
        if refused is not None:
            return refused
        if not isinstance(body, dict) or not body.get("requests"):
            return error(400, "invalid_request_error", "requests: Field required")
        now = datetime.now(UTC)
        batch_id = self.replay.new_id("msgbatch_")
        batch: dict[str, Any] = {
            "id": batch_id,
            "type": "message_batch",
            "processing_status": "in_progress",
            "request_counts": {**ZERO, "processing": len(body["requests"])},
            "ended_at": None,
            "created_at": now.isoformat().replace("+00:00", "Z"),
            "expires_at": (now + timedelta(hours=24)).isoformat().replace("+00:00", "Z"),
            "cancel_initiated_at": None,
            "archived_at": None,
            "results_url": None,
        }
        self.replay.add(batch_id, batch, body)
        return answer_created(self.replay, batch)

    async def retrieve(self, request: Request) -> Response:
        await self.replay.record(request)
        refused = self.refused(request)
        if refused is not None:
            return refused
        batch_id = request.path_params["batch_id"]
        found = self.replay.read(batch_id)
        if found is None:
            return error(404, "not_found_error", f"batch {batch_id} not found")
        if found["processing_status"] == "ended" and found["results_url"] is None:
            found["results_url"] = f"{request.base_url}v1/messages/batches/{batch_id}/results"
            self.replay.set(batch_id, {"results_url": found["results_url"]})
        return JSONResponse(found)

    async def cancel(self, request: Request) -> Response:
        await self.replay.record(request)
        refused = self.refused(request)
        if refused is not None:
            return refused
        batch_id = request.path_params["batch_id"]
        if batch_id not in self.replay.jobs:
            return error(404, "not_found_error", f"batch {batch_id} not found")
        self.replay.set(
            batch_id,
            {"processing_status": "canceling", "cancel_initiated_at": rfc3339_now()},
            [
                {},
                {
                    "processing_status": "ended",
                    "ended_at": rfc3339_now(),
                    "request_counts": {**ZERO, "canceled": 3},
                },
            ],
        )
        return JSONResponse(self.replay.peek(batch_id))

    async def results(self, request: Request) -> Response:
        await self.replay.record(request)
        refused = self.refused(request)
        if refused is not None:
            return refused
        data = self.replay.files.get(request.path_params["batch_id"])
        if data is None:
            return error(404, "not_found_error", "results are not available yet")
        return Response(data, media_type="application/octet-stream")


def batches_app(replay: Replay) -> Starlette:
    api = BatchesAPI(replay)
    return Starlette(
        routes=[
            Route("/v1/messages/batches", api.create, methods=["POST"]),
            Route("/v1/messages/batches/{batch_id}", api.retrieve, methods=["GET"]),
            Route("/v1/messages/batches/{batch_id}/cancel", api.cancel, methods=["POST"]),
            Route("/v1/messages/batches/{batch_id}/results", api.results, methods=["GET"]),
        ]
    )


def stack(tmp_path: Path, db: str) -> Any:
    overrides = {"polling": FAST_POLLING, "create": FAST_CREATE}
    return preset_stack(
        tmp_path, db, "anthropic_batches", batches_app, overrides=overrides, environ=ENVIRON
    )


def ended(counts: dict[str, int]) -> dict[str, Any]:
    return {
        "processing_status": "ended",
        "ended_at": rfc3339_now(),
        "request_counts": {**ZERO, **counts},
    }


def test_an_ended_batch_with_an_errored_line_is_completed_with_errors_from_its_jsonl(
    tmp_path: Path, sqlite_db: str
) -> None:
    with stack(tmp_path, sqlite_db) as s:
        s.replay.files["msgbatch_000001"] = jsonl([succeeded("q1"), errored("q2"), succeeded("q3")])
        s.replay.script = [
            {"request_counts": {**ZERO, "processing": 1, "succeeded": 2}},
            ended({"succeeded": 2, "errored": 1}),
        ]
        op_id = s.start(REQUEST)
        op = s.finish(op_id)
        assert op["state"] == "completed_with_errors", op
        results = s.replay.requests("GET", "/v1/messages/batches/msgbatch_000001/results")
        assert results and results[0].headers["x-api-key"] == API_TOKEN
        # The version header went with every call, the create included.
        assert {r.headers.get("anthropic-version") for r in s.replay.seen} == {"2023-06-01"}
        assert observed_states(s.history(op_id))[:2] == ["in_progress", "ended"]


def test_an_ended_batch_where_nothing_succeeded_is_a_failure(
    tmp_path: Path, sqlite_db: str
) -> None:
    with stack(tmp_path, sqlite_db) as s:
        s.replay.files["msgbatch_000001"] = jsonl([errored("q1"), errored("q2"), errored("q3")])
        s.replay.script = [ended({"errored": 3})]
        op = s.finish(s.start(REQUEST))
        assert op["state"] == "failed", op


def test_cancel_goes_through_canceling_and_ends_cancelled(tmp_path: Path, sqlite_db: str) -> None:
    with stack(tmp_path, sqlite_db) as s:
        op_id = s.start(REQUEST)
        op = s.cancel_when(op_id, "in_progress", "in progress")
        assert op["state"] == "cancelled", op
        assert "canceling" in observed_states(s.history(op_id))


def test_a_lost_create_escalates_create_unknown_and_is_never_resent(
    tmp_path: Path, sqlite_db: str
) -> None:
    with stack(tmp_path, sqlite_db) as s:
        s.replay.drop_next_create = True
        assert_create_unknown(s, s.start(REQUEST), "/v1/messages/batches")
