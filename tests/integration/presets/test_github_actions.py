"""Contract test of the ``github_actions`` preset against a replay of the GitHub REST API.

As the Actions reference describes it: a workflow dispatch answered ``200`` with
``workflow_run_id``, ``run_url`` and ``html_url`` when ``return_run_details`` is true
(``204`` without); a workflow run with ``status`` and, once completed, ``conclusion``;
cancel answered ``202``; the run's artifacts list; errors ``{"message",
"documentation_url"}``; rate limits as ``403`` with ``x-ratelimit-remaining: 0`` and
``x-ratelimit-reset`` (epoch seconds). Webhooks are ``workflow_run`` events signed with
``X-Hub-Signature-256``, made here by hand with ``hmac`` (the unit test in
tests/unit/test_signatures.py checks the service against GitHub's documented vector,
and ``test_the_hand_signer_matches_githubs_documented_vector`` checks this signer).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
import uuid
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
    HMAC_SECRET,
    SLOW_POLLING,
    Replay,
    answer_created,
    assert_create_unknown,
    bearer_ok,
    observed_states,
    post,
    preset_stack,
    rfc3339_now,
)

ENVIRON = {"GITHUB_TOKEN": API_TOKEN, "GITHUB_WEBHOOK_SECRET": HMAC_SECRET}
REPO = "/repos/octo-org/hello-world"
DISPATCH = f"{REPO}/actions/workflows/build.yml/dispatches"
REQUEST = {"ref": "main", "inputs": {"target": "docs"}}
DOCS = "https://docs.github.com/rest"


def github_signature(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def message(status: int, text: str, **headers: str) -> JSONResponse:
    return JSONResponse(
        {"message": text, "documentation_url": DOCS}, status_code=status, headers=headers
    )


class ActionsAPI:
    def __init__(self, replay: Replay) -> None:
        self.replay = replay
        self.rate_limited_reads = 0  # status reads to answer with a rate-limit 403
        self.reset_at = 0

    async def dispatch(self, request: Request) -> Response:
        body = await self.replay.record(request)
        if not bearer_ok(request):
            return message(401, "Bad credentials")
        if not isinstance(body, dict) or "ref" not in body:
            return message(422, 'Invalid request. "ref" wasn\'t supplied.')
        run_id = 30433642 + len(self.replay.all_jobs())
        base = str(request.base_url).rstrip("/")
        run = {
            "id": run_id,
            "name": "build",
            "display_title": "build",
            "run_number": 562,
            "event": "workflow_dispatch",
            "status": "queued",
            "conclusion": None,
            "workflow_id": 159038,
            "url": f"{base}{REPO}/actions/runs/{run_id}",
            "html_url": f"https://github.com/octo-org/hello-world/actions/runs/{run_id}",
            "created_at": rfc3339_now(),
            "updated_at": rfc3339_now(),
            "run_attempt": 1,
        }
        self.replay.add(str(run_id), run, body)
        if not body.get("return_run_details"):
            return Response(status_code=204)
        details = {"workflow_run_id": run_id, "run_url": run["url"], "html_url": run["html_url"]}
        return answer_created(self.replay, details)

    async def run(self, request: Request) -> Response:
        await self.replay.record(request)
        if self.rate_limited_reads > 0:
            self.rate_limited_reads -= 1
            return message(
                403,
                "API rate limit exceeded for installation ID 1.",
                **{
                    "x-ratelimit-limit": "5000",
                    "x-ratelimit-remaining": "0",
                    "x-ratelimit-used": "5000",
                    "x-ratelimit-reset": str(self.reset_at),
                },
            )
        found = self.replay.read(request.path_params["run_id"])
        if found is None:
            return message(404, "Not Found")
        return JSONResponse(found)

    async def cancel(self, request: Request) -> Response:
        await self.replay.record(request)
        run_id = request.path_params["run_id"]
        if run_id not in self.replay.jobs:
            return message(404, "Not Found")
        if self.replay.peek(run_id)["status"] == "completed":
            return message(409, "Cannot cancel a workflow run that is completed.")
        self.replay.set(run_id, {}, [{"status": "completed", "conclusion": "cancelled"}])
        return JSONResponse({}, status_code=202)

    async def artifacts(self, request: Request) -> Response:
        await self.replay.record(request)
        run_id = request.path_params["run_id"]
        if run_id not in self.replay.jobs:
            return message(404, "Not Found")
        artifact = {
            "id": 11,
            "name": "site",
            "size_in_bytes": 556,
            "expired": False,
            "archive_download_url": f"{REPO}/actions/artifacts/11/zip",
        }
        return JSONResponse({"total_count": 1, "artifacts": [artifact]})


def actions_app(replay: Replay, api: ActionsAPI | None = None) -> Starlette:
    api = api or ActionsAPI(replay)
    runs = f"{REPO}/actions/runs/{{run_id}}"
    return Starlette(
        routes=[
            Route(DISPATCH, api.dispatch, methods=["POST"]),
            Route(runs, api.run, methods=["GET"]),
            Route(f"{runs}/cancel", api.cancel, methods=["POST"]),
            Route(f"{runs}/artifacts", api.artifacts, methods=["GET"]),
        ]
    )


def stack(
    tmp_path: Path, db: str, polling: dict[str, Any], api: list[ActionsAPI] | None = None
) -> Any:
    def app(replay: Replay) -> Starlette:
        made = ActionsAPI(replay)
        if api is not None:
            api.append(made)
        return actions_app(replay, made)

    overrides = {
        "polling": polling,
        "create": {**FAST_CREATE, "path": "/actions/workflows/build.yml/dispatches"},
    }
    return preset_stack(
        tmp_path, db, "github_actions", app, overrides=overrides, environ=ENVIRON, base_path=REPO
    )


def deliver(url: str, event: str, payload: dict[str, Any]) -> httpx.Response:
    body = json.dumps(payload).encode()
    headers = {
        "content-type": "application/json",
        "x-github-event": event,
        "x-github-delivery": str(uuid.uuid4()),
        "x-hub-signature-256": github_signature(HMAC_SECRET, body),
        "user-agent": "GitHub-Hookshot/044aadd",
    }
    return post(url, body, headers)


def test_the_hand_signer_matches_githubs_documented_vector() -> None:
    expected = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
    assert github_signature("It's a Secret to Everybody", b"Hello, World!") == expected


def test_a_dispatched_run_finishes_on_its_workflow_run_webhook_with_artifacts_as_result(
    tmp_path: Path, sqlite_db: str
) -> None:
    with stack(tmp_path, sqlite_db, SLOW_POLLING) as s:
        op_id = s.start(REQUEST)
        run_id = s.remote_job(op_id)
        sent = s.replay.requests("POST", DISPATCH)[0]
        assert sent.body == {**REQUEST, "return_run_details": True}
        assert sent.headers["x-github-api-version"] == "2022-11-28"
        # A verified event of another type is acknowledged and changes nothing.
        ping = deliver(s.webhook_url, "ping", {"zen": "Keep it logically awesome.", "hook_id": 1})
        assert ping.is_success, ping.text
        assert not [e for e in s.history(op_id) if e["kind"] == "hint"]
        s.replay.set(run_id, {"status": "completed", "conclusion": "success"})
        event = {
            "action": "completed",
            "workflow_run": s.replay.peek(run_id),
            "repository": {"full_name": "octo-org/hello-world"},
        }
        delivered = deliver(s.webhook_url, "workflow_run", event)
        assert delivered.is_success, delivered.text
        # Reads are 120 s apart: only the hint can finish it within the test.
        op = s.finish(op_id, timeout=15)
        assert op["state"] == "succeeded", op
        assert op["result"]["summary"]["artifacts"] == 1, op["result"]


def test_a_wrong_signature_is_refused(tmp_path: Path, sqlite_db: str) -> None:
    with stack(tmp_path, sqlite_db, SLOW_POLLING) as s:
        body = b'{"action":"completed","workflow_run":{"id":1}}'
        headers = {
            "x-github-event": "workflow_run",
            "x-github-delivery": str(uuid.uuid4()),
            "x-hub-signature-256": github_signature("not-the-secret", body),
        }
        assert post(s.webhook_url, body, headers).status_code == 401


def test_status_then_conclusion_decide_failure(tmp_path: Path, sqlite_db: str) -> None:
    with stack(tmp_path, sqlite_db, FAST_POLLING) as s:
        s.replay.script = [
            {"status": "in_progress"},
            {"status": "completed", "conclusion": "failure"},
        ]
        op_id = s.start(REQUEST)
        op = s.finish(op_id)
        assert op["state"] == "failed", op
        assert observed_states(s.history(op_id))[:2] == ["in_progress", "completed"]


def test_a_completed_run_with_an_undocumented_conclusion_is_unknown(
    tmp_path: Path, sqlite_db: str
) -> None:
    with stack(tmp_path, sqlite_db, FAST_POLLING) as s:
        s.replay.script = [{"status": "completed", "conclusion": "exploded"}]
        op = s.finish(s.start(REQUEST))
        assert op["state"] == "escalated" and op["escalation"]["reason"] == "unknown_state", op


def test_cancel_ends_with_conclusion_cancelled(tmp_path: Path, sqlite_db: str) -> None:
    with stack(tmp_path, sqlite_db, FAST_POLLING) as s:
        s.replay.script = [{"status": "in_progress"}]
        op_id = s.start(REQUEST)
        op = s.cancel_when(op_id, "in_progress", "in progress")
        assert op["state"] == "cancelled", op


def test_a_rate_limited_read_waits_for_x_ratelimit_reset(tmp_path: Path, sqlite_db: str) -> None:
    apis: list[ActionsAPI] = []
    with stack(tmp_path, sqlite_db, FAST_POLLING, apis) as s:
        api = apis[0]
        api.reset_at = int(time.time()) + 2
        api.rate_limited_reads = 1
        s.replay.script = [{"status": "completed", "conclusion": "success"}]
        op_id = s.start(REQUEST)
        op = s.finish(op_id)
        assert op["state"] == "succeeded", op
        reads = s.replay.requests("GET", f"{REPO}/actions/runs/{op['remote_job_id']}")
        assert len(reads) == 2, reads
        # Polling alone would read again within 0.2 s; the reset time said otherwise.
        assert reads[1].at >= api.reset_at - 0.05, (reads[1].at, api.reset_at)


def test_a_lost_create_escalates_create_unknown_and_is_never_resent(
    tmp_path: Path, sqlite_db: str
) -> None:
    with stack(tmp_path, sqlite_db, FAST_POLLING) as s:
        s.replay.drop_next_create = True
        assert_create_unknown(s, s.start(REQUEST), DISPATCH)
