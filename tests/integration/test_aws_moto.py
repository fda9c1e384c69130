"""The AWS presets against moto in server mode with its signature checks on.

One ``moto_server`` for this module (tests/support/moto_server.py; one xdist worker runs
the whole module, see tests/support/scheduling.py), an IAM user's key made with its first
unsigned actions; after them every request must be signed by that key. The service's
steps run on the step rig's clock, their calls going to moto over real HTTP through
``AwsWire``, which counts them by operation and can lose one answer; the key pair is in
the environment, where botocore's credential chain finds it.

What moto serves: Transcribe (a job advances one state per GetTranscriptionJob), Step
Functions (executions run their state machine: the tests' machines wait, then pass their
input on), Batch (jobs succeed as they are submitted). Bedrock's model invocation jobs
moto does not implement: that preset is proven against its replay only.

Each test asserts what moto holds (through boto3, signed with the same key) as well as
what the service reports, and the calls each operation took.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from reconciler.logs import QUIET_LIBRARIES, quiet_libraries
from reconciler.providers.adapter import LookupVerdict, Subject
from tests.integration.presets.replay import merge
from tests.support.aws_credentials import aws_credentials
from tests.support.moto_server import AwsWire, Moto, MotoUnavailable, moto_executable, moto_server
from tests.support.steps import StepRig, step_rig
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(300)]

ROLE_ARN = "arn:aws:iam::123456789012:role/reconciler-tests"
MEDIA = {"Media": {"MediaFileUri": "s3://media-in/interview.wav"}, "LanguageCode": "en-US"}
EXECUTION = {"input": json.dumps({"orderId": 42})}
BATCH_JOB = {"jobDefinition": "reconciler-definition"}
# How long moto's Step Functions takes to run a machine that waits a second (real time).
EXECUTION_SECONDS = 30.0


@dataclass(frozen=True)
class Deployed:
    """What the tests' deployments name at moto."""

    quick_machine: str  # waits a second, then passes its input on
    slow_machine: str  # waits five minutes: it runs until it is stopped
    queue: str


def machine(seconds: int) -> str:
    states = {
        "Wait": {"Type": "Wait", "Seconds": seconds, "Next": "Done"},
        "Done": {"Type": "Pass", "End": True},
    }
    return json.dumps({"StartAt": "Wait", "States": states})


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Moto]:
    try:
        moto_executable()
    except MotoUnavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"moto must run in CI: {exc}")
        pytest.skip(str(exc))
    with moto_server(tmp_path_factory.mktemp("moto")) as server:
        yield server


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def deployed(moto: Moto) -> Deployed:
    trust = {"Version": "2012-10-17", "Statement": []}
    role = moto.client("iam").create_role(
        RoleName="reconciler-tests", AssumeRolePolicyDocument=json.dumps(trust)
    )
    assert role["Role"]["Arn"] == ROLE_ARN
    sfn = moto.client("stepfunctions")
    quick = sfn.create_state_machine(name="quick", definition=machine(1), roleArn=ROLE_ARN)
    slow = sfn.create_state_machine(name="slow", definition=machine(300), roleArn=ROLE_ARN)
    batch = moto.client("batch")
    environment = batch.create_compute_environment(
        computeEnvironmentName="reconciler-env",
        type="UNMANAGED",
        state="ENABLED",
        serviceRole=ROLE_ARN,
    )
    order = [{"order": 1, "computeEnvironment": environment["computeEnvironmentArn"]}]
    batch.create_job_queue(
        jobQueueName="reconciler-queue", state="ENABLED", priority=1, computeEnvironmentOrder=order
    )
    batch.register_job_definition(
        jobDefinitionName="reconciler-definition",
        type="container",
        containerProperties={"image": "busybox", "vcpus": 1, "memory": 128, "command": ["true"]},
    )
    return Deployed(quick["stateMachineArn"], slow["stateMachineArn"], "reconciler-queue")


def deployment(preset: str, deployed: Deployed, machine_arn: str | None = None) -> dict[str, Any]:
    """The keys a deployment adds to the preset (the preset's comment says which)."""
    if preset == "aws_step_functions":
        arn = machine_arn or deployed.quick_machine
        return {
            "create": {"set": {"/stateMachineArn": arn}},
            "lookup": {"set": {"/stateMachineArn": arn}},
        }
    if preset == "aws_batch":
        queue = {"/jobQueue": deployed.queue}
        return {"create": {"set": queue}, "lookup": {"set": queue}}
    return {}


@asynccontextmanager
async def moto_rig(
    tmp_path: Path,
    db_url: str,
    moto: Moto,
    preset: str,
    keys: dict[str, Any],
    secret: str | None = None,
) -> AsyncIterator[tuple[StepRig, AwsWire]]:
    """The step rig running ``preset`` (with the deployment's ``keys``) against moto."""
    wire = AwsWire()
    table: dict[str, Any] = {"preset": preset, "base_url": moto.url}
    merge(table, keys)
    with aws_credentials(moto.key_id, secret or moto.secret) as environ:
        async with step_rig(tmp_path, db_url, table=table, environ=environ, transport=wire) as rig:
            yield rig, wire


