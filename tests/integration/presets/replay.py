"""Replay servers for the preset contract tests, and the service wired to one preset.

A replay server is a small Starlette app on uvicorn (127.0.0.1) that answers with the
field names, state words and error shapes of one real API's reference. Its jobs move
through a script: every status read applies the next step of the job's script before
answering, so a test decides the sequence of states the service sees, and the order
of events comes from the reads themselves, never from sleeping. Webhooks are sent by
the test, to the URL the service gave (or configured), signed by an implementation
independent of the service (``standardwebhooks``, or HMAC by hand for GitHub).

``Replay`` records every request; ``drop_next_create`` makes the next create take
effect (the job exists) and then drops the connection before the answer.
"""

from __future__ import annotations

import base64
import copy
import itertools
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from unittest import mock

import httpx
from standardwebhooks import Webhook
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from reconciler.app import create_app
from reconciler.config import CallbackSettings, SchedulerSettings, ServerSettings, Settings
from reconciler.core.clock import SystemClock
from reconciler.demo.sim.responses import DroppedResponse
from reconciler.runtime import Runtime
from reconciler.storage.operations import load_operation
from tests.support import loopback
from tests.support.servers import HOST, serve_asgi, unused_port
from tests.support.stack import make_tokens, quiescent, worker_of
from tests.support.token_authority import TokenAuthority, service_account_file
from tests.support.waiting import wait_until

API_TOKEN = "replay-api-token"
WEBHOOK_SECRET = "whsec_" + base64.b64encode(b"replay-webhook-secret-0123456789").decode()
HMAC_SECRET = "replay-github-webhook-secret"
# Reads come fast, so a scripted sequence of states is walked within a second.
FAST_POLLING: dict[str, Any] = {
    "base_delay_seconds": 0.05,
    "max_delay_seconds": 0.2,
    "jitter_floor": 0.5,
    "deadline_seconds": 30,
    "max_status_requests": 40,
    "max_transport_failures": 3,
    "rate_limit_delay_seconds": 0.1,
}
# Reads come so rarely that within a test only a webhook hint can bring the next one.
SLOW_POLLING: dict[str, Any] = {
    **FAST_POLLING,
    "base_delay_seconds": 120,
    "max_delay_seconds": 120,
    "jitter_floor": 1.0,
    "deadline_seconds": 3600,
    "webhook_trust": "off",
}
FAST_CREATE: dict[str, Any] = {"timeout_seconds": 2, "create_deadline_seconds": 20}


