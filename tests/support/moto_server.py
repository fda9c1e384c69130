"""moto in server mode on loopback with its signature checks on, for the AWS presets' tests.

``moto_server -H 127.0.0.1 -p PORT`` runs as a process of its own (one per test module),
started with ``INITIAL_NO_AUTH_ACTION_COUNT=3``: its first three AWS actions need no
signature, and they make an IAM user, its access key and a policy that allows it
everything; from then on every request must carry a valid SigV4 signature by that key
(a wrong secret is answered 403 SignatureDoesNotMatch, a key moto does not know 403
InvalidClientTokenId). moto's own API (``/moto-api/``) is not an AWS action: through it
Step Functions executions run their state machine (``execute_state_machine``) and Batch
jobs run without Docker (they succeed as they are submitted). Transcribe jobs advance one
state per GetTranscriptionJob, moto's default. It is stopped by its PID.

``AwsWire`` is the service's transport to it: real HTTP, each request counted by its
operation, one answer lost on demand (the request reaches moto and takes effect; the
service sees a read timeout), and moto's Batch answers, which it labels ``text/html``,
labelled ``application/json`` as AWS labels them (the body is not touched).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.support import loopback
from tests.support.servers import HOST, unused_port
from tests.support.waiting import wait_until

REGION = "us-east-1"
# The actions that need no signature: CreateUser, CreateAccessKey, PutUserPolicy.
UNSIGNED_ACTIONS = 3
START_TIMEOUT_SECONDS = 60.0
ALLOW_ALL = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}],
}
BATCH_PATHS = {
    "/v1/submitjob": "SubmitJob",
    "/v1/describejobs": "DescribeJobs",
    "/v1/listjobs": "ListJobs",
    "/v1/terminatejob": "TerminateJob",
}


class MotoUnavailable(RuntimeError):
    """moto[server] is not installed in this environment."""


@dataclass(frozen=True)
class Moto:
    url: str
    pid: int
    key_id: str
    secret: str
    log: Path

    def client(self, service: str, secret: str | None = None) -> Any:
        """A boto3 client signed with the IAM user's key (for setting up and for checking
        what moto holds, never for the calls under test)."""
        import boto3

        return boto3.client(
            service,
            endpoint_url=self.url,
            region_name=REGION,
            aws_access_key_id=self.key_id,
            aws_secret_access_key=secret or self.secret,
        )


def moto_executable() -> Path:
    found = Path(sys.executable).parent / "moto_server"
    if not found.exists():
        raise MotoUnavailable('moto_server is not installed (pip install -e ".[test]")')
    return found


@contextmanager
def moto_server(log_dir: Path) -> Iterator[Moto]:
    """moto on a free loopback port, its signature checks on and an IAM user's key made."""
    executable = moto_executable()
    port = unused_port()
    url = f"http://{HOST}:{port}"
    log = log_dir / "moto.log"
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(UNSIGNED_ACTIONS)}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(executable), "-H", HOST, "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        wait_until(lambda: _up(proc, url, log), START_TIMEOUT_SECONDS, "moto_server to answer")
        config = {"stepfunctions": {"execute_state_machine": True}, "batch": {"use_docker": False}}
        loopback.post(f"{url}/moto-api/config", json=config, timeout=10).raise_for_status()
        key_id, secret = _iam_user(url)
        yield Moto(url, proc.pid, key_id, secret, log)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _up(proc: subprocess.Popen[bytes], url: str, log: Path) -> bool:
    if proc.poll() is not None:
        tail = log.read_text("utf-8", "replace")[-2000:]
        raise AssertionError(f"moto_server exited with {proc.returncode}: {tail}")
    try:
        return loopback.get(f"{url}/moto-api/", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def _iam_user(url: str) -> tuple[str, str]:
    """The three unsigned actions: a user, its key, a policy allowing it every action."""
    import boto3

    iam = boto3.client(
        "iam",
        endpoint_url=url,
        region_name=REGION,
        aws_access_key_id="bootstrap",
        aws_secret_access_key="bootstrap",
    )
    iam.create_user(UserName="reconciler")
    key = iam.create_access_key(UserName="reconciler")["AccessKey"]
    iam.put_user_policy(
        UserName="reconciler", PolicyName="everything", PolicyDocument=json.dumps(ALLOW_ALL)
    )
    return str(key["AccessKeyId"]), str(key["SecretAccessKey"])


def operation_of(request: httpx.Request) -> str:
    """The AWS operation a request is: its X-Amz-Target's, or its REST path's."""
    target = request.headers.get("x-amz-target")
    if target:
        return target.split(".", 1)[-1]
    return BATCH_PATHS.get(request.url.path, f"{request.method} {request.url.path}")


class AwsWire(httpx.AsyncBaseTransport):
    """Real HTTP to moto, counted by operation; ``lose`` drops the next answer to it."""

    def __init__(self) -> None:
        self._inner = httpx.AsyncHTTPTransport()
        self.calls: Counter[str] = Counter()
        self.statuses: list[tuple[str, int]] = []
        self.authorizations: list[str] = []  # each request's Authorization header, as sent
        self.lose: str | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        operation = operation_of(request)
        self.calls[operation] += 1
        self.authorizations.append(request.headers.get("authorization", ""))
        response = await self._inner.handle_async_request(request)
        content = await response.aread()
        await response.aclose()
        self.statuses.append((operation, response.status_code))
        if self.lose == operation:
            self.lose = None
            raise httpx.ReadTimeout("the answer was lost after moto took the request")
        headers = httpx.Headers(response.headers)
        if request.url.path in BATCH_PATHS and "text/html" in headers.get("content-type", ""):
            headers["content-type"] = "application/json"
        headers.pop("content-encoding", None)  # aread() decoded the body
        headers["content-length"] = str(len(content))
        return httpx.Response(response.status_code, headers=headers, content=content)

    async def aclose(self) -> None:
        await self._inner.aclose()
