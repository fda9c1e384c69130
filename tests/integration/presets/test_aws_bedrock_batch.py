"""Contract test of the ``aws_bedrock_batch`` preset against a replay of Bedrock's batch
inference API.

As the API reference and botocore's model describe it (REST-JSON): POST
/model-invocation-job {jobName, clientRequestToken, roleArn, modelId, inputDataConfig,
outputDataConfig, ...} -> {jobArn}, a resend with the same token answering the same
job; GET /model-invocation-job/{ARN, percent-encoded} -> the job {status, message,
outputDataConfig, *RecordCount}; GET /model-invocation-jobs?nameContains= ->
{invocationJobSummaries, nextToken}; POST /model-invocation-job/{id}/stop. jobName and
clientRequestToken must match their patterns (letters, digits, hyphens: no ``_``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.presets.aws_replay import aws_rig, refusal, states_seen
from tests.integration.presets.aws_rest_replay import (
    BEDROCK_NAME,
    BEDROCK_TOKEN,
    BedrockApi,
    bedrock_ended,
)

pytestmark = pytest.mark.anyio

ROLE_ARN = "arn:aws:iam::123456789012:role/bedrock-batch"
DEPLOYMENT = {"create": {"set": {"/roleArn": ROLE_ARN}}}
REQUEST = {
    "modelId": "anthropic.claude-3-haiku-20240307-v1:0",
    "inputDataConfig": {"s3InputDataConfig": {"s3Uri": "s3://batch-in/records.jsonl"}},
    "outputDataConfig": {"s3OutputDataConfig": {"s3Uri": "s3://batch-out/"}},
}


def rig(tmp_path: Path, db_url: str, api: BedrockApi) -> Any:
    return aws_rig(tmp_path, db_url, "aws_bedrock_batch", api, DEPLOYMENT)


async def test_a_job_with_the_key_as_token_and_name_completes_with_its_counts(
    tmp_path: Path, db_url: str
) -> None:
    api = BedrockApi()
    api.replay.script = [
        {"status": "Validating"},
        {"status": "InProgress"},
        bedrock_ended("Completed"),
    ]
    async with rig(tmp_path, db_url, api) as r:
        op_id = r.submit(REQUEST)
        op = await r.run(op_id, ["succeeded"])
        alnum = op.idempotency_token.replace("_", "")
        [sent] = api.bodies("CreateModelInvocationJob")
        assert sent == {
            **REQUEST,
            "roleArn": ROLE_ARN,
            "clientRequestToken": alnum,
            "jobName": f"reconciler-{alnum}",
        }
        assert BEDROCK_TOKEN.fullmatch(alnum) and BEDROCK_NAME.fullmatch(sent["jobName"])
        assert states_seen(r, op_id)[:3] == ["Validating", "InProgress", "Completed"]
        result = r.view(op_id)["result"]
        assert result["data"] == REQUEST["outputDataConfig"]
        assert result["summary"]["total"] == 100 and result["summary"]["failed"] == 0
        # The job's ARN is one path segment, percent-encoded as the AWS SDKs send it.
        read = next(c for c in api.seen if c.operation == "GetModelInvocationJob")
        assert read.raw_path.startswith(b"/model-invocation-job/arn%3Aaws%3Abedrock%3A")
        assert b"%2F" in read.raw_path


@pytest.mark.parametrize(
    ("end", "state", "code"),
    [
        (bedrock_ended("PartiallyCompleted", errors=3), "completed_with_errors", None),
        ({"status": "Expired", "message": "The job ran past its timeout"}, "failed", "expired"),
        ({"status": "Failed", "message": "The input file is not valid JSONL"}, "failed", None),
    ],
)
async def test_the_other_ends(
    tmp_path: Path, db_url: str, end: dict[str, Any], state: str, code: str | None
) -> None:
    api = BedrockApi()
    api.replay.script = [end]
    async with rig(tmp_path, db_url, api) as r:
        op_id = r.submit(REQUEST)
        await r.run(op_id, [state])
        if "message" in end:
            assert end["message"] in str(r.view(op_id)["error"])
        if code is not None:
            assert r.view(op_id)["error"]["code"] == code


async def test_a_cancel_stops_the_job(tmp_path: Path, db_url: str) -> None:
    api = BedrockApi()
    api.replay.script = [{"status": "InProgress"}]
    async with rig(tmp_path, db_url, api) as r:
        op_id = r.submit(REQUEST)
        await r.step(op_id)
        r.advance_to_due(op_id)
        await r.tick()
        r.cancel(op_id)
        await r.run(op_id, ["cancelled"])
        assert api.calls["StopModelInvocationJob"] == 1
        assert states_seen(r, op_id)[-2:] == ["Stopping", "Stopped"]


async def test_a_lost_create_is_found_by_its_name_and_one_job_is_made(
    tmp_path: Path, db_url: str
) -> None:
    api = BedrockApi()
    api.replay.script = [bedrock_ended("Completed")]
    async with rig(tmp_path, db_url, api) as r:
        op_id = r.submit(REQUEST)
        api.lose_next_create, api.hide_reads = True, 1
        op = await r.run(op_id, ["succeeded"])
        # The list lagged once: the create was resent with the same token, which Bedrock
        # answers with the same job; the check after it finds that job by its name.
        assert api.calls["CreateModelInvocationJob"] == 2
        assert api.replay.only_job().body["jobArn"] == op.remote_job_id
        listed = next(c for c in api.seen if c.operation == "ListModelInvocationJobs")
        alnum = op.idempotency_token.replace("_", "")
        assert f"nameContains=reconciler-{alnum}".encode() in listed.raw_path


def test_the_request_is_the_model_and_its_s3_data() -> None:
    assert refusal("aws_bedrock_batch", DEPLOYMENT, REQUEST) is None
    for bad in (
        {**REQUEST, "roleArn": ROLE_ARN},
        {**REQUEST, "jobName": "mine"},
        {**REQUEST, "timeoutDurationInHours": 2},
        {"modelId": REQUEST["modelId"]},
    ):
        assert refusal("aws_bedrock_batch", DEPLOYMENT, bad) is not None, bad