@dataclass(frozen=True)
class Seen:
    """One request the replay server received."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any
    at: float  # wall-clock seconds when it arrived


@dataclass
class Job:
    id: str
    body: dict[str, Any]  # the resource as the API shows it
    request: Any  # the create request as received
    script: list[dict[str, Any]] = field(default_factory=list)


class Replay:
    """The replay server's memory: jobs, their scripts, files, requests, and faults."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.jobs: dict[str, Job] = {}
        self.files: dict[str, bytes] = {}
        self.seen: list[Seen] = []
        self.drop_next_create = False
        self.script: list[dict[str, Any]] = []  # given to the next job made
        self._ids = itertools.count(1)

    def new_id(self, prefix: str) -> str:
        return f"{prefix}{next(self._ids):06d}"

    async def record(self, request: Request) -> Any:
        raw = await request.body()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        seen = Seen(
            request.method,
            request.url.path,
            dict(request.query_params),
            {k.lower(): v for k, v in request.headers.items()},
            body,
            time.time(),
        )
        with self.lock:
            self.seen.append(seen)
        return body

    def add(self, job_id: str, body: dict[str, Any], request: Any, scripted: bool = True) -> Job:
        """A new job; it follows ``self.script`` unless ``scripted`` is false (other clients')."""
        with self.lock:
            script = [copy.deepcopy(s) for s in self.script] if scripted else []
            job = Job(job_id, body, request, script)
            self.jobs[job_id] = job
            return job

    def read(self, job_id: str) -> dict[str, Any] | None:
        """The job as one status read sees it: the next script step applied first."""
        with self.lock:
            job = self.jobs.get(job_id)
            if job is None:
                return None
            if job.script:
                merge(job.body, job.script.pop(0))
            return copy.deepcopy(job.body)

    def peek(self, job_id: str) -> dict[str, Any]:
        with self.lock:
            return copy.deepcopy(self.jobs[job_id].body)

    def set(
        self, job_id: str, patch: dict[str, Any], script: list[dict[str, Any]] | None = None
    ) -> None:
        """Change a job now (as the provider's own progress would), with a new script."""
        with self.lock:
            job = self.jobs[job_id]
            merge(job.body, patch)
            job.script = [copy.deepcopy(s) for s in script or []]

    def all_jobs(self) -> list[Job]:
        with self.lock:
            return list(self.jobs.values())

    def take_drop(self) -> bool:
        with self.lock:
            drop, self.drop_next_create = self.drop_next_create, False
            return drop

    def requests(self, method: str, path: str) -> list[Seen]:
        """Requests with this method whose path is ``path`` or, with a trailing ``*``, starts so."""
        with self.lock:
            seen = list(self.seen)
        if path.endswith("*"):
            return [s for s in seen if s.method == method and s.path.startswith(path[:-1])]
        return [s for s in seen if s.method == method and s.path == path]

    def only_job(self) -> Job:
        with self.lock:
            jobs = list(self.jobs.values())
        assert len(jobs) == 1, f"expected exactly one job at the provider, found {len(jobs)}"
        return jobs[0]


def merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    """Tables merged key by key; any other value replaces."""
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


def answer_created(replay: Replay, body: dict[str, Any], status: int = 200) -> Response:
    """The create's answer, or, when a drop is armed, a connection closed before it."""
    if replay.take_drop():
        return DroppedResponse()
    return JSONResponse(body, status_code=status)


def openai_error(
    status: int, message: str, kind: str = "invalid_request_error", param: str | None = None
) -> JSONResponse:
    """An error as the OpenAI APIs answer one."""
    body = {"error": {"message": message, "type": kind, "param": param, "code": None}}
    return JSONResponse(body, status_code=status)


def google_error(code: int, status: str, message: str) -> JSONResponse:
    """An error as Google's JSON APIs answer one (google.rpc.Status over HTTP)."""
    return JSONResponse(
        {"error": {"code": code, "message": message, "status": status}}, status_code=code
    )


def bearer_ok(request: Request) -> bool:
    return request.headers.get("authorization") == f"Bearer {API_TOKEN}"


def now_unix() -> int:
    return int(time.time())


def rfc3339_now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


# --- webhooks, signed independently of the service ---------------------------------------


def standard_webhook(secret: str, body: bytes, msg_id: str) -> dict[str, str]:
    """Standard Webhooks headers made by the ``standardwebhooks`` package."""
    at = datetime.now(UTC)
    signature = Webhook(secret).sign(msg_id, at, body.decode())
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": signature,
        "content-type": "application/json",
    }


def openai_event(kind: str, object_id: str, n: int) -> tuple[bytes, dict[str, str]]:
    """A thin OpenAI webhook event (``data.id`` only), signed: the body and its headers."""
    body = json.dumps(
        {
            "id": f"evt_{n}",
            "object": "event",
            "created_at": now_unix(),
            "type": kind,
            "data": {"id": object_id},
        }
    ).encode()
    return body, standard_webhook(WEBHOOK_SECRET, body, f"wh_{n}")


