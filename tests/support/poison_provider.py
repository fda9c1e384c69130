"""A provider on loopback whose answers are poison when asked: fault tests and bench/poison.py.

The agent's request names the poison (``{"poison": NAME}``); any other request is a
healthy job that runs ``duration`` seconds and succeeds with a JSON Lines result. The
answers are written as raw JSON text, so an escape such as ``\\u0000`` or ``\\ud800``
reaches the service exactly as a provider would send it. Poisons:

- ``userinfo``: succeeded, with a result URL that carries user info (``user:pw@``);
- ``error_text``: failed, with an error message holding a NUL and a lone surrogate;
- ``state_surrogate`` / ``state_nul``: a state word holding a lone surrogate / a NUL;
- ``errors_ref``: succeeded, with an errors file reference holding a NUL;
- ``raise``: succeeded, with a result reference on which ``PoisonAdapter`` (the provider
  file's ``adapter``) raises: a step failure nothing in the service foresaw, in result
  collection (the step whose fetch budget is never reached when the fetch raises);
- ``raise_status``: the state word ``poisoned``, on which ``PoisonAdapter`` raises in the
  status read.

Every request is counted per endpoint and job (``counts``), from the provider's side.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from reconciler.core.provider_calls import CallResult
from reconciler.providers.adapter import StatusOutcome, Subject
from reconciler.providers.http_adapter import HttpAdapter
from tests.support.process import toml_value

POISONS = (
    "userinfo",
    "error_text",
    "state_surrogate",
    "state_nul",
    "errors_ref",
    "raise",
    "raise_status",
)
POISONED_WORD = "poisoned"  # the state word PoisonAdapter raises on
POISONED_RESULT = "poisoned-result"  # the result reference PoisonAdapter raises on
SECRET_WORD = "sk-poison-never-shown"  # in the raised message: it must reach no record
ADAPTER = "tests.support.poison_provider:PoisonAdapter"


@dataclass
class _Job:
    id: str
    poison: str | None
    duration: float
    started: float


class PoisonProvider:
    """The provider's state and its Starlette app (``app``); thread-safe counters."""

    def __init__(self) -> None:
        self.jobs: dict[str, _Job] = {}
        self.counts: Counter[tuple[str, str]] = Counter()
        self.base_url = ""  # set once served: result URLs point back here
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.app = Starlette(
            routes=[
                Route("/v1/jobs", self._create, methods=["POST"]),
                Route("/v1/jobs/{job_id}", self._status, methods=["GET"]),
                Route("/v1/jobs/{job_id}/result", self._result, methods=["GET"]),
                Route("/v1/jobs/{job_id}/errors/{ref:path}", self._errors, methods=["GET"]),
                Route("/v1/jobs/{job_id}/cancel", self._cancel, methods=["POST"]),
            ]
        )

    def count(self, endpoint: str, job_id: str | None = None) -> int:
        with self._lock:
            if job_id is not None:
                return self.counts[(endpoint, job_id)]
            return sum(n for (e, _), n in self.counts.items() if e == endpoint)

    def of_job(self, job_id: str) -> int:
        """Every request the job's operation sent after its create."""
        with self._lock:
            return sum(n for (e, j), n in self.counts.items() if j == job_id and e != "create")

    def total(self) -> int:
        with self._lock:
            return sum(self.counts.values())

    def _seen(self, endpoint: str, job_id: str) -> None:
        with self._lock:
            self.counts[(endpoint, job_id)] += 1

    async def _create(self, request: Request) -> Response:
        body = json.loads(await request.body() or b"{}")
        poison = body.get("poison")
        job = _Job(
            f"job_{next(self._ids)}",
            poison if poison in POISONS else None,
            float(body.get("duration", 0.2)),
            time.monotonic(),
        )
        with self._lock:
            self.jobs[job.id] = job
        self._seen("create", job.id)
        return JSONResponse({"job_id": job.id, "state": "queued"}, status_code=201)

    def _job(self, request: Request) -> _Job | None:
        return self.jobs.get(request.path_params["job_id"])

    async def _status(self, request: Request) -> Response:
        job = self._job(request)
        if job is None:
            return JSONResponse({"error": {"message": "no such job"}}, status_code=404)
        self._seen("status", job.id)
        return Response(self.status_text(job), media_type="application/json")

    def status_text(self, job: _Job) -> str:
        """The status answer as raw JSON text (escapes stay escapes until the service parses)."""
        result_url = f"{self.base_url}/v1/jobs/{job.id}/result"
        done = time.monotonic() - job.started >= job.duration
        head = f'"job_id":{json.dumps(job.id)}'
        if job.poison == "userinfo":
            host = self.base_url.replace("http://127.0.0.1", "http://user:pw@127.0.0.2")
            return f'{{{head},"state":"succeeded","result":{{"url":"{host}/x"}}}}'
        if job.poison == "error_text":
            return f'{{{head},"state":"failed","error":{{"message":"bad\\u0000nul \\ud800 x"}}}}'
        if job.poison == "state_surrogate":
            return f'{{{head},"state":"queued\\ud800"}}'
        if job.poison == "state_nul":
            return f'{{{head},"state":"queued\\u0000"}}'
        if job.poison == "errors_ref":
            return (
                f'{{{head},"state":"succeeded",'
                f'"result":{{"url":"{result_url}","errors":"e\\u0000rr"}}}}'
            )
        if job.poison == "raise":
            poisoned = f"{self.base_url}/v1/jobs/{job.id}/{POISONED_RESULT}"
            return f'{{{head},"state":"succeeded","result":{{"url":"{poisoned}"}}}}'
        if job.poison == "raise_status":
            return f'{{{head},"state":"{POISONED_WORD}"}}'
        if not done:
            return f'{{{head},"state":"running","poll_after_seconds":0.1}}'
        return f'{{{head},"state":"succeeded","result":{{"url":"{result_url}"}}}}'

    async def _result(self, request: Request) -> Response:
        job = self._job(request)
        if job is None:
            return JSONResponse({"error": {"message": "no such job"}}, status_code=404)
        self._seen("result", job.id)
        lines = b'{"n":1,"ok":true}\n{"n":2,"ok":true}\n'
        return Response(lines, media_type="application/jsonl")

    async def _errors(self, request: Request) -> Response:
        job = self._job(request)
        if job is None:
            return JSONResponse({"error": {"message": "no such job"}}, status_code=404)
        self._seen("errors", job.id)
        return Response(b'{"n":3,"error":"bad row"}\n', media_type="application/jsonl")

    async def _cancel(self, request: Request) -> Response:
        job = self._job(request)
        if job is None:
            return JSONResponse({"error": {"message": "no such job"}}, status_code=404)
        self._seen("cancel", job.id)
        return JSONResponse({"job_id": job.id, "state": "cancelling"})


