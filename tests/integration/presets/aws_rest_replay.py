"""Replays of the AWS REST-JSON job APIs (Batch, Bedrock batch inference), answered in
process for the AWS presets' contract tests; the shared base and what every replay
does are in ``aws_replay``.

REST-JSON: each operation has its own method and path, JSON bodies, errors
``{"message"}`` with the error type in ``x-amzn-ErrorType``. Batch answers an unknown job
id with an empty list; Bedrock answers it 404, and takes a job's ARN percent-encoded as
one path segment, as the AWS SDKs send it.
"""

from __future__ import annotations

import itertools
import re
from typing import Any
from urllib.parse import parse_qs, unquote

import httpx

from tests.integration.presets.aws_replay import ACCOUNT, REGION, AwsApi, now_epoch, rfc3339

QUEUE = "reconciler-queue"
QUEUE_ARN = f"arn:aws:batch:{REGION}:{ACCOUNT}:job-queue/{QUEUE}"
BATCH_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")
# Bedrock's patterns from its service model; AWS matches them against the whole value.
BEDROCK_NAME = re.compile(r"[a-zA-Z0-9]{1,63}(-*[a-zA-Z0-9\+\-\.]){0,63}")
BEDROCK_TOKEN = re.compile(r"[a-zA-Z0-9]{1,256}(-*[a-zA-Z0-9]){0,256}")
ROLE = re.compile(r"arn:aws(-[^:]+)?:iam::([0-9]{12})?:role/.+")
BEDROCK_JOB = re.compile(r"/model-invocation-job/([^/]+)(/stop)?")
PENDING_BATCH = ("SUBMITTED", "PENDING", "RUNNABLE")
DEFINITION_ARN = f"arn:aws:batch:{REGION}:{ACCOUNT}:job-definition"


class RestJsonApi(AwsApi):
    def ok(self, body: Any) -> httpx.Response:
        return httpx.Response(200, json=body, headers={"x-amzn-RequestId": "replay-request-id"})

    def error(self, status: int, kind: str, message: str) -> httpx.Response:
        headers = {"x-amzn-ErrorType": f"{kind}:http://internal.amazon.com/coral/"}
        return httpx.Response(status, json={"message": message}, headers=headers)


