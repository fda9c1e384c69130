"""Contract test of the ``google_lro`` preset against a replay of a Google long-running operation.

As google.longrunning.Operation and AIP-151 describe it: ``{name, metadata, done,
error | response}``, ``done`` left out while false (proto3 JSON), ``error`` a
google.rpc.Status ``{code, message, details}`` with code 1 (CANCELLED) after
``:cancel``; the create is Cloud Translation's batchTranslateText; errors are
``{"error": {"code", "message", "status"}}``. No webhooks.
"""

from __future__ import annotations

import json
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
    assert_create_unknown,
    bearer_ok,
    google_credentials,
    google_error,
    observed_states,
    preset_stack,
    rfc3339_now,
)

CREATE = "/v3/projects/PROJECT/locations/us-central1:batchTranslateText"
REQUEST = {
    "sourceLanguageCode": "en",
    "targetLanguageCodes": ["de"],
    "inputConfigs": [{"gcsSource": {"inputUri": "gs://in/docs/*"}}],
    "outputConfig": {"gcsDestination": {"outputUriPrefix": "gs://out/"}},
}
METADATA_TYPE = "type.googleapis.com/google.cloud.translation.v3.BatchTranslateMetadata"
RESPONSE_TYPE = "type.googleapis.com/google.cloud.translation.v3.BatchTranslateResponse"


def finished(**counts: str) -> dict[str, Any]:
    response = {
        "@type": RESPONSE_TYPE,
        "totalCharacters": "1200",
        "translatedCharacters": "1200",
        "failedCharacters": "0",
        "submitTime": rfc3339_now(),
        "endTime": rfc3339_now(),
        **counts,
    }
    return {"done": True, "response": response}


class OperationsAPI:
    def __init__(self, replay: Replay) -> None:
        self.replay = replay

    async def create(self, request: Request) -> Response:
        body = await self.replay.record(request)
        if not bearer_ok(request):
            return google_error(401, "UNAUTHENTICATED", "Request had invalid credentials.")
        if not isinstance(body, dict) or "targetLanguageCodes" not in body:
            return google_error(400, "INVALID_ARGUMENT", "target_language_codes is required")
        name = self.replay.new_id("projects/4242/locations/us-central1/operations/2024")
        operation = {
            "name": name,
            "metadata": {
                "@type": METADATA_TYPE,
                "state": "RUNNING",
                "totalCharacters": "1200",
                "translatedCharacters": "0",
                "submitTime": rfc3339_now(),
            },
        }
        self.replay.add(name, operation, body)
        return answer_created(self.replay, operation)

    async def operation(self, request: Request) -> Response:
        await self.replay.record(request)
        path: str = request.path_params["name"]
        if request.method == "POST" and path.endswith(":cancel"):
            name = path.removesuffix(":cancel")
            if name not in self.replay.jobs:
                return google_error(404, "NOT_FOUND", f"Operation {name} not found.")
            cancelled = {"code": 1, "message": "Operation was cancelled.", "details": []}
            self.replay.set(name, {}, [{"done": True, "error": cancelled}])
            return JSONResponse({})
        found = self.replay.read(path) if request.method == "GET" else None
        if found is None:
            return google_error(404, "NOT_FOUND", f"Operation {path} not found.")
        return JSONResponse(found)


def operations_app(replay: Replay) -> Starlette:
    api = OperationsAPI(replay)
    return Starlette(
        routes=[
            Route(CREATE, api.create, methods=["POST"]),
            Route("/v3/{name:path}", api.operation, methods=["GET", "POST"]),
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
            "google_lro",
            operations_app,
            overrides=overrides,
            base_path="/v3",
        ) as s,
    ):
        yield s


def test_an_operation_runs_until_done_and_its_response_is_the_result(
    tmp_path: Path, sqlite_db: str
) -> None:
    with stack(tmp_path, sqlite_db) as s:
        s.replay.script = [
            {"metadata": {"translatedCharacters": "600"}},
            {"done": False, "metadata": {"translatedCharacters": "1100"}},
            finished(),
        ]
        op_id = s.start(REQUEST)
        op = s.finish(op_id)
        assert op["state"] == "succeeded", op
        assert "1200" in json.dumps(op["result"]), op["result"]
        assert "false" in observed_states(s.history(op_id))
        # The operation's name keeps its slashes in the path it is read at.
        name = op["remote_job_id"]
        assert name.startswith("projects/4242/") and s.replay.requests("GET", f"/v3/{name}")


def test_done_with_an_error_is_a_failure_and_code_1_is_cancelled(
    tmp_path: Path, sqlite_db: str
) -> None:
    with stack(tmp_path, sqlite_db) as s:
        denied = {"code": 7, "message": "The caller does not have permission", "details": []}
        s.replay.script = [{"done": True, "error": denied}]
        op = s.finish(s.start(REQUEST))
        assert op["state"] == "failed" and "permission" in json.dumps(op["error"]), op

        s.replay.script = []
        op_id = s.start({**REQUEST, "targetLanguageCodes": ["fr"]})
        s.wait_for(op_id, lambda op: op["budget"]["status_requests_used"] >= 1, "a first read")
        s.cancel(op_id)
        op = s.finish(op_id)
        assert op["state"] == "cancelled", op
        assert s.replay.requests("POST", f"/v3/{op['remote_job_id']}:cancel")


def test_done_with_neither_error_nor_response_is_not_a_success(
    tmp_path: Path, sqlite_db: str
) -> None:
    with stack(tmp_path, sqlite_db) as s:
        s.replay.script = [{"done": True}]
        op = s.finish(s.start(REQUEST))
        assert op["state"] == "escalated", op
        assert op["escalation"]["reason"] in ("contract_violation", "contradictory_status"), op


def test_a_lost_create_escalates_create_unknown_and_is_never_resent(
    tmp_path: Path, sqlite_db: str
) -> None:
    with stack(tmp_path, sqlite_db) as s:
        s.replay.drop_next_create = True
        assert_create_unknown(s, s.start(REQUEST), CREATE)