def post(url: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
    return loopback.post(url, content=body, headers=headers, timeout=10)


# --- the service, configured with one preset ---------------------------------------------


@dataclass
class PresetStack:
    url: str
    replay_url: str
    replay: Replay
    runtime: Runtime
    provider: str
    agent_token: str
    operator_token: str
    workers: list[Any]
    client: httpx.Client = field(init=False)

    def __post_init__(self) -> None:
        self.client = loopback.client(base_url=self.url, timeout=30.0)

    @property
    def webhook_url(self) -> str:
        return f"{self.url}/webhooks/{self.provider}"

    def headers(self, operator: bool = False) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.operator_token if operator else self.agent_token}"}

    def start(self, request: dict[str, Any], **fields: Any) -> str:
        body = {"provider": self.provider, "request": request, **fields}
        response = self.client.post("/v1/operations", json=body, headers=self.headers())
        assert response.status_code in (200, 202), response.text
        op_id: str = response.json()["id"]
        return op_id

    def submit(self, request: dict[str, Any]) -> httpx.Response:
        body = {"provider": self.provider, "request": request}
        return self.client.post("/v1/operations", json=body, headers=self.headers())

    def get(self, op_id: str) -> dict[str, Any]:
        response = self.client.get(f"/v1/operations/{op_id}", headers=self.headers(True))
        response.raise_for_status()
        op: dict[str, Any] = response.json()
        return op

    def cancel(self, op_id: str) -> dict[str, Any]:
        response = self.client.post(f"/v1/operations/{op_id}/cancel", headers=self.headers())
        assert response.status_code in (200, 202), response.text
        op: dict[str, Any] = response.json()
        return op

    def history(self, op_id: str) -> list[dict[str, Any]]:
        response = self.client.get(f"/v1/operations/{op_id}/history", headers=self.headers(True))
        response.raise_for_status()
        entries: list[dict[str, Any]] = response.json()["entries"]
        return entries

    def wait_for(
        self, op_id: str, check: Callable[[dict[str, Any]], bool], what: str, timeout: float = 20
    ) -> dict[str, Any]:
        """Poll the API (bounded) until ``check`` holds; the last Operation seen."""
        seen: dict[str, Any] = {}

        def holds() -> bool:
            seen.update(self.get(op_id))
            return check(seen)

        try:
            wait_until(holds, timeout, what)
        except AssertionError as exc:
            story = [(e["kind"], e["to"], e["cause"]) for e in self.history(op_id)]
            raise AssertionError(f"{exc}; last operation {seen}; history {story}") from None
        return seen

    def wait_state(self, op_id: str, *states: str, timeout: float = 20) -> dict[str, Any]:
        return self.wait_for(
            op_id, lambda op: op["state"] in states, f"state in {states}", timeout=timeout
        )

    def finish(self, op_id: str, timeout: float = 20) -> dict[str, Any]:
        """The Operation once it is done or escalated (bounded)."""
        return self.wait_for(
            op_id, lambda op: op["done"] or op["state"] == "escalated", "done", timeout=timeout
        )

    def cancel_when(self, op_id: str, remote_state: str, what: str) -> dict[str, Any]:
        """Cancel once a status read has seen ``remote_state``; the Operation once done."""
        self.wait_for(op_id, lambda op: op["remote_state"] == remote_state, what)
        self.cancel(op_id)
        return self.finish(op_id)

    def token(self, op_id: str) -> str:
        """The idempotency key the service sends the provider for this operation."""
        with self.runtime.db.read() as conn:
            op = load_operation(conn, op_id)
        return op.idempotency_token

    def jobs_with_key(self, op_id: str, table: str) -> list[Job]:
        """The provider's jobs whose create request carries this operation's key in ``table``."""
        key = self.token(op_id)
        return [
            j
            for j in self.replay.all_jobs()
            if j.request and j.request.get(table, {}).get("reconciler_key") == key
        ]

    def remote_job(self, op_id: str) -> str:
        op = self.wait_for(op_id, lambda op: bool(op["remote_job_id"]), "a remote job id")
        job: str = op["remote_job_id"]
        return job

    def settled(self, op_id: str, timeout: float = 20) -> None:
        wait_until(
            lambda: (
                all(w.in_flight == 0 for w in self.workers) and quiescent(self.runtime.db, op_id)
            ),
            timeout,
            "the workers to go idle with nothing due",
        )


