"""Contract test of the ``aws_batch`` preset against a replay of AWS Batch.

As the API reference and botocore's model describe it (REST-JSON): POST /v1/submitjob
{jobName, jobQueue, jobDefinition, ...} -> {jobArn, jobName, jobId}; POST
/v1/describejobs {jobs: [id]} -> {jobs: [{status, statusReason, container, isCancelled,
isTerminated, ...}]}; POST /v1/listjobs {jobQueue, filters: [{name: JOB_NAME, values}]}
-> {jobSummaryList, nextToken}; POST /v1/terminatejob {jobId, reason}. SubmitJob takes
no client token. The deployment names the job queue, as the preset says.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.presets.aws_replay import aws_rig, refusal, states_seen
from tests.integration.presets.aws_rest_replay import QUEUE, BatchApi, batch_succeeded

pytestmark = pytest.mark.anyio

DEPLOYMENT = {"create": {"set": {"/jobQueue": QUEUE}}, "lookup": {"set": {"/jobQueue": QUEUE}}}
REQUEST = {
    "jobDefinition": "nightly-etl:3",
    "containerOverrides": {"command": ["etl", "--day", "2025-04-17"]},
}


def rig(tmp_path: Path, db_url: str, api: BatchApi) -> Any:
    return aws_rig(tmp_path, db_url, "aws_batch", api, DEPLOYMENT)


async def test_a_job_named_by_its_key_runs_to_succeeded_with_its_description(
    tmp_path: Path, db_url: str
) -> None:
    api = BatchApi()
    api.replay.script = [{"status": "RUNNABLE"}, {"status": "RUNNING"}, batch_succeeded()]
    async with rig(tmp_path, db_url, api) as r:
        op_id = r.submit(REQUEST)
        op = await r.run(op_id, ["succeeded"])
        key = op.idempotency_token
        assert api.bodies("submitjob") == [{**REQUEST, "jobName": key, "jobQueue": QUEUE}]
        assert api.bodies("describejobs")[0] == {"jobs": [op.remote_job_id]}
        assert states_seen(r, op_id)[:3] == ["RUNNABLE", "RUNNING", "SUCCEEDED"]
        assert r.view(op_id)["result"]["data"]["container"]["exitCode"] == 0


@pytest.mark.parametrize("started", [False, True])
async def test_a_cancel_terminates_the_job_and_its_end_is_a_cancellation(
    tmp_path: Path, db_url: str, started: bool
) -> None:
    """A job not yet started is cancelled (isCancelled), a running one terminated
    (isTerminated); both read FAILED, which the rules make a cancellation."""
    api = BatchApi()
    api.replay.script = [{"status": "RUNNING" if started else "RUNNABLE"}]
    async with rig(tmp_path, db_url, api) as r:
        op_id = r.submit(REQUEST)
        await r.step(op_id)
        await r.run(op_id, ["observing"])
        r.advance_to_due(op_id)
        await r.tick()
        r.cancel(op_id)
        await r.run(op_id, ["cancelled"])
        [terminate] = api.bodies("terminatejob")
        assert op_id in terminate["reason"] and terminate["jobId"] == r.row(op_id).remote_job_id
        assert states_seen(r, op_id)[-1] == "FAILED"


async def test_failed_keeps_the_status_reason(tmp_path: Path, db_url: str) -> None:
    api = BatchApi()
    reason = "Essential container in task exited"
    api.replay.script = [{"status": "FAILED", "statusReason": reason}]
    async with rig(tmp_path, db_url, api) as r:
        op_id = r.submit(REQUEST)
        await r.run(op_id, ["failed"])
        assert reason in str(r.view(op_id)["error"])


async def test_a_lost_submit_is_found_by_its_name_and_never_resent(
    tmp_path: Path, db_url: str
) -> None:
    api = BatchApi()
    api.replay.script = [batch_succeeded()]
    async with rig(tmp_path, db_url, api) as r:
        op_id = r.submit(REQUEST)
        api.lose_next_create = True
        await r.step(op_id)
        api.other_jobs(3, "someone-else")
        op = await r.run(op_id, ["succeeded"])
        key = op.idempotency_token
        assert api.calls["submitjob"] == 1
        [listed] = api.bodies("listjobs")
        assert listed["jobQueue"] == QUEUE
        assert listed["filters"] == [{"name": "JOB_NAME", "values": [key]}]
        assert op.remote_job_id == next(j.id for j in api.replay.all_jobs() if j.request)


def test_the_request_names_the_definition_and_nothing_the_service_sets() -> None:
    assert refusal("aws_batch", DEPLOYMENT, REQUEST) is None
    for bad in (
        {**REQUEST, "jobName": "mine"},
        {**REQUEST, "jobQueue": "other"},
        {"parameters": {}},
    ):
        assert refusal("aws_batch", DEPLOYMENT, bad) is not None, bad
