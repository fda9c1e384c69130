"""The simulated provider's HTTP contract answered in-process, for ``httpx.MockTransport``.

Step tests hand ``FakeProvider.handle`` to the runtime as its provider transport: the
real adapter renders real requests from the sim's ``sim.toml`` and parses
real responses, but nothing listens on a socket and nothing sleeps. Each endpoint
answers from a script when one is queued (a response, an exception to raise as the
transport's error, or a function of the request), else from the job's state, which
the test sets by hand (``finish``). Every request is recorded with the moment on the
test's clock at which it arrived.
"""

from __future__ import annotations

import errno
import hashlib
import json
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import parse_qs

import httpx

from reconciler.core.clock import Clock

BASE_URL = "http://provider.test"

Answer = httpx.Response | Exception | Callable[[httpx.Request], httpx.Response]


def answer(status: int, body: Any = None, headers: dict[str, str] | None = None) -> httpx.Response:
    """A JSON response (``body`` None: an empty body)."""
    if body is None:
        return httpx.Response(status, headers=headers)
    return httpx.Response(status, json=body, headers=headers)


def error(status: int, headers: dict[str, str] | None = None) -> httpx.Response:
    return answer(status, {"error": {"code": str(status), "message": "scripted"}}, headers)


def refused() -> httpx.ConnectError:
    """What httpx raises for a port nothing listens on (the request was never delivered)."""
    exc = httpx.ConnectError("All connection attempts failed")
    exc.__cause__ = ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")
    return exc


@dataclass
class Job:
    id: str
    key: str | None
    request: Any
    state: str = "queued"
    progress: Any = None
    error: Any = None
    document: Any = None  # the result document, once there is one
    visible: bool = True  # False: status reads answer 404, as a lagging index does
    extra: dict[str, Any] = field(default_factory=dict)  # more keys for the status body

    def result_bytes(self) -> bytes:
        return json.dumps(self.document, separators=(",", ":")).encode("utf-8")


@dataclass(frozen=True)
class Seen:
    endpoint: str  # create, lookup, status, cancel, result
    job_id: str | None
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    at: datetime


def result_document(rows: int = 3, failed: int = 0) -> dict[str, Any]:
    return {
        "rows": [{"n": i} for i in range(rows)],
        "summary": {"processed": rows, "failed": failed},
        "errors": [{"row": i, "message": "unreadable"} for i in range(failed)],
    }


class FakeProvider:
    """Jobs, scripts and a request log behind the paths of ``sim.toml``."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.jobs: dict[str, Job] = {}
        self.by_key: dict[str, str] = {}
        self.requests: list[Seen] = []
        self._scripts: dict[str, list[Answer]] = defaultdict(list)

    # --- what the test controls ----------------------------------------------------

    def script(self, endpoint: str, *answers: Answer) -> None:
        """Queue answers for the next requests to ``endpoint``; afterwards the default."""
        self._scripts[endpoint].extend(answers)

    def make_job(self, key: str | None, request: Any = None) -> Job:
        job = Job(f"job-{len(self.jobs) + 1}", key, request)
        self.jobs[job.id] = job
        if key is not None:
            self.by_key[key] = job.id
        return job

    def made_then(self, exc: Exception) -> Callable[[httpx.Request], httpx.Response]:
        """A create answer: the job is made, then the answer is lost (``exc`` is raised)."""

        def lost(request: httpx.Request) -> httpx.Response:
            self.make_job(request.headers.get("idempotency-key"), _json(request))
            raise exc

        return lost

    def finish(self, job_id: str, state: str = "succeeded", **values: Any) -> Job:
        job = self.jobs[job_id]
        job.state = state
        if state in ("succeeded", "completed_with_errors") and job.document is None:
            job.document = result_document(failed=1 if state == "completed_with_errors" else 0)
        for name, value in values.items():
            setattr(job, name, value)
        return job

    def usual(self, request: httpx.Request) -> httpx.Response:
        """The default answer, as a scripted one (to script what comes after it)."""
        endpoint, job_id = _route(request)
        return self._default(endpoint, job_id, request)

    def sent(self, endpoint: str, job_id: str | None = None) -> list[Seen]:
        return [
            r
            for r in self.requests
            if r.endpoint == endpoint and (job_id is None or r.job_id == job_id)
        ]

    # --- the transport ---------------------------------------------------------------

    def handle(self, request: httpx.Request) -> httpx.Response:
        endpoint, job_id = _route(request)
        self.requests.append(
            Seen(
                endpoint,
                job_id,
                request.method,
                request.url.path,
                dict(request.headers),
                request.content,
                self.clock.now(),
            )
        )
        script = self._scripts[endpoint]
        if script:
            scripted = script.pop(0)
            if isinstance(scripted, Exception):
                raise scripted
            if isinstance(scripted, httpx.Response):
                return scripted
            return scripted(request)
        return self._default(endpoint, job_id, request)

    def _default(self, endpoint: str, job_id: str | None, request: httpx.Request) -> httpx.Response:
        if endpoint == "create":
            key = request.headers.get("idempotency-key")
            known = self.by_key.get(key) if key else None
            job = self.jobs[known] if known else self.make_job(key, _json(request))
            return answer(202, {"job_id": job.id, "state": job.state})
        if endpoint == "lookup":
            key = parse_qs(request.url.query.decode()).get("idempotency_key", [""])[0]
            found = self.by_key.get(key)
            return answer(200, {"data": [{"job_id": found}] if found else []})
        job = self.jobs.get(job_id or "")
        if job is None or (endpoint == "status" and not job.visible):
            return error(404)
        if endpoint == "status":
            return answer(200, self.status_body(job))
        if endpoint == "cancel":
            if job.state in ("queued", "running"):
                job.state = "cancelling"
            return answer(202, {"job_id": job.id, "state": job.state})
        if job.document is None:
            return error(409)
        return httpx.Response(
            200, content=job.result_bytes(), headers={"content-type": "application/json"}
        )

    def status_body(self, job: Job) -> dict[str, Any]:
        body: dict[str, Any] = {"job_id": job.id, "state": job.state}
        if job.progress is not None:
            body["progress"] = job.progress
        if job.error is not None:
            body["error"] = job.error
        if job.document is not None:
            data = job.result_bytes()
            body["result"] = {
                "url": f"{BASE_URL}/v1/jobs/{job.id}/result",
                "sha256": hashlib.sha256(data).hexdigest(),
                "size": len(data),
            }
        body.update(job.extra)
        return body


def _json(request: httpx.Request) -> Any:
    try:
        return json.loads(request.content or b"null")
    except ValueError:
        return None


def _route(request: httpx.Request) -> tuple[str, str | None]:
    parts = [p for p in request.url.path.split("/") if p]
    if parts[:2] != ["v1", "jobs"]:
        raise AssertionError(f"no such provider path: {request.method} {request.url.path}")
    if len(parts) == 2:
        return ("create" if request.method == "POST" else "lookup"), None
    job_id = parts[2]
    if len(parts) == 3:
        return "status", job_id
    return parts[3], job_id