@contextmanager
def preset_stack(
    tmp_path: Path,
    db_url: str,
    preset: str,
    replay_app: Callable[[Replay], Starlette],
    *,
    provider: str | None = None,
    overrides: dict[str, Any] | None = None,
    environ: dict[str, str] | None = None,
    base_path: str = "",
) -> Iterator[PresetStack]:
    """The service on loopback with ``[providers.NAME] preset = PRESET`` pointed at a replay.

    ``overrides`` are merged over the preset the way a deployment's file would be
    (table by table); ``base_url`` is the replay server's, plus ``base_path``.
    """
    name = provider or preset
    replay = Replay()
    with ExitStack() as stack:
        replay_url = stack.enter_context(serve_asgi(replay_app(replay)))
        port = unused_port()
        public = f"http://{HOST}:{port}"
        table: dict[str, Any] = {"preset": preset, "base_url": replay_url + base_path}
        merge(table, overrides or {})
        providers_dir = tmp_path / "no-provider-files"
        providers_dir.mkdir(exist_ok=True)
        settings = Settings(
            database_url=db_url,
            providers_dir=str(providers_dir),
            providers={name: table},
            server=ServerSettings(port=port, public_url=public, wait_max_seconds=10.0),
            scheduler=SchedulerSettings(tick_seconds=0.1, lease_seconds=10.0),
            callbacks=CallbackSettings(allow_hosts=("127.0.0.1",)),
        )
        runtime = Runtime.build(settings, environ=dict(environ or {}))
        agent, operator = make_tokens(runtime)
        app = create_app(runtime)
        url = stack.enter_context(serve_asgi(app, port=port))
        result = PresetStack(
            url, replay_url, replay, runtime, name, agent, operator, [worker_of(app)]
        )
        try:
            yield result
        finally:
            result.client.close()


def observed_states(history: list[dict[str, Any]]) -> list[str]:
    """The remote state words the service's status reads recorded, oldest first."""
    return [
        e["detail"]["remote_state"]
        for e in history
        if e["kind"] == "observation"
        and isinstance(e.get("detail"), dict)
        and "remote_state" in e["detail"]
    ]


def escalation(op: dict[str, Any]) -> dict[str, Any]:
    found = op.get("escalation")
    assert isinstance(found, dict), op
    return found


def option_actions(op: dict[str, Any]) -> list[str]:
    options = escalation(op)["options"]
    return [o["action"] if isinstance(o, dict) else str(o) for o in options]


def assert_create_unknown(s: PresetStack, op_id: str, create_path: str) -> dict[str, Any]:
    """A lost create the API cannot settle: one job made, never resent, escalated honestly."""
    op = s.finish(op_id)
    assert op["state"] == "escalated", op
    found = escalation(op)
    assert found["reason"] == "create_unknown", found
    assert sorted(option_actions(op)) == ["abandon", "resend"], found
    resend = next(o for o in found["options"] if o["action"] == "resend")
    assert "duplicate" in resend["description"].lower(), resend
    s.settled(op_id)
    # Counted once nothing can run: the service did not resend on its own.
    assert len(s.replay.requests("POST", create_path)) == 1
    assert len(s.replay.all_jobs()) == 1
    return op


@contextmanager
def google_credentials(tmp_path: Path) -> Iterator[None]:
    """Google Application Default Credentials that give the replay's token: a
    service-account file whose token endpoint (on loopback, checking the account's signed
    assertion) issues ``API_TOKEN``, named by ``GOOGLE_APPLICATION_CREDENTIALS`` while the
    block runs (google-auth reads the process's environment)."""
    authority = TokenAuthority(clock=SystemClock(), fixed_token=API_TOKEN)
    with serve_asgi(authority.google_app(), lifespan="off") as url:
        key_file = tmp_path / "service-account.json"
        authority.public_key = service_account_file(key_file, f"{url}/token")
        with mock.patch.dict(os.environ, {"GOOGLE_APPLICATION_CREDENTIALS": str(key_file)}):
            yield
