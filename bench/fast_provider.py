"""The throughput bench's provider: the simulated provider's wire, none of its chaos, fast.

    python bench/fast_provider.py --port N --token T --webhook-secret whsec_...
        [--webhook-url URL] [--server protocol|starlette]

It answers the calls of the simulated provider's file (``reconciler/demo/sim/sim.toml``,
the file the bench gives the service) the way ``python -m reconciler.demo.sim`` does:

* ``POST /v1/jobs`` (``Idempotency-Key`` required, bearer token checked) → 202
  ``{job_id, state: "queued", status_url}`` and ``Location``; the same key and body
  again → the same job, another body → 409. The body's ``duration`` (s, default 1),
  ``webhooks`` (``"never"``: none) and ``total`` (items, default 100) are read; other
  keys are the caller's payload.
* ``GET /v1/jobs?idempotency_key=K`` → ``{"data": [{job_id, state, created_at}]}``.
* ``GET /v1/jobs/{id}`` → ``{job_id, state, progress, created_at, updated_at}``:
  ``running`` until ``duration`` has passed, then ``succeeded`` with ``result: {url,
  sha256, size}`` of the document below.
* ``GET /v1/jobs/{id}/result`` → the sim's result document (``{job_id, rows, summary,
  errors}``, sorted keys, compact), 409 ``not_ready`` before.
* ``duration`` s after the create, one ``job.succeeded`` event to ``--webhook-url``,
  signed by the sim's own signer (``reconciler.demo.sim.signing``) with the sim's
  headers and body; a failed delivery is tried again after 0.5 s and 1 s, as the sim does.
* ``GET /_fast/stats`` (no token) → jobs created, webhooks sent and failed, and the
  attempts answered otherwise by status (``refused``: a 503, a 404).

``--server protocol`` (the default) serves it on ``bench/fast_http.py``, one
asyncio.Protocol over httptools on uvloop; ``--server starlette``, the same handler as
one Starlette route on uvicorn (``--http httptools --loop uvloop``), to compare: the
bench's provider ceiling picks the first (see ``bench/throughput.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import hashlib
import hmac
import json
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httptools

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
for _path in (str(ROOT / "service"), str(ROOT)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from bench.fast_http import (  # noqa: E402
    Answer,
    Poster,
    Request,
    run,
    run_on_starlette,
    start_server,
)

from reconciler.demo.sim.signing import sign  # noqa: E402
from reconciler.demo.sim.timeutil import rfc3339  # noqa: E402

RETRY_DELAYS = (0.5, 1.0)  # the sim's: three attempts, 0.5 s doubling
WEBHOOK_CONNECTIONS = 32
WEBHOOK_TIMEOUT = 5.0  # the sim's


def _json(doc: Any, status: int = 200, headers: list[tuple[str, str]] | None = None) -> Answer:
    return Answer(status, json.dumps(doc, separators=(",", ":")).encode(), headers=headers or [])


def _error(status: int, code: str, message: str, **extra: Any) -> Answer:
    return _json({"error": {"code": code, "message": message, **extra}}, status)


@dataclass
class Job:
    job_id: str
    key: str
    fingerprint: str
    created_at: float  # epoch seconds
    due: float  # time.monotonic() when it succeeds
    total: int
    finished_at: float | None = None
    document: bytes = b""
    digest: str = ""

    def state(self, now: float) -> str:
        if self.finished_at is None and now >= self.due:
            self.finish()
        return "running" if self.finished_at is None else "succeeded"

    def finish(self) -> None:
        if self.finished_at is not None:
            return
        self.finished_at = time.time()
        self.document = result_document(self.job_id, self.total)
        self.digest = hashlib.sha256(self.document).hexdigest()


@functools.cache
def _rows(total: int) -> str:
    rows = [{"item": f"item-{i:05d}", "status": "ok"} for i in range(total)][:1000]
    return json.dumps(rows, sort_keys=True, separators=(",", ":"))


def result_document(job_id: str, total: int) -> bytes:
    """The sim's result document of a job that succeeded, byte for byte (sorted keys,
    compact), with the rows made once per ``total``."""
    return (
        f'{{"errors":[],"job_id":{json.dumps(job_id)},"rows":{_rows(total)},'
        f'"summary":{{"failed":0,"processed":{total}}}}}'
    ).encode()


class Provider:
    def __init__(self, token: str, webhook_url: str | None, secret: str) -> None:
        self.token = ("Bearer " + token).encode()
        self.secret = secret
        self.jobs: dict[str, Job] = {}
        self.keys: dict[str, str] = {}
        self.sent = self.failed = 0
        self.refused: dict[str, int] = {}  # webhook attempts answered otherwise, by status
        self.webhook = urlsplit(webhook_url) if webhook_url else None
        self.poster: Poster | None = None

    def __call__(self, request: Request) -> Answer:
        path = request.path
        if path == "/_fast/stats":
            return _json(
                {
                    "jobs": len(self.jobs),
                    "webhooks_sent": self.sent,
                    "failed": self.failed,
                    "refused": self.refused,
                }
            )
        given = request.headers.get("authorization", "").encode("latin-1")
        if not hmac.compare_digest(given, self.token):
            return _error(401, "unauthorized", "missing or wrong bearer token")
        parts = path.split("/")  # "", "v1", "jobs", id, "result"
        if parts[:3] != ["", "v1", "jobs"]:
            return _error(404, "not_found", f"no route {path}")
        if len(parts) == 3:
            if request.method == "POST":
                return self.create(request)
            return self.lookup(request)
        job = self.jobs.get(parts[3])
        if job is None:
            return _error(404, "not_found", f"no job {parts[3]}")
        if len(parts) == 4 and request.method == "GET":
            return self.status(request, job)
        if parts[4:] == ["result"] and request.method == "GET":
            return self.result(job)
        return _error(404, "not_found", f"no route {request.method} {path}")

    def create(self, request: Request) -> Answer:
        key = request.headers.get("idempotency-key")
        if not key:
            return _error(400, "bad_request", "Idempotency-Key header is required")
        try:
            body = json.loads(request.body)
        except (ValueError, UnicodeDecodeError):
            body = None
        if not isinstance(body, dict):
            return _error(400, "bad_request", "the body must be a JSON object")
        fingerprint = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        known = self.keys.get(key)
        if known is not None:
            job = self.jobs[known]
            if job.fingerprint != fingerprint:
                message = "Idempotency-Key was already used with a different request body"
                return _error(409, "idempotency_key_reused", message)
            return self.accepted(job)
        try:
            duration, total = float(body.get("duration", 1.0)), int(body.get("total", 100))
        except (TypeError, ValueError):
            return _error(422, "invalid_scenario", "duration and total must be numbers")
        job = Job(
            f"job_{uuid.uuid4().hex[:16]}",
            key,
            fingerprint,
            time.time(),
            time.monotonic() + duration,
            total,
        )
        self.jobs[job.job_id] = job
        self.keys[key] = job.job_id
        if self.webhook is not None and body.get("webhooks") != "never":
            loop = asyncio.get_running_loop()
            loop.call_later(max(0.0, duration), self.succeed, job)
        return self.accepted(job)

    def accepted(self, job: Job) -> Answer:
        url = f"/v1/jobs/{job.job_id}"
        body = {"job_id": job.job_id, "state": "queued", "status_url": url}
        return _json(body, 202, [("location", url)])

    def lookup(self, request: Request) -> Answer:
        key = (parse_qs(request.query).get("idempotency_key") or [""])[0]
        if not key:
            return _error(400, "bad_request", "idempotency_key query parameter is required")
        job = self.jobs.get(self.keys.get(key, ""))
        now = time.monotonic()
        data = [] if job is None else [_brief(job, now)]
        return _json({"data": data})

    def status(self, request: Request, job: Job) -> Answer:
        state = job.state(time.monotonic())
        body: dict[str, Any] = {
            "job_id": job.job_id,
            "state": state,
            "progress": {"completed": job.total if job.finished_at else 0, "total": job.total},
            "created_at": rfc3339(job.created_at),
            "updated_at": rfc3339(job.finished_at or job.created_at),
        }
        if job.finished_at is not None:
            host = request.headers.get("host", "127.0.0.1")
            url = f"http://{host}/v1/jobs/{job.job_id}/result"
            body["result"] = {"url": url, "sha256": job.digest, "size": len(job.document)}
        return _json(body)

    def result(self, job: Job) -> Answer:
        state = job.state(time.monotonic())
        if job.finished_at is None:
            return _error(409, "not_ready", f"no result while the job is {state}", state=state)
        return Answer(200, job.document)

    # --- the webhook --------------------------------------------------------------------

    def succeed(self, job: Job) -> None:
        job.finish()
        event_id = f"evt_{uuid.uuid4().hex[:16]}"
        doc = {
            "type": "job.succeeded",
            "id": event_id,
            "timestamp": rfc3339(job.finished_at or time.time()),
            "data": {"job_id": job.job_id, "state": "succeeded"},
        }
        body = json.dumps(doc, separators=(",", ":")).encode()
        asyncio.get_running_loop().create_task(self.deliver(event_id, body))

    async def deliver(self, event_id: str, body: bytes) -> None:
        assert self.webhook is not None
        if self.poster is None:
            host, port = self.webhook.hostname or "127.0.0.1", self.webhook.port or 80
            self.poster = Poster(host, port, WEBHOOK_CONNECTIONS)
        target = self.webhook.path or "/"
        for delay in (*RETRY_DELAYS, None):
            timestamp = int(time.time())
            headers = {
                "content-type": "application/json",
                "webhook-id": event_id,
                "webhook-timestamp": str(timestamp),
                "webhook-signature": sign(self.secret, event_id, timestamp, body),
            }
            try:
                async with asyncio.timeout(WEBHOOK_TIMEOUT):
                    status = await self.poster.post(target, headers, body)
            except (OSError, EOFError, TimeoutError, httptools.HttpParserError):
                status = 0  # as the sim does, an attempt that got no answer is tried again
            if 200 <= status < 300:
                self.sent += 1
                return
            self.refused[str(status)] = self.refused.get(str(status), 0) + 1
            if delay is None:
                break
            await asyncio.sleep(delay)
        self.failed += 1


def _brief(job: Job, now: float) -> dict[str, Any]:
    return {"job_id": job.job_id, "state": job.state(now), "created_at": rfc3339(job.created_at)}


async def serve_protocol(provider: Provider, port: int) -> None:
    server = await start_server(provider, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--webhook-secret", required=True)
    parser.add_argument("--webhook-url", default=None)
    parser.add_argument("--server", choices=("protocol", "starlette"), default="protocol")
    args = parser.parse_args()
    provider = Provider(args.token, args.webhook_url, args.webhook_secret)
    if args.server == "starlette":
        run_on_starlette(provider, args.port)
    else:
        run(lambda: serve_protocol(provider, args.port))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
