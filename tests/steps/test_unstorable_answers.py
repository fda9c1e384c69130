"""Provider answers holding text no database can store: a contract violation, at once.

A NUL or a lone surrogate (legal JSON escapes) in any answer a step receives (create,
lookup, status, cancel, result, a recorded header) stops the operation with
``contract_violation`` at that first answer: one request, never a loop, never another
reason, the offending value recorded as a visible escape, and the same on SQLite and
PostgreSQL (which used to disagree: one stored a NUL state word, the other refused it and
read again until the budget was spent).
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.steps import StepRig, step_rig

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]


def raw(status: int, text: str, **headers: str) -> httpx.Response:
    """An answer written as raw JSON text: its escapes reach the service as sent."""
    return httpx.Response(
        status, content=text.encode(), headers={"content-type": "application/json", **headers}
    )


def refused(rig: StepRig, op_id: str) -> dict[str, Any]:
    """The operation stopped on a refused answer: its escalation and the evidence."""
    op = rig.row(op_id)
    view = rig.view(op_id)
    assert op.state == "escalated", (op.state, view["escalation"])
    escalation = view["escalation"]
    assert escalation["reason"] == "contract_violation"
    [evidence] = [e for e in rig.history(op_id) if e.cause.endswith("_answer_refused")]
    assert evidence.detail is not None
    return {"escalation": escalation, "evidence": evidence.detail, "op": op}


STATUS_POISONS = {
    "error text": (
        '{"job_id":"JOB","state":"failed","error":{"message":"bad\\u0000nul \\ud800 x"}}',
        "the body at /error/message",
        "bad\\u0000nul \\ud800 x",
    ),
    "state word with a surrogate": (
        '{"job_id":"JOB","state":"queued\\ud800"}',
        "the body at /state",
        "queued\\ud800",
    ),
    "state word with a NUL": (
        '{"job_id":"JOB","state":"queued\\u0000"}',
        "the body at /state",
        "queued\\u0000",
    ),
    "progress": (
        '{"job_id":"JOB","state":"running","progress":{"note":"\\udfff"}}',
        "the body at /progress/note",
        "\\udfff",
    ),
    "result reference": (
        '{"job_id":"JOB","state":"succeeded","result":{"url":"http://x/\\u0000"}}',
        "the body at /result/url",
        "http://x/\\u0000",
    ),
    "member name": (
        '{"job_id":"JOB","state":"running","extra":{"k\\ud800":1}}',
        "the body at /extra/k\\ud800",
        "k\\ud800",
    ),
}


@pytest.mark.parametrize("poison", list(STATUS_POISONS))
async def test_a_status_answer_with_unstorable_text_stops_at_the_first_read(
    tmp_path: Path, db_url: str, poison: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    text, where, shown = STATUS_POISONS[poison]
    async with step_rig(tmp_path, db_url) as rig:
        op_id = rig.submit()
        job_id = (await rig.step(op_id)).remote_job_id
        assert job_id is not None
        rig.provider.script("status", raw(200, text.replace("JOB", job_id)))
        rig.advance_to_due(op_id)
        await rig.tick()
        found = refused(rig, op_id)
        assert found["evidence"]["unstorable"] == {"at": where, "value": shown}
        assert found["evidence"]["http_status"] == 200
        assert shown in found["escalation"]["message"]
        assert [o["action"] for o in found["escalation"]["options"]] == ["cancel", "abandon"]
        assert found["op"].remote_state != text  # nothing of the answer was kept
        assert found["op"].status_requests_used == 1
        assert len(rig.provider.sent("status")) == 1
        # No more requests however long one waits: the operation waits for a person.
        assert found["op"].next_poll_at is None and await rig.tick() == 0
        said = [r.getMessage() for r in caplog.records if "escalated:" in r.getMessage()]
        assert said == [f"operation {op_id} escalated: contract_violation"]


async def test_a_create_answer_with_unstorable_text_stops_before_anything_is_kept(
    tmp_path: Path, db_url: str
) -> None:
    async with step_rig(tmp_path, db_url) as rig:
        rig.provider.script("create", raw(202, '{"job_id":"job-\\u0000","state":"queued"}'))
        op_id = rig.submit()
        rig.advance_to_due(op_id)
        await rig.tick()
        found = refused(rig, op_id)
        assert found["evidence"]["unstorable"]["at"] == "the body at /job_id"
        assert found["op"].remote_job_id is None
        assert [o["action"] for o in found["escalation"]["options"]] == ["abandon"]
        assert len(rig.provider.sent("create")) == 1


async def test_a_lookup_answer_with_unstorable_text_is_refused(tmp_path: Path, db_url: str) -> None:
    async with step_rig(tmp_path, db_url) as rig:
        rig.provider.script("create", httpx.ReadTimeout("lost"))
        rig.provider.script("lookup", raw(200, '{"data":[{"job_id":"j\\ud800"}]}'))
        op_id = rig.submit()
        op = await rig.step(op_id)
        assert op.state == "create_unknown"
        rig.advance_to_due(op_id)
        await rig.tick()
        found = refused(rig, op_id)
        assert found["evidence"]["unstorable"] == {
            "at": "the body at /data/0/job_id",
            "value": "j\\ud800",
        }


async def test_a_cancel_answer_with_unstorable_text_is_refused(tmp_path: Path, db_url: str) -> None:
    async with step_rig(tmp_path, db_url) as rig:
        op_id = rig.submit()
        await rig.step(op_id)
        rig.cancel(op_id)
        rig.provider.script("cancel", raw(202, '{"state":"cancelling","note":"\\u0000"}'))
        rig.advance_to_due(op_id)
        await rig.tick()
        found = refused(rig, op_id)
        assert found["evidence"]["unstorable"]["at"] == "the body at /note"
        assert len(rig.provider.sent("cancel")) == 1


async def test_a_recorded_header_with_unstorable_text_is_refused(
    tmp_path: Path, db_url: str
) -> None:
    async with step_rig(tmp_path, db_url) as rig:
        op_id = rig.submit()
        job_id = (await rig.step(op_id)).remote_job_id
        assert job_id is not None
        body = f'{{"job_id":"{job_id}","state":"running"}}'
        rig.provider.script("status", raw(200, body, **{"retry-after": "1\x00"}))
        rig.advance_to_due(op_id)
        await rig.tick()
        found = refused(rig, op_id)
        assert found["evidence"]["unstorable"] == {
            "at": "the retry-after header",
            "value": "1\\u0000",
        }


async def test_a_result_with_unstorable_text_stops_collection(tmp_path: Path, db_url: str) -> None:
    async with step_rig(tmp_path, db_url) as rig:
        op_id = rig.submit()
        job_id = (await rig.step(op_id)).remote_job_id
        assert job_id is not None
        job = rig.provider.finish(job_id)
        job.document = {"rows": [{"name": "x"}], "summary": {"processed": 1, "failed": 0}}
        poisoned = job.result_bytes().replace(b'"x"', b'"x\\ud800"')
        job.document = None
        rig.provider.script(
            "result",
            httpx.Response(200, content=poisoned, headers={"content-type": "application/json"}),
        )
        # The status names the checksum and size of the bytes it will serve.
        job.extra = {"result": {"url": "u", "sha256": _sha(poisoned), "size": len(poisoned)}}
        rig.advance_to_due(op_id)
        await rig.tick()
        found = refused(rig, op_id)
        assert found["evidence"]["unstorable"] == {
            "at": "the body at /rows/0/name",
            "value": "x\\ud800",
        }
        assert found["op"].result is None
        # The provider reported the job done: nothing to cancel, only to stop.
        assert [o["action"] for o in found["escalation"]["options"]] == ["abandon"]
        assert len(rig.provider.sent("result")) == 1


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def test_clean_text_beyond_ascii_passes(tmp_path: Path, db_url: str) -> None:
    async with step_rig(tmp_path, db_url) as rig:
        op_id = rig.submit()
        job_id = (await rig.step(op_id)).remote_job_id
        assert job_id is not None
        text = f'{{"job_id":"{job_id}","state":"failed","error":{{"message":"\\ud83d\\ude00 é"}}}}'
        rig.provider.script("status", raw(200, text))
        rig.advance_to_due(op_id)
        await rig.tick()
        op = rig.row(op_id)
        assert op.state == "failed"
        assert op.error["provider_error"] == {"message": "\U0001f600 é"}
        assert rig.view(op_id)["error"]["detail"]["provider_error"]["message"] == "\U0001f600 é"
