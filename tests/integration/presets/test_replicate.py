"""Contract test of the ``replicate`` preset against a replay of Replicate predictions.

As the HTTP API reference describes it: a prediction with ``status`` starting /
processing / succeeded / failed / canceled, ``output``, ``error``, ``logs``,
``metrics`` and ``urls``; the webhook URL and ``webhook_events_filter`` are given per
prediction in the create body; the webhook body is the prediction itself, signed with
Standard Webhooks; errors are ``{"title", "detail", "status"}``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
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
    assert_create_unknown,
    bearer_ok,
    observed_states,
    post,
    preset_stack,
    rfc3339_now,
    standard_webhook,
)

ENVIRON = {"REPLICATE_API_TOKEN": API_TOKEN, "REPLICATE_WEBHOOK_SECRET": WEBHOOK_SECRET}
VERSION = "5c7d5dc6dd8bf75c1acaa8565735e7986bc5b66206b55cca93cb72c9bf15ccaa"
REQUEST = {"version": VERSION, "input": {"text": "Alice"}}


def problem(status: int, title: str, detail: str) -> JSONResponse:
    return JSONResponse({"title": title, "detail": detail, "status": status}, status_code=status)


class PredictionsAPI:
    def __init__(self, replay: Replay) -> None:
        self.replay = replay

    async def create(self, request: Request) -> Response:
        body = await self.replay.record(request)
        if not bearer_ok(request):
            return problem(401, "Unauthenticated", "You did not pass a valid authentication token")
        if not isinstance(body, dict) or "input" not in body:
            return problem(422, "Input validation failed", "input is required")
        prediction_id = self.replay.new_id("ufawqhfynnddngldkgtslldrk")
        base = f"{request.base_url}v1/predictions/{prediction_id}"
        prediction = {
            "id": prediction_id,
            "model": "replicate/hello-world",
            "version": body.get("version"),
            "input": body["input"],
            "logs": "",
            "output": None,
            "data_removed": False,
            "error": None,
            "status": "starting",
            "created_at": rfc3339_now(),
            "started_at": None,
            "completed_at": None,
            "metrics": {},
            "urls": {"get": base, "cancel": f"{base}/cancel"},
        }
        self.replay.add(prediction_id, prediction, body)
        return answer_created(self.replay, prediction, status=201)

    async def retrieve(self, request: Request) -> Response:
        await self.replay.record(request)
        found = self.replay.read(request.path_params["prediction_id"])
        if found is None:
            return problem(404, "Not found", "Not found.")
        return JSONResponse(found)

    async def cancel(self, request: Request) -> Response:
        await self.replay.record(request)
        prediction_id = request.path_params["prediction_id"]
        if prediction_id not in self.replay.jobs:
            return problem(404, "Not found", "Not found.")
        self.replay.set(prediction_id, {"status": "canceled", "completed_at": rfc3339_now()})
        return JSONResponse(self.replay.peek(prediction_id))


def replicate_app(replay: Replay) -> Starlette:
    api = PredictionsAPI(replay)
    return Starlette(
        routes=[
            Route("/v1/predictions", api.create, methods=["POST"]),
            Route("/v1/predictions/{prediction_id}", api.retrieve, methods=["GET"]),
            Route("/v1/predictions/{prediction_id}/cancel", api.cancel, methods=["POST"]),
        ]
    )


def stack(tmp_path: Path, db: str, polling: dict[str, Any]) -> Any:
    overrides = {"polling": polling, "create": FAST_CREATE}
    return preset_stack(
        tmp_path, db, "replicate", replicate_app, overrides=overrides, environ=ENVIRON
    )


def deliver(url: str, prediction: dict[str, Any], msg_id: str) -> httpx.Response:
    """What Replicate sends to a prediction's webhook: the prediction, signed."""
    body = json.dumps(prediction).encode()
    return post(url, body, standard_webhook(WEBHOOK_SECRET, body, msg_id))


def test_the_completed_webhook_goes_to_the_url_given_with_the_prediction(
    tmp_path: Path, sqlite_db: str
) -> None:
    with stack(tmp_path, sqlite_db, SLOW_POLLING) as s:
        op_id = s.start(REQUEST)
        prediction_id = s.remote_job(op_id)
        sent = s.replay.only_job().request
        assert sent["webhook"] == s.webhook_url, sent
        assert sent["webhook_events_filter"] == ["completed"]
        s.replay.set(
            prediction_id,
            {
                "status": "succeeded",
                "output": "hello Alice",
                "completed_at": rfc3339_now(),
                "metrics": {"predict_time": 0.2},
            },
        )
        assert deliver(sent["webhook"], {**s.replay.peek(prediction_id)}, "msg_1").is_success
        # A retry of the same delivery (Replicate retries the terminal one) changes nothing.
        assert deliver(sent["webhook"], {**s.replay.peek(prediction_id)}, "msg_1").is_success
        # Reads are 120 s apart: only the hint can finish it within the test.
        op = s.finish(op_id, timeout=15)
        assert op["state"] == "succeeded", op
        assert op["result"] is not None and "hello Alice" in json.dumps(op["result"])
        hints = [e for e in s.history(op_id) if e["kind"] == "hint"]
        assert len(hints) == 1, hints


def test_a_failed_prediction_fails_with_its_error(tmp_path: Path, sqlite_db: str) -> None:
    with stack(tmp_path, sqlite_db, FAST_POLLING) as s:
        s.replay.script = [
            {"status": "processing", "started_at": rfc3339_now()},
            {"status": "failed", "error": "CUDA out of memory", "completed_at": rfc3339_now()},
        ]
        op_id = s.start(REQUEST)
        op = s.finish(op_id)
        assert op["state"] == "failed", op
        assert "CUDA out of memory" in json.dumps(op["error"])
        assert observed_states(s.history(op_id))[:2] == ["processing", "failed"]


def test_cancel_ends_canceled(tmp_path: Path, sqlite_db: str) -> None:
    with stack(tmp_path, sqlite_db, FAST_POLLING) as s:
        s.replay.script = [{"status": "processing"}]
        op_id = s.start(REQUEST)
        op = s.cancel_when(op_id, "processing", "processing")
        assert op["state"] == "cancelled", op
        job = s.replay.only_job()
        assert s.replay.requests("POST", f"/v1/predictions/{job.id}/cancel")


def test_a_lost_create_escalates_create_unknown_and_is_never_resent(
    tmp_path: Path, sqlite_db: str
) -> None:
    with stack(tmp_path, sqlite_db, FAST_POLLING) as s:
        s.replay.drop_next_create = True
        assert_create_unknown(s, s.start(REQUEST), "/v1/predictions")


def test_an_operators_resend_makes_exactly_one_more_prediction_and_is_followed(
    tmp_path: Path, sqlite_db: str
) -> None:
    with stack(tmp_path, sqlite_db, FAST_POLLING) as s:
        s.replay.drop_next_create = True
        op_id = s.start(REQUEST)
        assert_create_unknown(s, op_id, "/v1/predictions")
        s.replay.script = [{"status": "succeeded", "output": "hello again"}]
        decided = s.client.post(
            f"/v1/operations/{op_id}/decisions",
            json={"action": "resend"},
            headers=s.headers(operator=True),
        )
        assert decided.status_code in (200, 202), decided.text
        op = s.finish(op_id)
        assert op["state"] == "succeeded", op
        s.settled(op_id)
        # The one resend the operator chose, and nothing more.
        assert len(s.replay.requests("POST", "/v1/predictions")) == 2
        assert op["remote_job_id"] == s.replay.all_jobs()[1].id
        assert [e for e in s.history(op_id) if e["kind"] == "decision"]
