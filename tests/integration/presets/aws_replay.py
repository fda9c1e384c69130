"""Replays of AWS job APIs for the AWS presets' contract tests, answered in process.

Each replay answers an ``httpx.Request`` (the step rig's ``httpx.MockTransport``) with the
operation names, field names, state words, HTTP statuses and error shapes of the API's
reference and of botocore's service model for it; a request the real API would refuse
(a missing required member, a name outside its pattern, a wrong content type or target)
is refused the same way, so a preset that sends the wrong shape fails its test. This
module holds the shared base and the two AWS JSON-protocol APIs (Transcribe, Step
Functions: ``POST /`` with ``X-Amz-Target``); ``aws_rest_replay`` the REST-JSON ones.

Jobs move through a script as in ``replay.py``: every status read applies the next step
of the job's script first. ``lose_next_create`` makes the next create take effect and
then fails its answer (a read timeout, after the request was delivered); ``hide_reads``
makes a new job unknown to that many reads by name or listings (a lagging index: AWS
documents ListExecutions as eventually consistent). Every request is counted by its
operation (``calls``), with its body and headers kept (``seen``).
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import httpx

from reconciler.commands.validation import check_provider_request, parse_create
from reconciler.core.errors import InvalidRequest
from reconciler.providers.loader import parse_provider
from tests.integration.presets.replay import Job, Replay, merge
from tests.support.aws_credentials import aws_credentials
from tests.support.steps import StepRig, step_rig

ACCOUNT = "123456789012"
REPLAY_KEY_ID = "AKIAREPLAYEXAMPLE000"
REPLAY_SECRET = "replay-secret-access-key-0000000000000000"
REGION = "us-east-1"
# TranscriptionJobName's pattern in the service model (an AWS pattern matches whole).
TRANSCRIBE_NAME = re.compile(r"[0-9a-zA-Z._-]{1,200}")


@dataclass(frozen=True)
class Call:
    operation: str
    body: Any
    headers: httpx.Headers
    raw_path: bytes


@dataclass
class AwsApi:
    """What every replayed AWS API keeps: its jobs, what it was sent, and the switches."""

    signing_name: ClassVar[str] = ""  # SigV4's name for the service
    base_url: str = "https://aws.replay.test"
    replay: Replay = field(default_factory=Replay)
    calls: Counter[str] = field(default_factory=Counter)
    seen: list[Call] = field(default_factory=list)
    lose_next_create: bool = False
    hide_reads: int = 0  # reads of a new job that answer "no such job" (a lagging index)
    hidden: dict[str, int] = field(default_factory=dict)

    def unsigned(self, request: httpx.Request) -> httpx.Response | None:
        """A 403 for a request not signed with SigV4 for this API's signing name and
        region (the signature itself is moto's to check), else None."""
        scope = f"/{REGION}/{self.signing_name}/aws4_request"
        auth = request.headers.get("authorization", "")
        if not auth.startswith("AWS4-HMAC-SHA256 Credential=") or scope not in auth.split(",")[0]:
            message = f"Credential should be scoped to correct service: '{self.signing_name}'."
            return httpx.Response(
                403, json={"__type": "InvalidSignatureException", "message": message}
            )
        if "x-amz-date" not in request.headers:
            return httpx.Response(403, json={"__type": "IncompleteSignatureException"})
        return None

    def record(self, operation: str, request: httpx.Request) -> Any:
        body = json.loads(request.content) if request.content else None
        self.calls[operation] += 1
        self.seen.append(Call(operation, body, request.headers, request.url.raw_path))
        return body

    def bodies(self, operation: str) -> list[Any]:
        return [c.body for c in self.seen if c.operation == operation]

    def made(self, job_id: str, body: dict[str, Any], request: Any) -> Job:
        job = self.replay.add(job_id, body, request)
        if self.hide_reads:
            self.hidden[job_id] = self.hide_reads
        return job

    def visible(self, job_id: str) -> bool:
        """Whether a read by name or a listing sees the job now (counts a hidden read)."""
        left = self.hidden.get(job_id, 0)
        if left:
            self.hidden[job_id] = left - 1
        return left == 0

    def created(self, answer: httpx.Response) -> httpx.Response:
        """The create's answer, or, when a loss is armed, a read timeout after the job is made."""
        if self.lose_next_create:
            self.lose_next_create = False
            raise httpx.ReadTimeout("the create's answer was lost after the job was made")
        return answer

    def job(self, job_id: str) -> Job:
        return self.replay.jobs[job_id]


def now_epoch() -> float:
    return round(time.time(), 3)


def rfc3339() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def aws_json(status: int, body: Any, content_type: str) -> httpx.Response:
    headers = {"Content-Type": content_type, "x-amzn-RequestId": "replay-request-id"}
    return httpx.Response(status, content=json.dumps(body).encode(), headers=headers)


class JsonProtocolApi(AwsApi):
    """An AWS JSON-protocol API: ``POST /``, ``X-Amz-Target: PREFIX.Operation``, a JSON body
    in ``application/x-amz-json-1.x``; errors are ``{"__type", "message"}``."""

    prefix = ""
    content_type = ""
    namespace = ""

    def handle(self, request: httpx.Request) -> httpx.Response:
        target = request.headers.get("x-amz-target", "")
        operation = target.removeprefix(self.prefix + ".")
        body = self.record(operation or "?", request)
        refused = self.unsigned(request)
        if refused is not None:
            return refused
        if (
            request.method != "POST"
            or request.url.path != "/"
            or not target.startswith(self.prefix)
        ):
            return self.error(400, "UnknownOperationException", f"no operation {target!r}")
        if request.headers.get("content-type") != self.content_type:
            return self.error(400, "SerializationException", "wrong content type")
        route = getattr(self, "op_" + operation, None)
        if route is None or not isinstance(body, dict):
            return self.error(400, "UnknownOperationException", f"no operation {target!r}")
        answer: httpx.Response = route(body)
        return answer

    def ok(self, body: Any) -> httpx.Response:
        return aws_json(200, body, self.content_type)

    def error(self, status: int, kind: str, message: str) -> httpx.Response:
        body = {"__type": f"{self.namespace}#{kind}", "message": message}
        return aws_json(status, body, self.content_type)


class TranscribeApi(JsonProtocolApi):
    """StartTranscriptionJob and GetTranscriptionJob (Transcribe's JSON 1.1 protocol)."""

    prefix = "Transcribe"
    signing_name = "transcribe"
    content_type = "application/x-amz-json-1.1"
    namespace = "com.amazonaws.transcribe"

    def op_StartTranscriptionJob(self, body: dict[str, Any]) -> httpx.Response:
        name = body.get("TranscriptionJobName")
        if not isinstance(name, str) or not TRANSCRIBE_NAME.fullmatch(name):
            return self.error(
                400,
                "BadRequestException",
                f"1 validation error detected: Value '{name}' at 'transcriptionJobName' "
                "failed to satisfy constraint: Member must satisfy regular expression "
                "pattern: ^[0-9a-zA-Z._-]+",
            )
        if not isinstance(body.get("Media"), dict) or "MediaFileUri" not in body["Media"]:
            return self.error(400, "BadRequestException", "Media.MediaFileUri is required")
        if name in self.replay.jobs:
            return self.error(
                400,
                "ConflictException",
                "The requested job name already exists. Use a different job name.",
            )
        job = {
            "TranscriptionJobName": name,
            "TranscriptionJobStatus": "IN_PROGRESS",
            "LanguageCode": body.get("LanguageCode"),
            "Media": body["Media"],
            "CreationTime": now_epoch(),
            "StartTime": now_epoch(),
        }
        self.made(name, job, body)
        return self.created(self.ok({"TranscriptionJob": job}))

    def op_GetTranscriptionJob(self, body: dict[str, Any]) -> httpx.Response:
        name = str(body.get("TranscriptionJobName"))
        found = self.replay.read(name) if name in self.replay.jobs and self.visible(name) else None
        if found is None:
            return self.error(
                400,
                "BadRequestException",
                "The requested job couldn't be found. Check the job name and try your "
                "request again.",
            )
        return self.ok({"TranscriptionJob": found})


def completed_transcript(name: str) -> dict[str, Any]:
    """What a COMPLETED job adds: its transcript's location in the request's bucket."""
    return {
        "TranscriptionJobStatus": "COMPLETED",
        "CompletionTime": now_epoch(),
        "Transcript": {"TranscriptFileUri": f"s3://transcripts-out/{name}.json"},
    }


MACHINE = "order-pipeline"
MACHINE_ARN = f"arn:aws:states:{REGION}:{ACCOUNT}:stateMachine:{MACHINE}"


class StepFunctionsApi(JsonProtocolApi):
    """StartExecution, DescribeExecution, ListExecutions, StopExecution (JSON 1.0) of the
    one Standard state machine ``MACHINE_ARN``."""

    prefix = "AWSStepFunctions"
    signing_name = "states"
    content_type = "application/x-amz-json-1.0"
    namespace = "com.amazonaws.swf.service.v2.model"

    def op_StartExecution(self, body: dict[str, Any]) -> httpx.Response:
        machine, name, given = body.get("stateMachineArn"), body.get("name"), body.get("input")
        if machine is None:
            return self.error(
                400,
                "ValidationException",
                "1 validation error detected: Value null at 'stateMachineArn' failed to "
                "satisfy constraint: Member must not be null",
            )
        if machine != MACHINE_ARN:
            return self.error(
                400, "StateMachineDoesNotExist", f"State Machine Does Not Exist: '{machine}'"
            )
        if not isinstance(name, str) or not 1 <= len(name) <= 80:
            return self.error(400, "InvalidName", f"Invalid Name: '{name}'")
        given = "{}" if given is None else given
        try:
            json.loads(given)
        except (TypeError, ValueError):
            return self.error(400, "InvalidExecutionInput", "Invalid State Machine Execution Input")
        arn = f"arn:aws:states:{REGION}:{ACCOUNT}:execution:{MACHINE}:{name}"
        known = self.replay.jobs.get(arn)
        if known is not None:
            # Idempotent on the name while it runs with the same input; else refused.
            if known.body["status"] == "RUNNING" and known.body["input"] == given:
                return self.ok({"executionArn": arn, "startDate": known.body["startDate"]})
            return self.error(400, "ExecutionAlreadyExists", f"Execution Already Exists: '{arn}'")
        execution = {
            "executionArn": arn,
            "stateMachineArn": machine,
            "name": name,
            "status": "RUNNING",
            "startDate": now_epoch(),
            "input": given,
        }
        self.made(arn, execution, body)
        return self.created(self.ok({"executionArn": arn, "startDate": execution["startDate"]}))

    def op_DescribeExecution(self, body: dict[str, Any]) -> httpx.Response:
        arn = str(body.get("executionArn"))
        found = self.replay.read(arn) if arn in self.replay.jobs else None
        if found is None:
            return self.error(400, "ExecutionDoesNotExist", f"Execution Does Not Exist: '{arn}'")
        return self.ok(found)

    def op_ListExecutions(self, body: dict[str, Any]) -> httpx.Response:
        if body.get("stateMachineArn") != MACHINE_ARN:
            return self.error(
                400,
                "ValidationException",
                "1 validation error detected: Value null at 'stateMachineArn' failed to "
                "satisfy constraint: Member must not be null",
            )
        size = int(body.get("maxResults") or 100)
        start = int(body.get("nextToken") or 0)
        newest_first = [j.body for j in reversed(self.replay.all_jobs()) if self.visible(j.id)]
        keys = ("executionArn", "stateMachineArn", "name", "status", "startDate", "stopDate")
        page = [{k: e[k] for k in keys if k in e} for e in newest_first[start : start + size]]
        answer: dict[str, Any] = {"executions": page}
        if start + size < len(newest_first):
            answer["nextToken"] = str(start + size)
        return self.ok(answer)

    def op_StopExecution(self, body: dict[str, Any]) -> httpx.Response:
        arn = str(body.get("executionArn"))
        if arn not in self.replay.jobs:
            return self.error(400, "ExecutionDoesNotExist", f"Execution Does Not Exist: '{arn}'")
        stopped = {"status": "ABORTED", "stopDate": now_epoch()}
        if self.replay.peek(arn)["status"] == "RUNNING":
            self.replay.set(arn, stopped)
        return self.ok({"stopDate": stopped["stopDate"]})

    def other_executions(self, count: int) -> None:
        """Executions of other callers, started after ours (they list before it)."""
        for n in range(count):
            name = f"someone-else-{n}"
            arn = f"arn:aws:states:{REGION}:{ACCOUNT}:execution:{MACHINE}:{name}"
            body = {"executionArn": arn, "stateMachineArn": MACHINE_ARN, "name": name}
            self.replay.add(
                arn, {**body, "status": "RUNNING", "startDate": now_epoch()}, None, scripted=False
            )


@asynccontextmanager
async def aws_rig(
    tmp_path: Path, db_url: str, preset: str, api: AwsApi, deployment: dict[str, Any]
) -> AsyncIterator[StepRig]:
    """The step rig with provider ``sim`` = ``preset`` as a deployment writes it
    (``deployment``, merged over the preset), its calls answered by ``api``.

    The calls are signed with a key pair of the replay's from the environment; the
    replay checks that each is signed for its signing name and region, not the signature
    itself (the moto tests do).
    """
    table: dict[str, Any] = {"preset": preset, "base_url": api.base_url}
    merge(table, deployment)
    with aws_credentials(REPLAY_KEY_ID, REPLAY_SECRET) as environ:
        async with step_rig(
            tmp_path, db_url, table=table, handler=api.handle, environ=environ
        ) as rig:
            yield rig


def refusal(preset: str, deployment: dict[str, Any], request: Any) -> str | None:
    """Why intake refuses ``request`` for ``preset`` as deployed (its request_schema and
    create.set), or None when it takes it."""
    table: dict[str, Any] = {"preset": preset, "auth": {"type": "none"}}
    merge(table, deployment)
    spec = parse_provider("p", table, "test")
    try:
        req = parse_create({"provider": "p", "request": request}, {"p": spec}, str)
        check_provider_request(req.request, spec)
    except InvalidRequest as exc:
        return str(exc)
    return None


def states_seen(rig: StepRig, op_id: str) -> list[str]:
    """The remote state words the status reads recorded, oldest first."""
    return [
        e.detail["remote_state"]
        for e in rig.history(op_id)
        if e.kind == "observation" and isinstance(e.detail, dict) and "remote_state" in e.detail
    ]
