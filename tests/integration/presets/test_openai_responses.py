"""Contract test of the ``openai_responses`` preset against a replay of the Responses API.

Background mode as the Responses reference describes it: a response object with
``status`` queued / in_progress / completed / failed / cancelled / incomplete, an
``output`` array of message items, ``usage``, ``error`` ``{code, message}`` and
``incomplete_details`` ``{reason}``; cancel answers the response itself; errors are
``{"error": {"message", "type", "param", "code"}}``; webhooks are thin Standard
Webhooks events.
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
    assert_create_unknown,
    bearer_ok,
    now_unix,
    observed_states,
    openai_error,
    openai_event,
    post,
    preset_stack,
)

ENVIRON = {"OPENAI_API_KEY": API_TOKEN, "OPENAI_WEBHOOK_SECRET": WEBHOOK_SECRET}
REQUEST = {"model": "gpt-4.1", "input": "Write a haiku about queues."}
OUTPUT = [
    {
        "type": "message",
        "id": "msg_1",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "Jobs wait in a line", "annotations": []}],
    }
]
USAGE = {"input_tokens": 12, "output_tokens": 9, "total_tokens": 21}


class ResponsesAPI:
    def __init__(self, replay: Replay) -> None:
        self.replay = replay

    async def create(self, request: Request) -> Response:
        body = await self.replay.record(request)
        if not bearer_ok(request):
            return openai_error(401, "Incorrect API key provided.")
        if not isinstance(body, dict) or "model" not in body:
            return openai_error(400, "Missing required parameter: 'model'.", param="model")
        if body.get("background") and body.get("store") is False:
            return openai_error(400, "Background responses must be stored.", param="store")
        response = {
            "id": self.replay.new_id("resp_"),
            "object": "response",
            "created_at": now_unix(),
            "status": "queued" if body.get("background") else "completed",
            "background": bool(body.get("background")),
            "error": None,
            "incomplete_details": None,
            "model": body["model"],
            "output": [],
            "usage": None,
            "store": body.get("store", True),
            "metadata": body.get("metadata", {}),
        }
        self.replay.add(response["id"], response, body)
        return answer_created(self.replay, response)

    async def retrieve(self, request: Request) -> Response:
        await self.replay.record(request)
        response_id = request.path_params["response_id"]
        found = self.replay.read(response_id)
        if found is None:
            return openai_error(404, f"Response with id '{response_id}' not found.")
        return JSONResponse(found)

    async def cancel(self, request: Request) -> Response:
        await self.replay.record(request)
        response_id = request.path_params["response_id"]
        if response_id not in self.replay.jobs:
            return openai_error(404, f"Response with id '{response_id}' not found.")
        if not self.replay.peek(response_id)["background"]:
            return openai_error(400, "Only background responses can be cancelled.")
        self.replay.set(response_id, {"status": "cancelled"})
        return JSONResponse(self.replay.peek(response_id))


def responses_app(replay: Replay) -> Starlette:
    api = ResponsesAPI(replay)
    return Starlette(
        routes=[
            Route("/v1/responses", api.create, methods=["POST"]),
            Route("/v1/responses/{response_id}", api.retrieve, methods=["GET"]),
            Route("/v1/responses/{response_id}/cancel", api.cancel, methods=["POST"]),
        ]
    )


def stack(tmp_path: Path, db: str, polling: dict[str, Any]) -> Any:
    overrides = {"polling": polling, "create": FAST_CREATE}
    return preset_stack(
        tmp_path, db, "openai_responses", responses_app, overrides=overrides, environ=ENVIRON
    )


def test_a_background_response_finishes_on_its_webhook_with_the_output_as_result(
    tmp_path: Path, sqlite_db: str
) -> None:
    with stack(tmp_path, sqlite_db, SLOW_POLLING) as s:
        op_id = s.start(REQUEST)
        response_id = s.remote_job(op_id)
        sent = s.replay.only_job().request
        assert sent["background"] is True and sent["store"] is True
        assert sent["metadata"] == {"reconciler_key": s.token(op_id)}
        s.replay.set(response_id, {"status": "completed", "output": OUTPUT, "usage": USAGE})
        body, headers = openai_event("response.completed", response_id, 1)
        answer = post(s.webhook_url, body, headers)
        assert answer.status_code in (200, 202), answer.text
        # Reads are 120 s apart: only the hint can bring this one.
        op = s.finish(op_id, timeout=15)
        assert op["state"] == "succeeded", op
        assert "Jobs wait in a line" in json.dumps(op["result"]), op["result"]


def test_a_request_that_sets_background_itself_is_refused_naming_the_pointer(
    tmp_path: Path, sqlite_db: str
) -> None:
    with stack(tmp_path, sqlite_db, FAST_POLLING) as s:
        answer = s.submit({**REQUEST, "background": False})
        assert answer.status_code == 400, answer.text
        assert "/background" in answer.text
        assert s.replay.requests("POST", "/v1/responses") == []
        listed = s.client.get("/v1/operations", headers=s.headers(True)).json()
        assert listed["operations"] == [], listed


def test_incomplete_is_completed_with_errors_after_queued_and_in_progress(
    tmp_path: Path, sqlite_db: str
) -> None:
    with stack(tmp_path, sqlite_db, FAST_POLLING) as s:
        s.replay.script = [
            {"status": "in_progress"},
            {
                "status": "incomplete",
                "output": OUTPUT,
                "usage": USAGE,
                "incomplete_details": {"reason": "max_output_tokens"},
            },
        ]
        op_id = s.start(REQUEST)
        op = s.finish(op_id)
        assert op["state"] == "completed_with_errors", op
        assert "in_progress" in observed_states(s.history(op_id))


def test_a_failed_response_fails_with_its_error_kept(tmp_path: Path, sqlite_db: str) -> None:
    with stack(tmp_path, sqlite_db, FAST_POLLING) as s:
        failure = {"code": "server_error", "message": "The model failed to generate a response."}
        s.replay.script = [{"status": "in_progress"}, {"status": "failed", "error": failure}]
        op_id = s.start(REQUEST)
        op = s.finish(op_id)
        assert op["state"] == "failed", op
        assert "server_error" in json.dumps(op["error"])


def test_cancel_of_a_background_response(tmp_path: Path, sqlite_db: str) -> None:
    with stack(tmp_path, sqlite_db, FAST_POLLING) as s:
        op_id = s.start(REQUEST)
        op = s.cancel_when(op_id, "queued", "queued")
        assert op["state"] == "cancelled", op
        job = s.replay.only_job()
        assert s.replay.requests("POST", f"/v1/responses/{job.id}/cancel")


def test_a_lost_create_escalates_create_unknown_and_is_never_resent(
    tmp_path: Path, sqlite_db: str
) -> None:
    with stack(tmp_path, sqlite_db, FAST_POLLING) as s:
        s.replay.drop_next_create = True
        op_id = s.start(REQUEST)
        assert_create_unknown(s, op_id, "/v1/responses")