class BatchApi(RestJsonApi):
    """SubmitJob, DescribeJobs, ListJobs, TerminateJob on the one queue ``QUEUE``."""

    signing_name = "batch"

    ids = itertools.count(1)

    def handle(self, request: httpx.Request) -> httpx.Response:
        operation = request.url.path.removeprefix("/v1/")
        body = self.record(operation, request)
        refused = self.unsigned(request)
        if refused is not None:
            return refused
        route = getattr(self, "op_" + operation, None)
        if request.method != "POST" or route is None or not isinstance(body, dict):
            return self.error(404, "UnknownOperationException", f"no route {request.url.path}")
        answer: httpx.Response = route(body)
        return answer

    def client_error(self, message: str) -> httpx.Response:
        return self.error(400, "ClientException", message)

    def op_submitjob(self, body: dict[str, Any]) -> httpx.Response:
        name, queue = body.get("jobName"), body.get("jobQueue")
        for key in ("jobName", "jobQueue", "jobDefinition"):
            if not isinstance(body.get(key), str):
                return self.client_error(f"{key} is required")
        if queue not in (QUEUE, QUEUE_ARN):
            return self.client_error(f"Job queue {queue} does not exist")
        if not BATCH_NAME.fullmatch(str(name)):
            return self.client_error(f"Job name {name} is not valid")
        job_id = f"0b8f6a1c-0000-4000-8000-{next(self.ids):012d}"
        arn = f"arn:aws:batch:{REGION}:{ACCOUNT}:job/{job_id}"
        job = {
            "jobArn": arn,
            "jobName": name,
            "jobId": job_id,
            "jobQueue": QUEUE_ARN,
            "status": "SUBMITTED",
            "createdAt": int(now_epoch() * 1000),
            "jobDefinition": f"{DEFINITION_ARN}/{body['jobDefinition']}",
            "dependsOn": [],
            "parameters": body.get("parameters", {}),
        }
        self.made(job_id, job, body)
        return self.created(self.ok({"jobArn": arn, "jobName": name, "jobId": job_id}))

    def op_describejobs(self, body: dict[str, Any]) -> httpx.Response:
        wanted = body.get("jobs")
        if not isinstance(wanted, list) or not 1 <= len(wanted) <= 100:
            return self.client_error("jobs must list 1 to 100 job ids")
        found = [self.replay.read(str(i)) for i in wanted if str(i) in self.replay.jobs]
        return self.ok({"jobs": [j for j in found if j is not None]})

    def op_listjobs(self, body: dict[str, Any]) -> httpx.Response:
        if body.get("jobQueue") not in (QUEUE, QUEUE_ARN):
            return self.client_error("jobQueue, arrayJobId or multiNodeJobId is required")
        names = set()
        for rule in body.get("filters") or []:
            if rule.get("name") == "JOB_NAME":
                names |= {str(v).lower() for v in rule.get("values", [])}
        jobs = [
            j.body
            for j in reversed(self.replay.all_jobs())
            if (not names or j.body["jobName"].lower() in names) and self.visible(j.id)
        ]
        size, start = int(body.get("maxResults") or 100), int(body.get("nextToken") or 0)
        keys = ("jobArn", "jobId", "jobName", "createdAt", "status", "statusReason")
        page = [{k: j[k] for k in keys if k in j} for j in jobs[start : start + size]]
        answer: dict[str, Any] = {"jobSummaryList": page}
        if start + size < len(jobs):
            answer["nextToken"] = str(start + size)
        return self.ok(answer)

    def op_terminatejob(self, body: dict[str, Any]) -> httpx.Response:
        job_id, reason = str(body.get("jobId")), body.get("reason")
        if not isinstance(reason, str) or job_id not in self.replay.jobs:
            return self.client_error("jobId and reason are required")
        status = self.replay.peek(job_id)["status"]
        if status in PENDING_BATCH:
            ended = {"status": "FAILED", "isCancelled": True, "statusReason": reason}
            self.replay.set(job_id, {}, [ended])
        elif status in ("STARTING", "RUNNING"):
            # The container is stopped: one more read sees it running, then FAILED.
            ended = {"status": "FAILED", "isTerminated": True, "statusReason": reason}
            self.replay.set(job_id, {}, [{}, ended])
        return self.ok({})

    def other_jobs(self, count: int, name: str) -> None:
        """Jobs of other callers under another name, submitted after ours."""
        for n in range(count):
            job_id = f"other-{n}"
            body = {"jobId": job_id, "jobName": f"{name}-{n}", "status": "RUNNING"}
            self.replay.add(job_id, body, None, scripted=False)


def batch_succeeded() -> dict[str, Any]:
    return {
        "status": "SUCCEEDED",
        "startedAt": int(now_epoch() * 1000),
        "stoppedAt": int(now_epoch() * 1000),
        "container": {"exitCode": 0, "logStreamName": "reconciler/default/0b8f6a1c"},
        "attempts": [{"container": {"exitCode": 0}}],
    }


