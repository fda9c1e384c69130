"""The collect step: fetch, validate and keep the result, or say why there is none.

Small results are kept inline, large ones as a reference with SHA-256 and size; a
result that arrives but does not validate ends ``result_validation_failed``, one that
cannot be fetched within the failure budget ends ``result_unavailable``.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from reconciler.core.collect import INLINE_RESULT_BYTES, MAX_FAILED_ITEMS
from tests.support.provider_mock import Job, error, result_document
from tests.support.statements import recording
from tests.support.steps import StepRig, step_rig

pytestmark = pytest.mark.anyio


async def done_at_provider(rig: StepRig, state: str = "succeeded", **values: Any) -> str:
    op_id = rig.submit()
    op = await rig.step(op_id)
    assert op.remote_job_id is not None
    rig.provider.finish(op.remote_job_id, state, **values)
    return op_id


def job_of(rig: StepRig, op_id: str) -> Job:
    return rig.provider.jobs[rig.row(op_id).remote_job_id or ""]


async def test_a_small_result_is_verified_and_kept_inline(tmp_path: Path, db_url: str) -> None:
    async with step_rig(tmp_path, db_url) as rig:
        op_id = await done_at_provider(rig)
        await rig.run(op_id, ["succeeded"])
        data = job_of(rig, op_id).result_bytes()
        result = rig.view(op_id)["result"]
        assert result["size"] == len(data) <= INLINE_RESULT_BYTES
        assert result["sha256"] == hashlib.sha256(data).hexdigest()
        assert result["data"] == json.loads(data)
        assert result["summary"] == {"processed": 3, "failed": 0}
        assert [r.endpoint for r in rig.provider.requests] == ["create", "status", "result"]
        [fetch] = rig.provider.sent("result")
        assert fetch.headers["authorization"] == "Bearer sim-token-for-tests"


async def test_a_large_partial_result_is_kept_as_a_reference_with_bounded_failed_items(
    tmp_path: Path, db_url: str
) -> None:
    document = result_document(rows=6000, failed=600)
    async with step_rig(tmp_path, db_url) as rig:
        op_id = await done_at_provider(rig, "completed_with_errors", document=document)
        await rig.run(op_id, ["completed_with_errors"])
        view = rig.view(op_id)
        data = job_of(rig, op_id).result_bytes()
        result = view["result"]
        assert len(data) > INLINE_RESULT_BYTES
        assert "data" not in result  # a reference, not inline
        assert result["size"] == len(data)
        assert result["sha256"] == hashlib.sha256(data).hexdigest()
        assert result["ref"].endswith(f"/v1/jobs/{job_of(rig, op_id).id}/result")
        assert result["summary"] == {"processed": 6000, "failed": 600}
        assert result["failed_items"] == document["errors"][:MAX_FAILED_ITEMS]
        assert result["failed_items_truncated"] is True
        assert "FINISHED WITH ERRORS" in view["message"] and view["error"] is None


def tamper(kind: str) -> Any:
    """Change what the provider serves so that the result no longer validates."""

    def apply(job: Job) -> None:
        if kind == "checksum_mismatch":
            job.extra["result"] = {"url": "x", "sha256": "0" * 64, "size": len(job.result_bytes())}
        elif kind == "size_mismatch":
            job.extra["result"] = {"url": "x", "size": 1}
        elif kind == "missing_rows":
            job.document = {"summary": {"processed": 0, "failed": 0}}

    return apply


@pytest.mark.parametrize(
    ("fault", "problem"),
    [
        ("checksum_mismatch", "SHA-256 does not match"),
        ("size_mismatch", "the status says"),
        ("missing_rows", "required field /rows is missing"),
        ("wrong_content_type", "content type"),
    ],
)
async def test_a_result_that_does_not_validate_ends_result_validation_failed(
    tmp_path: Path, db_url: str, fault: str, problem: str
) -> None:
    async with step_rig(tmp_path, db_url) as rig:
        op_id = await done_at_provider(rig)
        job = job_of(rig, op_id)
        tamper(fault)(job)
        if fault == "wrong_content_type":
            rig.provider.script(
                "result",
                httpx.Response(
                    200, content=job.result_bytes(), headers={"content-type": "text/csv"}
                ),
            )
        if fault in ("checksum_mismatch", "size_mismatch"):
            # The status names the result URL; keep it pointing at the provider.
            job.extra["result"]["url"] = f"http://provider.test/v1/jobs/{job.id}/result"
        await rig.run(op_id, ["result_validation_failed"])
        view = rig.view(op_id)
        assert view["result"] is None
        assert view["error"]["code"] == "result_invalid"
        assert any(problem in p for p in view["error"]["detail"]["problems"]), view["error"]
        assert problem in view["error"]["message"]
        assert len(rig.provider.sent("result")) == 1  # a bad result is not fetched again


async def test_fetch_failures_end_unavailable_after_the_failure_budget(
    tmp_path: Path, db_url: str
) -> None:
    budget = 3
    provider = {"polling": {"max_transport_failures": budget}}
    async with step_rig(tmp_path, db_url, provider=provider) as rig:
        op_id = await done_at_provider(rig)
        rig.provider.script("result", error(503), httpx.ReadTimeout("slow"), error(500))
        await rig.run(op_id, ["result_unavailable"])
        view = rig.view(op_id)
        assert view["error"]["code"] == "result_unavailable"
        assert view["error"]["detail"]["attempts"] == budget
        assert view["error"]["detail"]["detail"]["http_status"] == 500
        assert view["error"]["http_status"] == 500
        assert view["error"]["message"] == (
            f"the result could not be fetched ({budget} attempts; last: HTTP 500)"
        )
        assert len(rig.provider.sent("result")) == budget
        fetches = [e for e in rig.history(op_id) if e.cause == "result_fetch"]
        assert len(fetches) == budget
        # Each retry waited for its backoff: no two fetches at one moment.
        moments = [r.at for r in rig.provider.sent("result")]
        assert moments == sorted(set(moments))


async def test_a_fetch_that_fails_once_is_retried_and_then_verified(
    tmp_path: Path, db_url: str
) -> None:
    async with step_rig(tmp_path, db_url) as rig:
        op_id = await done_at_provider(rig)
        rig.provider.script("result", error(502))
        await rig.run(op_id, ["succeeded"])
        assert len(rig.provider.sent("result")) == 2
        assert rig.view(op_id)["result"]["sha256"]


async def test_a_missing_result_ends_unavailable(tmp_path: Path, db_url: str) -> None:
    async with step_rig(tmp_path, db_url) as rig:
        op_id = await done_at_provider(rig)
        rig.provider.script("result", *[error(404)] * 10)
        await rig.run(op_id, ["result_unavailable"])
        view = rig.view(op_id)
        assert view["error"]["http_status"] == 404 and view["result"] is None
        assert 1 <= len(rig.provider.sent("result")) <= rig.row(op_id).max_transport_failures


async def test_without_a_result_section_the_confirmed_status_is_the_outcome(
    tmp_path: Path, db_url: str
) -> None:
    async with step_rig(tmp_path, db_url, drop=("result",)) as rig:
        op_id = await done_at_provider(rig)
        await rig.run(op_id, ["succeeded"])
        assert rig.provider.sent("result") == []
        result = rig.row(op_id).result
        assert result is not None and result["ref"].endswith("/result")
        assert "no_result_to_collect" in rig.causes(op_id)


async def test_a_webhook_hint_during_the_fetch_does_not_fetch_again(
    tmp_path: Path, db_url: str
) -> None:
    """A write to the row while the fetch is out (a hint) is kept, and the fetch stands."""
    async with step_rig(tmp_path, db_url) as rig:
        op_id = await done_at_provider(rig)
        rig.advance_to_due(op_id)
        await rig.step(op_id)  # the confirming status read
        assert rig.row(op_id).state == "result_collecting"

        def hinted_meanwhile(request: httpx.Request) -> httpx.Response:
            with rig.runtime.db.write() as conn:
                rig.runtime.journal.write(
                    conn,
                    rig.row(op_id),
                    now=rig.clock.now(),
                    changes={"hinted_at": rig.clock.now()},
                )
            return rig.provider.usual(request)

        rig.provider.script("result", hinted_meanwhile)
        assert (await rig.step(op_id)).state == "succeeded"
        assert len(rig.provider.sent("result")) == 1


async def test_the_confirming_read_counts_the_fetch_in_its_own_write(
    tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The task that confirms the end goes on to fetch the result: the write that records
    the confirmation counts the fetch too (``Flow.ahead``), where a write of the fetch's
    own did it before. The count is still made before the fetch is sent."""
    async with step_rig(tmp_path, db_url) as rig:
        op_id = await done_at_provider(rig)
        rig.advance_to_due(op_id)
        with recording(monkeypatch) as ran:
            assert await rig.tick() == 1
        op = rig.row(op_id)
        assert op.state == "succeeded" and op.result_attempts == 1
        # A write of the count alone: the row's version, history head and the count.
        alone = re.compile(r"SET history_head = \S+, history_seq = \S+, result_attempts = \S+, up")
        assert [sql for sql, _ in ran if alone.search(sql)] == []
        [confirmed] = [e for e in rig.history(op_id) if e.cause == "status_confirmed_done"]
        assert [r.endpoint for r in rig.provider.requests] == ["create", "status", "result"]
        assert confirmed.to_state == "result_collecting"