def key_of(rig: StepRig, op_id: str) -> str:
    return rig.row(op_id).idempotency_token


# --- Transcribe ---------------------------------------------------------------------------


async def test_transcribe_runs_a_job_to_completed_with_signed_calls(
    tmp_path: Path, db_url: str, moto: Moto
) -> None:
    async with moto_rig(tmp_path, db_url, moto, "aws_transcribe", {}) as (rig, wire):
        op_id = rig.submit(MEDIA)
        await rig.run(op_id, ["succeeded"])
        key = key_of(rig, op_id)
        uri = rig.view(op_id)["result"]["data"]["Transcript"]["TranscriptFileUri"]
        assert f"/{key}/" in uri
        job = moto.client("transcribe").get_transcription_job(TranscriptionJobName=key)
        assert job["TranscriptionJob"]["Media"] == MEDIA["Media"]
        # One start; reads QUEUED, IN_PROGRESS, COMPLETED, and the result read again.
        assert wire.calls == {"StartTranscriptionJob": 1, "GetTranscriptionJob": 4}


async def test_the_signed_requests_credentials_are_nowhere_the_service_keeps_or_says(
    tmp_path: Path, db_url: str, moto: Moto, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("DEBUG")  # the level an operator may set (``log_level``)
    quiet = [logging.getLogger(name) for name in QUIET_LIBRARIES]
    levels = [logger.level for logger in quiet]
    quiet_libraries()  # what the service's log set-up does at any level
    try:
        async with moto_rig(tmp_path, db_url, moto, "aws_transcribe", {}) as (rig, wire):
            op_id = rig.submit(MEDIA)
            await rig.run(op_id, ["succeeded"])
            kept = json.dumps([rig.history(op_id), rig.view(op_id)], default=str)
    finally:
        for logger, level in zip(quiet, levels, strict=True):
            logger.setLevel(level)
    kept += caplog.text
    signatures = [auth.rsplit("Signature=", 1)[1] for auth in wire.authorizations]
    assert len(signatures) == 5 and all(len(sig) == 64 for sig in signatures)
    for secret in (*signatures, moto.secret):
        assert secret not in kept
    assert "AWS4-HMAC-SHA256" not in kept


async def test_transcribe_starts_once_per_key_and_a_lost_start_is_read_back(
    tmp_path: Path, db_url: str, moto: Moto
) -> None:
    async with moto_rig(tmp_path, db_url, moto, "aws_transcribe", {}) as (rig, wire):
        # The same start twice, as a resend sends it: the second is a conflict, and the
        # lookup by name finds the one job.
        adapter = rig.runtime.adapters["sim"]
        subject = Subject("op_direct", "idem_" + "5" * 32, "tr_direct")
        first = await adapter.create(MEDIA, subject)
        again = await adapter.create(MEDIA, subject)
        found = await adapter.lookup(subject)
        assert first.job_id == subject.idempotency_key and again.duplicate
        assert again.call.http_status in (400, 409)
        assert (found.verdict, found.job_id) == (LookupVerdict.FOUND, first.job_id)

        op_id = rig.submit(MEDIA)
        wire.lose = "StartTranscriptionJob"
        assert (await rig.step(op_id)).state == "create_unknown"
        await rig.run(op_id, ["succeeded"])
        key = key_of(rig, op_id)
        listed = moto.client("transcribe").list_transcription_jobs(JobNameContains=key)
        assert [j["TranscriptionJobName"] for j in listed["TranscriptionJobSummaries"]] == [key]
        assert wire.calls["StartTranscriptionJob"] == 3  # two direct, one by the service


# --- Step Functions -----------------------------------------------------------------------


def execution_status(moto: Moto, arn: str) -> str:
    status: str = moto.client("stepfunctions").describe_execution(executionArn=arn)["status"]
    return status


async def test_step_functions_runs_an_execution_to_succeeded_with_its_output(
    tmp_path: Path, db_url: str, moto: Moto, deployed: Deployed
) -> None:
    keys = deployment("aws_step_functions", deployed)
    async with moto_rig(tmp_path, db_url, moto, "aws_step_functions", keys) as (rig, wire):
        op_id = rig.submit(EXECUTION)
        op = await rig.step(op_id)
        arn = op.remote_job_id
        assert arn is not None and arn.endswith(f":{key_of(rig, op_id)}")
        wait_until(
            lambda: execution_status(moto, arn) == "SUCCEEDED",
            EXECUTION_SECONDS,
            "moto to run the state machine",
        )
        await rig.run(op_id, ["succeeded"])
        assert json.loads(rig.view(op_id)["result"]["data"]) == {"orderId": 42}
        # One start; the read that finds SUCCEEDED and the result read again.
        assert wire.calls == {"StartExecution": 1, "DescribeExecution": 2}


async def test_step_functions_cancel_stops_the_execution(
    tmp_path: Path, db_url: str, moto: Moto, deployed: Deployed
) -> None:
    keys = deployment("aws_step_functions", deployed, deployed.slow_machine)
    async with moto_rig(tmp_path, db_url, moto, "aws_step_functions", keys) as (rig, wire):
        op_id = rig.submit(EXECUTION)
        await rig.step(op_id)
        rig.advance_to_due(op_id)
        await rig.tick()
        assert rig.row(op_id).remote_state == "RUNNING"
        rig.cancel(op_id)
        op = await rig.run(op_id, ["cancelled"])
        assert op.remote_job_id is not None
        assert execution_status(moto, op.remote_job_id) == "ABORTED"
        assert wire.calls == {"StartExecution": 1, "DescribeExecution": 2, "StopExecution": 1}


async def test_step_functions_starts_once_per_name_and_a_lost_start_is_listed(
    tmp_path: Path, db_url: str, moto: Moto, deployed: Deployed
) -> None:
    keys = deployment("aws_step_functions", deployed)
    async with moto_rig(tmp_path, db_url, moto, "aws_step_functions", keys) as (rig, wire):
        # While the execution runs, the same start answers the same execution; once it
        # has ended, ExecutionAlreadyExists, and the listing finds it.
        adapter = rig.runtime.adapters["sim"]
        subject = Subject("op_direct", "idem_" + "7" * 32, "tr_direct")
        first = await adapter.create(EXECUTION, subject)
        again = await adapter.create(EXECUTION, subject)
        assert first.job_id is not None and again.job_id == first.job_id
        wait_until(
            lambda: execution_status(moto, str(first.job_id)) == "SUCCEEDED",
            EXECUTION_SECONDS,
            "moto to run the state machine",
        )
        late = await adapter.create(EXECUTION, subject)
        found = await adapter.lookup(subject)
        assert late.duplicate and (found.verdict, found.job_id) == (
            LookupVerdict.FOUND,
            first.job_id,
        )

        op_id = rig.submit(EXECUTION)
        wire.lose = "StartExecution"
        assert (await rig.step(op_id)).state == "create_unknown"
        await rig.run(op_id, ["observing"])
        key = key_of(rig, op_id)
        executions = moto.client("stepfunctions").list_executions(
            stateMachineArn=deployed.quick_machine
        )["executions"]
        assert [e["executionArn"] for e in executions if e["name"] == key] == [
            rig.row(op_id).remote_job_id
        ]
        assert wire.calls["StartExecution"] == 4  # three direct, one by the service


# --- Batch --------------------------------------------------------------------------------


async def test_batch_runs_a_job_and_a_lost_submit_is_found_by_its_name(
    tmp_path: Path, db_url: str, moto: Moto, deployed: Deployed
) -> None:
    keys = deployment("aws_batch", deployed)
    async with moto_rig(tmp_path, db_url, moto, "aws_batch", keys) as (rig, wire):
        op_id = rig.submit(BATCH_JOB)
        op = await rig.run(op_id, ["succeeded"])
        assert rig.view(op_id)["result"]["data"]["jobName"] == key_of(rig, op_id)
        assert wire.calls == {"SubmitJob": 1, "DescribeJobs": 2}

        lost = rig.submit(BATCH_JOB)
        wire.lose = "SubmitJob"
        assert (await rig.step(lost)).state == "create_unknown"
        op = await rig.run(lost, ["succeeded"])
        key = key_of(rig, lost)
        listed = moto.client("batch").list_jobs(
            jobQueue=deployed.queue, filters=[{"name": "JOB_NAME", "values": [key]}]
        )["jobSummaryList"]
        assert [j["jobId"] for j in listed] == [op.remote_job_id]
        assert (wire.calls["SubmitJob"], wire.calls["ListJobs"]) == (2, 1)


# --- the credential -----------------------------------------------------------------------


@pytest.mark.parametrize("preset", ["aws_transcribe", "aws_step_functions", "aws_batch"])
async def test_a_wrong_secret_is_authorization_denied_after_one_call(
    tmp_path: Path, db_url: str, moto: Moto, deployed: Deployed, preset: str
) -> None:
    request = {"aws_transcribe": MEDIA, "aws_step_functions": EXECUTION, "aws_batch": BATCH_JOB}
    keys = deployment(preset, deployed)
    secret = "not-the-secret-" + moto.secret[15:]
    async with moto_rig(tmp_path, db_url, moto, preset, keys, secret) as (rig, wire):
        op_id = rig.submit(request[preset])
        await rig.run(op_id, ["failed"])
        error = rig.view(op_id)["error"]
        assert error["code"] == "authorization_denied" and error["http_status"] == 403
        assert "SignatureDoesNotMatch" in json.dumps(error)
        assert moto.secret not in json.dumps(error) and secret not in json.dumps(error)
        assert sum(wire.calls.values()) == 1 and wire.statuses[0][1] == 403