class BedrockApi(RestJsonApi):
    """CreateModelInvocationJob, GetModelInvocationJob, ListModelInvocationJobs and
    StopModelInvocationJob."""

    signing_name = "bedrock"

    ids = itertools.count(1)

    def handle(self, request: httpx.Request) -> httpx.Response:
        refused = self.unsigned(request)
        if refused is not None:
            self.record("unsigned", request)
            return refused
        path = request.url.raw_path.decode().split("?", 1)[0]
        if request.method == "POST" and path == "/model-invocation-job":
            return self.create(self.record("CreateModelInvocationJob", request))
        if request.method == "GET" and path == "/model-invocation-jobs":
            self.record("ListModelInvocationJobs", request)
            return self.listing(parse_qs(request.url.query.decode()))
        matched = BEDROCK_JOB.fullmatch(path)
        if matched is None:
            return self.error(404, "UnknownOperationException", f"no route {path}")
        stop = request.method == "POST" and matched.group(2) is not None
        self.record("StopModelInvocationJob" if stop else "GetModelInvocationJob", request)
        # An ARN is one segment: its ':' and '/' arrive percent-encoded.
        identifier = unquote(matched.group(1))
        job_id = next(
            (j.id for j in self.replay.all_jobs() if identifier in (j.id, j.body["jobArn"])), None
        )
        if job_id is None:
            return self.error(404, "ResourceNotFoundException", f"Job {identifier} not found")
        return self.stop(job_id) if stop else self.ok(self.replay.read(job_id))

    def validation(self, key: str, value: Any, pattern: str) -> httpx.Response:
        return self.error(
            400,
            "ValidationException",
            f"1 validation error detected: Value '{value}' at '{key}' failed to satisfy "
            f"constraint: Member must satisfy regular expression pattern: {pattern}",
        )

    def create(self, body: Any) -> httpx.Response:
        if not isinstance(body, dict):
            return self.error(400, "ValidationException", "the body is not a JSON object")
        name, token, role = body.get("jobName"), body.get("clientRequestToken"), body.get("roleArn")
        if not isinstance(name, str) or not BEDROCK_NAME.fullmatch(name):
            return self.validation("jobName", name, BEDROCK_NAME.pattern)
        if token is not None and not (isinstance(token, str) and BEDROCK_TOKEN.fullmatch(token)):
            return self.validation("clientRequestToken", token, BEDROCK_TOKEN.pattern)
        if not isinstance(role, str) or not ROLE.fullmatch(role):
            return self.validation("roleArn", role, ROLE.pattern)
        for key in ("modelId", "inputDataConfig", "outputDataConfig"):
            if key not in body:
                return self.error(400, "ValidationException", f"{key} is required")
        known = next(
            (j for j in self.replay.all_jobs() if token and j.body["clientRequestToken"] == token),
            None,
        )
        if known is not None:  # the token's job: a resend makes no second one
            return self.created(self.ok({"jobArn": known.body["jobArn"]}))
        if any(j.body["jobName"] == name for j in self.replay.all_jobs()):
            return self.error(400, "ConflictException", f"A job named {name} already exists")
        job_id = f"{next(self.ids):012d}"
        job = {
            "jobArn": f"arn:aws:bedrock:{REGION}:{ACCOUNT}:model-invocation-job/{job_id}",
            "jobName": name,
            "modelId": body["modelId"],
            "clientRequestToken": token,
            "roleArn": role,
            "status": "Submitted",
            "submitTime": rfc3339(),
            "inputDataConfig": body["inputDataConfig"],
            "outputDataConfig": body["outputDataConfig"],
            "timeoutDurationInHours": body.get("timeoutDurationInHours", 24),
        }
        self.made(job_id, job, body)
        return self.created(self.ok({"jobArn": job["jobArn"]}))

    def listing(self, query: dict[str, list[str]]) -> httpx.Response:
        contains = query.get("nameContains", [""])[0]
        size, start = (
            int(query.get("maxResults", ["100"])[0]),
            int(query.get("nextToken", ["0"])[0]),
        )
        jobs = [
            j.body
            for j in reversed(self.replay.all_jobs())
            if contains in j.body["jobName"] and self.visible(j.id)
        ]
        answer: dict[str, Any] = {"invocationJobSummaries": jobs[start : start + size]}
        if start + size < len(jobs):
            answer["nextToken"] = str(start + size)
        return self.ok(answer)

    def stop(self, job_id: str) -> httpx.Response:
        if self.replay.peek(job_id)["status"] not in (
            "Submitted",
            "Validating",
            "Scheduled",
            "InProgress",
        ):
            return self.error(400, "ValidationException", "the job cannot be stopped in its state")
        self.replay.set(
            job_id, {"status": "Stopping"}, [{}, {"status": "Stopped", "endTime": rfc3339()}]
        )
        return self.ok({})


def bedrock_ended(status: str, total: int = 100, errors: int = 0) -> dict[str, Any]:
    return {
        "status": status,
        "endTime": rfc3339(),
        "totalRecordCount": total,
        "processedRecordCount": total,
        "successRecordCount": total - errors,
        "errorRecordCount": errors,
    }
