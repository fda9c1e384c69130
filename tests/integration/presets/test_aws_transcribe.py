"""Contract test of the ``aws_transcribe`` preset against a replay of Amazon Transcribe.

As the API reference and botocore's model describe it (JSON 1.1): StartTranscriptionJob
and GetTranscriptionJob are ``POST /`` with ``X-Amz-Target: Transcribe.NAME``; a job is
``{"TranscriptionJob": {TranscriptionJobName, TranscriptionJobStatus, Media,
Transcript?, FailureReason?}}``; a taken name is ConflictException, an unknown one 400
BadRequestException "couldn't be found". Transcribe has no cancel.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from reconciler.core.errors import Conflict
from tests.integration.presets.aws_replay import (
    TranscribeApi,
    aws_rig,
    completed_transcript,
    refusal,
    states_seen,
)

pytestmark = pytest.mark.anyio

REQUEST = {
    "Media": {"MediaFileUri": "s3://media-in/interview.wav"},
    "LanguageCode": "en-US",
    "OutputBucketName": "transcripts-out",
}


def rig(tmp_path: Path, db_url: str, api: TranscribeApi) -> Any:
    return aws_rig(tmp_path, db_url, "aws_transcribe", api, {})


async def test_a_job_named_by_its_key_walks_to_completed_with_its_transcript(
    tmp_path: Path, db_url: str
) -> None:
    api = TranscribeApi()
    async with rig(tmp_path, db_url, api) as r:
        op_id = r.submit(REQUEST)
        key = r.row(op_id).idempotency_token
        api.replay.script = [
            {"TranscriptionJobStatus": "QUEUED"},
            {"TranscriptionJobStatus": "IN_PROGRESS"},
            completed_transcript(key),
        ]
        op = await r.run(op_id, ["succeeded"])
        assert api.bodies("StartTranscriptionJob") == [{**REQUEST, "TranscriptionJobName": key}]
        assert op.remote_job_id == key
        assert states_seen(r, op_id)[:3] == ["QUEUED", "IN_PROGRESS", "COMPLETED"]
        uri = r.view(op_id)["result"]["data"]["Transcript"]["TranscriptFileUri"]
        assert uri == f"s3://transcripts-out/{key}.json"
        # Every call: POST / in Transcribe's JSON protocol, its operation in the target.
        assert {c.headers["content-type"] for c in api.seen} == {"application/x-amz-json-1.1"}
        assert set(api.calls) == {"StartTranscriptionJob", "GetTranscriptionJob"}
        assert all(c.body == {"TranscriptionJobName": key} for c in api.seen[1:])


async def test_failed_keeps_the_failure_reason_and_there_is_no_cancel(
    tmp_path: Path, db_url: str
) -> None:
    api = TranscribeApi()
    reason = "The media format provided does not match the detected media format."
    api.replay.script = [{}, {"TranscriptionJobStatus": "FAILED", "FailureReason": reason}]
    async with rig(tmp_path, db_url, api) as r:
        op_id = r.submit(REQUEST)
        await r.step(op_id)
        with pytest.raises(Conflict, match="no cancel"):
            r.cancel(op_id)
        await r.run(op_id, ["failed"])
        assert reason in str(r.view(op_id)["error"])


async def test_a_lost_create_is_read_back_by_its_name(tmp_path: Path, db_url: str) -> None:
    api = TranscribeApi()
    async with rig(tmp_path, db_url, api) as r:
        op_id = r.submit(REQUEST)
        api.lose_next_create = True
        api.replay.script = [{}, completed_transcript("x")]
        op = await r.step(op_id)
        assert op.state == "create_unknown"
        await r.run(op_id, ["succeeded"])
        assert api.calls["StartTranscriptionJob"] == 1
        assert api.replay.only_job().id == r.row(op_id).remote_job_id


async def test_a_name_not_yet_readable_is_resent_and_its_conflict_settles_it(
    tmp_path: Path, db_url: str
) -> None:
    """The lookup finds nothing (the job is not readable yet): the create is sent again
    under the same name, Transcribe answers ConflictException, and the read finds it."""
    api = TranscribeApi()
    async with rig(tmp_path, db_url, api) as r:
        op_id = r.submit(REQUEST)
        api.lose_next_create, api.hide_reads = True, 1
        await r.run(op_id, ["observing"])
        assert api.calls["StartTranscriptionJob"] == 2  # the resend, answered with a conflict
        assert api.calls["GetTranscriptionJob"] == 2  # not found, then found
        assert api.replay.only_job().id == r.row(op_id).remote_job_id


def test_a_request_is_checked_against_the_start_body() -> None:
    assert refusal("aws_transcribe", {}, REQUEST) is None
    for bad, why in (
        ({**REQUEST, "TranscriptionJobName": "mine"}, "TranscriptionJobName"),
        ({"LanguageCode": "en-US"}, "Media"),
        ({"Media": REQUEST["Media"]}, "any of the given schemas"),
        ({**REQUEST, "IdentifyLanguage": True}, "valid under each of"),
    ):
        found = refusal("aws_transcribe", {}, bad)
        assert found is not None and why in found, (bad, found)