def provider_table(base_url: str, *, adapter: bool = True, **polling: Any) -> dict[str, Any]:
    """The poison provider's file as a table (``[providers.poison]``)."""
    table: dict[str, Any] = {
        "base_url": base_url,
        "auth": {"type": "none"},
        "create": {
            "method": "POST",
            "path": "/v1/jobs",
            "idempotency": "none",
            "job_id": "/job_id",
            "timeout_seconds": 5,
        },
        "status": {
            "path": "/v1/jobs/{job_id}",
            "state": "/state",
            "job_id": "/job_id",
            "poll_after_seconds": "/poll_after_seconds",
            "error": "/error",
            "result_ref": "/result/url",
            "errors_ref": "/result/errors",
        },
        "states": {
            "pending": ["queued", "running", POISONED_WORD],
            "success": ["succeeded"],
            "failure": ["failed"],
            "cancelled": ["cancelled"],
        },
        "result": {
            "content_type": "application/jsonl",
            "errors_path": "/v1/jobs/{job_id}/errors/{errors_ref}",
        },
        "polling": {
            "base_delay_seconds": 0.1,
            "max_delay_seconds": 0.5,
            "deadline_seconds": 600,
            "max_status_requests": 60,
            **polling,
        },
    }
    if adapter:
        table["adapter"] = ADAPTER
    return table


def write_service_config(
    path: Path, db_url: str, provider_url: str, port: int, **scheduler: Any
) -> Path:
    """A ``reconciler.toml`` at ``path`` for a service on ``port`` reaching the poison
    provider at ``provider_url`` (its file beside it); ``scheduler`` adds keys there."""
    providers = path.parent / "providers"
    write_provider_file(providers, provider_table(provider_url))
    sched = {"tick_seconds": 0.2, "lease_seconds": 10, **scheduler}
    lines = [
        f"database_url = {toml_value(db_url)}",
        f"providers_dir = {toml_value(str(providers))}",
        'log_level = "INFO"',
        "[server]",
        'host = "127.0.0.1"',
        f"port = {port}",
        "[scheduler]",
        *(f"{k} = {toml_value(v)}" for k, v in sched.items()),
    ]
    path.write_text("\n".join(lines) + "\n", "utf-8")
    return path


def write_provider_file(directory: Path, table: Mapping[str, Any]) -> Path:
    """``table`` as ``poison.toml`` in ``directory`` (sections as TOML tables)."""
    lines = ["[providers.poison]"]
    lines += [f"{k} = {toml_value(v)}" for k, v in table.items() if not _section(k, v)]
    for key, value in table.items():
        if _section(key, value):
            lines.append(f"[providers.poison.{key}]")
            lines += [f"{k} = {toml_value(v)}" for k, v in value.items()]
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "poison.toml"
    path.write_text("\n".join(lines) + "\n", "utf-8")
    return path


def _section(key: str, value: Any) -> bool:
    return isinstance(value, Mapping) and key != "auth"


class PoisonAdapter(HttpAdapter):
    """The file's adapter, with a defect: a status answer in the state ``poisoned``, and the
    fetch of a result reference ending in ``poisoned-result``, raise.

    The message carries a secret-looking word: an escalation names the exception's type
    only, never its message.
    """

    async def status(self, subject: Subject) -> StatusOutcome:
        outcome = await super().status(subject)
        if outcome.view is not None and outcome.view.remote_state == POISONED_WORD:
            raise RuntimeError(f"cannot read this answer (token={SECRET_WORD})")
        return outcome

    async def fetch_result(self, subject: Subject, result_ref: str | None) -> CallResult:
        if result_ref is not None and result_ref.endswith(POISONED_RESULT):
            raise RuntimeError(f"cannot fetch this result (token={SECRET_WORD})")
        return await super().fetch_result(subject, result_ref)
