"""Contract test of the ``aws_step_functions`` preset against a replay of Step Functions.

As the API reference and botocore's model describe it (JSON 1.0): StartExecution,
DescribeExecution, ListExecutions and StopExecution are ``POST /`` with
``X-Amz-Target: AWSStepFunctions.NAME``; an execution is {executionArn, name, status,
input, output?, error?, cause?}; StartExecution is idempotent on the name while the
execution runs and answers 400 ExecutionAlreadyExists once it has ended; an unknown
ARN is 400 ExecutionDoesNotExist; ListExecutions lists newest first and is eventually
consistent. The deployment names the state machine, as the preset says.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.integration.presets.aws_replay import (
    MACHINE_ARN,
    StepFunctionsApi,
    aws_rig,
    now_epoch,
    refusal,
    states_seen,
)

pytestmark = pytest.mark.anyio

DEPLOYMENT = {
    "create": {"set": {"/stateMachineArn": MACHINE_ARN}},
    "lookup": {"set": {"/stateMachineArn": MACHINE_ARN}},
}
REQUEST = {"input": json.dumps({"orderId": 42})}


def rig(tmp_path: Path, db_url: str, api: StepFunctionsApi) -> Any:
    return aws_rig(tmp_path, db_url, "aws_step_functions", api, DEPLOYMENT)


def ended(status: str, **fields: Any) -> dict[str, Any]:
    return {"status": status, "stopDate": now_epoch(), **fields}


async def test_an_execution_named_by_its_key_succeeds_with_its_output(
    tmp_path: Path, db_url: str
) -> None:
    api = StepFunctionsApi()
    api.replay.script = [{}, ended("SUCCEEDED", output='{"shipped": true}')]
    async with rig(tmp_path, db_url, api) as r:
        op_id = r.submit(REQUEST)
        op = await r.run(op_id, ["succeeded"])
        key = op.idempotency_token
        sent = {**REQUEST, "name": key, "stateMachineArn": MACHINE_ARN}
        assert api.bodies("StartExecution") == [sent]
        assert op.remote_job_id == f"{MACHINE_ARN.replace('stateMachine', 'execution')}:{key}"
        assert api.bodies("DescribeExecution")[0] == {"executionArn": op.remote_job_id}
        assert r.view(op_id)["result"]["data"] == '{"shipped": true}'
        assert states_seen(r, op_id)[:2] == ["RUNNING", "SUCCEEDED"]
        assert {c.headers["content-type"] for c in api.seen} == {"application/x-amz-json-1.0"}


@pytest.mark.parametrize(
    ("word", "code"), [("FAILED", "provider_failed"), ("TIMED_OUT", "expired")]
)
async def test_failed_keeps_the_cause_and_timed_out_is_an_expiry(
    tmp_path: Path, db_url: str, word: str, code: str
) -> None:
    api = StepFunctionsApi()
    cause = "Lambda.Unknown: the charge-card task returned an error"
    api.replay.script = [ended(word, error="States.TaskFailed", cause=cause)]
    async with rig(tmp_path, db_url, api) as r:
        op_id = r.submit(REQUEST)
        await r.run(op_id, ["failed"])
        error = r.view(op_id)["error"]
        assert cause in str(error) and error["code"] == code


async def test_a_cancel_stops_the_execution_and_aborted_ends_it(
    tmp_path: Path, db_url: str
) -> None:
    api = StepFunctionsApi()
    async with rig(tmp_path, db_url, api) as r:
        op_id = r.submit(REQUEST)
        op = await r.step(op_id)
        await r.run(op_id, ["observing"])
        r.cancel(op_id, "not needed")
        await r.run(op_id, ["cancelled"])
        [stop] = api.bodies("StopExecution")
        assert stop["executionArn"] == op.remote_job_id and op_id in stop["cause"]
        assert states_seen(r, op_id)[-1] == "ABORTED"


async def test_a_lost_start_is_found_in_the_list_past_later_executions(
    tmp_path: Path, db_url: str
) -> None:
    api = StepFunctionsApi()
    api.replay.script = [ended("SUCCEEDED", output="{}")]
    async with rig(tmp_path, db_url, api) as r:
        op_id = r.submit(REQUEST)
        api.lose_next_create = True
        await r.step(op_id)
        api.other_executions(1500)  # started after ours: listed before it, over two pages
        await r.run(op_id, ["succeeded"])
        assert api.calls["StartExecution"] == 1
        listed = api.bodies("ListExecutions")
        assert listed == [
            {"stateMachineArn": MACHINE_ARN, "maxResults": 1000},
            {"stateMachineArn": MACHINE_ARN, "maxResults": 1000, "nextToken": "1000"},
        ]


@pytest.mark.parametrize("running", [True, False])
async def test_a_start_the_list_does_not_show_yet_is_resent_and_settles_to_one_execution(
    tmp_path: Path, db_url: str, running: bool
) -> None:
    """ListExecutions lags: the lost start is resent under the same name. While the
    execution runs Step Functions answers it with the same ARN; once it has ended, with
    ExecutionAlreadyExists, which the next listing settles."""
    api = StepFunctionsApi()
    async with rig(tmp_path, db_url, api) as r:
        op_id = r.submit(REQUEST)
        api.lose_next_create, api.hide_reads = True, 1
        await r.step(op_id)
        if not running:
            execution = api.replay.only_job().id
            api.replay.set(execution, ended("SUCCEEDED", output="{}"))
        op = await r.run(op_id, ["observing", "succeeded"])
        # The resend, then a listing: the one that settles the conflict, or the check that
        # the answered resend names the execution the list shows.
        assert [c.operation for c in api.seen] == [
            "StartExecution",
            "ListExecutions",
            "StartExecution",
            "ListExecutions",
        ]
        assert api.replay.only_job().id == op.remote_job_id


def test_the_request_is_the_execution_input_and_nothing_the_service_sets() -> None:
    assert refusal("aws_step_functions", DEPLOYMENT, REQUEST) is None
    for bad in (
        {**REQUEST, "name": "mine"},
        {**REQUEST, "stateMachineArn": MACHINE_ARN},
        {"input": {"orderId": 42}},  # the input is a JSON text, not an object
    ):
        assert refusal("aws_step_functions", DEPLOYMENT, bad) is not None, bad
