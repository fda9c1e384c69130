"""Real provider shapes: the example provider files classify recorded payloads as documented."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from reconciler.core.provider_calls import CallResult
from reconciler.core.vocabulary import RemoteCategory as C
from reconciler.providers.adapter import (
    LookupVerdict,
    create_outcome,
    lookup_outcome,
    status_view,
)
from reconciler.providers.loader import load_providers, parse_provider
from reconciler.providers.result_check import check_result
from reconciler.providers.spec import ProviderSpec

ROOT = Path(__file__).resolve().parents[2] / "fixtures"
ENV = {
    "GOOGLE_ACCESS_TOKEN": "ya29.test",
    "BATCH_API_KEY": "sk-test",
    "BATCH_WEBHOOK_SECRETS": "whsec_dGVzdA==",
}
OPERATION = (
    "projects/845613297410/locations/us-central1/operations/"
    "20250418-10200011-0000-2b3c-9f1a-089e0829f1d4"
)
BATCH = "batch_67f2a81c3d8c8190a5be5c44c1c4d2f0"
SENT_AT = datetime(2025, 4, 18, 10, 20, tzinfo=UTC)


@pytest.fixture(scope="module")
def specs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ProviderSpec]:
    # Copied alone so that other example files (and their variables) stay out of this test.
    directory = tmp_path_factory.mktemp("providers")
    for name in ("google_lro.toml", "batch.toml"):
        shutil.copy(ROOT / "providers" / name, directory / name)
    return load_providers(directory, {}, ENV)


def _payload(provider: str, name: str) -> Any:
    return json.loads((ROOT / "payloads" / provider / f"{name}.json").read_text())


def _call(body: Any, status: int = 200) -> CallResult:
    raw = json.dumps(body).encode()
    return CallResult("GET", "/", SENT_AT, 1.0, http_status=status, body=body, body_bytes=raw)


def test_every_recorded_payload_is_covered() -> None:
    for provider, table in (("google_lro", GOOGLE), ("batch", BATCH_CASES)):
        recorded = {p.stem for p in (ROOT / "payloads" / provider).glob("*.json")}
        assert recorded == {case[0] for case in table} | {"create_response"}


# name, category, remote state word, error code (or None), result_ref, required ok
GOOGLE = [
    ("running_done_omitted", C.PENDING, None, None, True),
    ("running_done_false", C.PENDING, "false", None, True),
    ("succeeded", C.SUCCESS, "true", None, True),
    ("failed", C.FAILURE, "true", 3, True),
    ("cancelled", C.CANCELLED, "true", 1, True),
    ("done_without_response", C.SUCCESS, "true", None, False),
]


@pytest.mark.parametrize(("name", "category", "word", "code", "required_ok"), GOOGLE)
def test_google_lro_status(
    specs: dict[str, ProviderSpec],
    name: str,
    category: C,
    word: str | None,
    code: int | None,
    required_ok: bool,
) -> None:
    spec = specs["google_lro"]
    view = status_view(spec, _payload("google_lro", name), OPERATION)
    assert (view.category, view.remote_state) == (category, word)
    assert view.job_id == OPERATION and view.job_id_matches is True
    assert (view.error or {}).get("code") == code
    assert view.required_fields_ok is required_ok
    if not required_ok:
        assert view.missing_required == ("/response",)
    assert view.result_ref is None
    assert isinstance(view.progress, dict) and "@type" in view.progress


def test_google_lro_create_and_result(specs: dict[str, ProviderSpec]) -> None:
    spec = specs["google_lro"]
    created = create_outcome(spec, _call(_payload("google_lro", "create_response")))
    assert created.job_id == OPERATION and created.job_id_problem is None
    assert created.category is None  # no state word in the create answer
    final = _payload("google_lro", "succeeded")
    check = check_result(spec, _call(final), final)
    assert check.ok, check.problems
    assert check.summary == {"total": "1204877", "translated": "1204877", "failed": "0"}
    assert check.document["endTime"] == "2025-04-18T10:41:37.905Z"
    incomplete = _payload("google_lro", "done_without_response")
    refused = check_result(spec, _call(incomplete), incomplete)
    assert not refused.ok
    assert refused.problems[0] == "the status has no result at /response"


# name, category, state word, result_ref, error present
BATCH_CASES = [
    ("validating", C.PENDING, "validating", None, False),
    ("in_progress", C.PENDING, "in_progress", None, False),
    ("finalizing", C.PENDING, "finalizing", None, False),
    ("cancelling", C.PENDING, "cancelling", None, False),
    ("completed", C.SUCCESS, "completed", "file-cvaTdGR8r2VxYy4mQkN1aE", False),
    ("completed_with_failures", C.PARTIAL, "completed", "file-cvaTdGR8r2VxYy4mQkN1aE", False),
    ("completed_none_succeeded", C.FAILURE, "completed", None, False),
    ("failed", C.FAILURE, "failed", None, True),
    ("expired", C.EXPIRED, "expired", "file-Rk2vP0sZ3yQm8bWcXa1TfE", False),
    ("cancelled", C.CANCELLED, "cancelled", "file-8sWq1fTz6mHc4RkLp2YbVn", False),
]


@pytest.mark.parametrize(("name", "category", "word", "result_ref", "has_error"), BATCH_CASES)
def test_batch_status(
    specs: dict[str, ProviderSpec],
    name: str,
    category: C,
    word: str,
    result_ref: str | None,
    has_error: bool,
) -> None:
    spec = specs["batch"]
    view = status_view(spec, _payload("batch", name), BATCH)
    assert (view.category, view.remote_state) == (category, word)
    assert view.job_id == BATCH and view.job_id_matches is True
    assert view.result_ref == result_ref
    assert (view.error is not None) is has_error
    assert view.expires_at == 1745058000
    assert set(view.progress) == {"total", "completed", "failed"}
    assert view.required_fields_ok  # every success or partial here carries its output file


def test_batch_failure_keeps_the_provider_error(specs: dict[str, ProviderSpec]) -> None:
    view = status_view(specs["batch"], _payload("batch", "failed"), BATCH)
    assert view.error["data"][0]["code"] == "invalid_json_line"


def test_batch_job_id_mismatch_is_visible(specs: dict[str, ProviderSpec]) -> None:
    view = status_view(specs["batch"], _payload("batch", "completed"), "batch_other")
    assert view.job_id_matches is False


def test_batch_success_without_output_file_is_incomplete(specs: dict[str, ProviderSpec]) -> None:
    body = _payload("batch", "completed")
    body["output_file_id"] = None
    view = status_view(specs["batch"], body, BATCH)
    assert view.category is C.SUCCESS and view.missing_required == ("/output_file_id",)


def test_batch_create_and_result_summary(specs: dict[str, ProviderSpec]) -> None:
    spec = specs["batch"]
    created = create_outcome(spec, _call(_payload("batch", "create_response")))
    assert (created.job_id, created.remote_state, created.category) == (
        BATCH,
        "validating",
        C.PENDING,
    )
    final = _payload("batch", "completed_with_failures")
    lines = b'{"custom_id": "r1", "response": {"status_code": 200}}\n'
    fetched = CallResult(
        "GET",
        "/v1/files/file-cvaTdGR8r2VxYy4mQkN1aE/content",
        SENT_AT,
        3.0,
        http_status=200,
        content_type="application/octet-stream",
        body_bytes=lines,
    )
    check = check_result(spec, fetched, final)
    assert check.ok, check.problems
    assert check.summary == {"total": 500, "completed": 488, "failed": 12}
    assert check.size == len(lines)


# --- the same readings on edited payloads: what a provider may get wrong --------------------


@pytest.mark.parametrize(
    ("job_id", "problem"),
    [
        (None, "no job ID at /id"),
        (17, None),
        (True, "the job ID at /id is not a string"),
        ("", "the job ID at /id is empty, too long or not printable"),
        ("x" * 301, "the job ID at /id is empty, too long or not printable"),
        ("batch\n1", "the job ID at /id is empty, too long or not printable"),
        ("..", "the job ID at /id has an empty, '.' or '..' path segment"),
    ],
)
def test_create_job_id_problems(
    specs: dict[str, ProviderSpec], job_id: Any, problem: str | None
) -> None:
    body = _payload("batch", "create_response")
    body["id"] = job_id
    outcome = create_outcome(specs["batch"], _call(body))
    assert outcome.job_id_problem == problem
    assert (outcome.job_id is None) is (problem is not None)


def test_create_without_a_usable_answer(specs: dict[str, ProviderSpec]) -> None:
    spec = specs["batch"]
    assert create_outcome(spec, _call({"error": "busy"}, 503)).job_id_problem is None
    broken = CallResult("POST", "/", SENT_AT, 1.0, http_status=200, parse_error="not JSON")
    assert create_outcome(spec, broken).job_id_problem == "not JSON"
    empty = CallResult("POST", "/", SENT_AT, 1.0, http_status=202, body_bytes=b"")
    assert create_outcome(spec, empty).job_id_problem == "the response has no JSON body"


def _acme() -> ProviderSpec:
    data = {
        "base_url": "http://127.0.0.1:9000",
        "create": {"path": "/v1/jobs", "idempotency_header": "Idempotency-Key", "job_id": "/id"},
        "lookup": {"path": "/v1/jobs?key={idempotency_key}", "job_id": "/data/0/job_id"},
        "status": {"path": "/v1/jobs/{job_id}", "state": "/state", "result_ref": "/result/url"},
        "states": {"pending": ["running"], "success": ["succeeded"]},
        "result": {
            "path": "/v1/jobs/{job_id}/result",
            "content_type": "application/json",
            "required": ["/rows"],
            "failed_items": "/errors",
            "size": "/result/size",
        },
    }
    return parse_provider("acme", data, "test")


@pytest.mark.parametrize(
    ("status", "body", "verdict", "job_id"),
    [
        (200, {"data": [{"job_id": "j1"}]}, LookupVerdict.FOUND, "j1"),
        (200, {"data": []}, LookupVerdict.NOT_FOUND, None),
        (200, {"data": [{"job_id": None}]}, LookupVerdict.NOT_FOUND, None),
        (404, {"error": "no such key"}, LookupVerdict.NOT_FOUND, None),
        (200, {"data": [{"job_id": ["j1"]}]}, LookupVerdict.UNKNOWN, None),
        (500, {"error": "oops"}, LookupVerdict.UNKNOWN, None),
    ],
)
def test_lookup_verdicts(
    status: int, body: Any, verdict: LookupVerdict, job_id: str | None
) -> None:
    outcome = lookup_outcome(_acme(), _call(body, status))
    assert (outcome.verdict, outcome.job_id) == (verdict, job_id)


def _result_call(data: bytes, content_type: str = "application/json") -> CallResult:
    return CallResult(
        "GET",
        "/v1/jobs/j1/result",
        SENT_AT,
        2.0,
        http_status=200,
        content_type=content_type,
        body=json.loads(data) if content_type == "application/json" else None,
        body_bytes=data,
    )


def test_result_problems_are_each_named() -> None:
    spec = _acme()
    good = b'{"rows": [1, 2], "errors": [{"item": 7}]}'
    status = {"state": "succeeded", "result": {"url": "/r", "size": len(good)}}
    check = check_result(spec, _result_call(good), status)
    assert check.ok and check.failed_items == ({"item": 7},)
    assert check_result(spec, _result_call(good, "text/csv"), status).problems == (
        "the result content type is 'text/csv', expected 'application/json'",
    )
    wrong_size = {"result": {"url": "/r", "size": 3}}
    assert check_result(spec, _result_call(good), wrong_size).problems == (
        f"the result has {len(good)} bytes, the status says 3",
    )
    bare = b'{"errors": {"item": 7}}'
    problems = check_result(spec, _result_call(bare), {"result": {"size": len(bare)}}).problems
    assert problems == (
        "required field /rows is missing",
        "failed items at /errors is not a list",
    )
    refused = CallResult("GET", "", SENT_AT, 0.0, refused="no URL", maybe_delivered=False)
    assert check_result(spec, refused, status).problems == ("not fetched: no URL",)
    gone = CallResult("GET", "/r", SENT_AT, 1.0, http_status=410)
    assert check_result(spec, gone, status).problems == ("the result fetch answered HTTP 410",)
