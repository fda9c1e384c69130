"""The peer of ``bench/peer_dbos.py``: the same job as ``reconciler serve``, on DBOS Transact.

    python bench/peer_dbos_app.py --port N --database URL --app-database URL
        --provider URL [--pool N] [--poll SECONDS|defaults]
    (environment: SIM_TOKEN, SIM_WEBHOOK_SECRET, CALLBACK_SECRET, API_TOKEN)

It runs in a virtualenv of its own (``dbos`` 3.4.0, Starlette, uvicorn, httpx, aiosqlite;
made by ``bench/peer_dbos.py`` on first use) and imports nothing of reconciler: it is
written as lean as a DBOS user writes a Starlette app, from DBOS's documented workflow,
step, queue and message APIs, with no transaction of its own a user would not add.

* ``POST /v1/operations`` (bearer token): the agent's submission, the same body as
  reconciler's (``provider``, ``request``, ``callback_url``, ``idempotency_key``). One
  durable workflow per operation, its ID made of the key (a submission sent again is the
  same workflow), enqueued on a DBOS queue; 202 once DBOS has recorded it.
* The queue is polled every ``--poll`` seconds (``0.2``; ``defaults``: DBOS's own, 1 s),
  and on SQLite, which has no LISTEN/NOTIFY, messages are polled for as often.
* The workflow: a step creates the job at the provider (its ``Idempotency-Key`` the
  workflow ID) and keeps the job id where the webhook route finds the workflow (one
  ``INSERT ... ON CONFLICT DO NOTHING`` in the application's table, ``--app-database``:
  a step that runs again writes nothing twice); it waits for a webhook's message
  (``DBOS.recv``) or, failing one, until the next fallback read (30 s, doubling to 120 s,
  as the bench gives reconciler); a step reads the status; once the job succeeded a step
  fetches the result and checks its sha256, and a step sends the agent one callback
  signed with Standard Webhooks.
* ``POST /webhooks/sim``: verifies the provider's Standard Webhooks signature, finds the
  workflow of the job and sends it the event (``DBOS.send``, keyed by the event id, so a
  delivery sent again is one message); 404 while the job is not recorded yet (the
  provider delivers again).
* ``GET /healthz``: 200 once DBOS is launched.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import hmac
import json
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import sqlalchemy as sa
import uvicorn
from dbos import DBOS, DBOSConfig, SetWorkflowID
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

FIRST_READ, MAX_READ = 30.0, 120.0  # the fallback reads' backoff (reconciler's, in the bench)
DEADLINE = 600.0
MAX_READS = 60
END_STATES = ("succeeded", "failed", "cancelled")
TOLERANCE = 300  # seconds a signed timestamp may be off


def _key(secret: str) -> bytes:
    return base64.b64decode(secret.removeprefix("whsec_") + "==")


def _signature(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    signed = f"{msg_id}.{timestamp}.".encode() + body
    return base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


class Settings:
    jobs: AsyncEngine  # the application's database: job id -> workflow
    provider: httpx.AsyncClient
    gate: asyncio.Semaphore  # a provider call waits here for a pooled connection
    callbacks: httpx.AsyncClient
    webhook_key: bytes
    callback_key: bytes
    api_token: bytes
    queue: Any  # the DBOS queue the submissions go to


S = Settings()


# --- the workflow -----------------------------------------------------------------------


@DBOS.step()
async def create_job(request: dict[str, Any]) -> str:
    key = DBOS.workflow_id or ""
    async with S.gate:
        answer = await S.provider.post("/v1/jobs", json=request, headers={"Idempotency-Key": key})
    answer.raise_for_status()
    job_id = str(answer.json()["job_id"])
    # Where the webhook route finds the workflow; a step run again finds it there already.
    async with S.jobs.begin() as conn:
        await conn.execute(
            sa.text(
                "INSERT INTO jobs (job_id, workflow_id) VALUES (:job, :workflow) "
                "ON CONFLICT (job_id) DO NOTHING"
            ),
            {"job": job_id, "workflow": key},
        )
    return job_id


async def workflow_of(job_id: str) -> str | None:
    async with S.jobs.connect() as conn:
        found = await conn.execute(
            sa.text("SELECT workflow_id FROM jobs WHERE job_id = :job"), {"job": job_id}
        )
        row = found.first()
    return None if row is None else str(row[0])


@DBOS.step()
async def read_status(job_id: str) -> dict[str, Any]:
    async with S.gate:
        answer = await S.provider.get(f"/v1/jobs/{job_id}")
    answer.raise_for_status()
    status: dict[str, Any] = answer.json()
    return status


@DBOS.step()
async def fetch_result(url: str, sha256: str) -> dict[str, Any]:
    async with S.gate:
        answer = await S.provider.get(url)
    answer.raise_for_status()
    if hashlib.sha256(answer.content).hexdigest() != sha256:
        raise ValueError("the result does not match the sha256 the status gave")
    document: dict[str, Any] = json.loads(answer.content)
    return {"summary": document.get("summary")}


@DBOS.step()
async def send_callback(url: str, operation: dict[str, Any]) -> int:
    body = json.dumps({"type": "operation.completed", "operation": operation}).encode()
    msg_id, timestamp = operation["id"], int(time.time())
    headers = {
        "content-type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": "v1," + _signature(S.callback_key, msg_id, timestamp, body),
    }
    answer = await S.callbacks.post(url, content=body, headers=headers)
    answer.raise_for_status()
    return answer.status_code


@DBOS.workflow()
async def operation(request: dict[str, Any], callback_url: str) -> str:
    workflow_id = DBOS.workflow_id or ""
    job_id = await create_job(request)
    wait, reads, waited = FIRST_READ, 0, 0.0
    while True:
        # A webhook's message, or the fallback read's time: either way, read the status.
        started = time.monotonic()
        await DBOS.recv_async("hint", timeout_seconds=wait)
        waited += time.monotonic() - started
        status = await read_status(job_id)
        reads += 1
        if status["state"] in END_STATES or waited >= DEADLINE or reads >= MAX_READS:
            break
        wait = min(MAX_READ, wait * 2)
    view: dict[str, Any] = {
        "id": workflow_id,
        "provider": "sim",
        "state": status["state"],
        "done": True,
        "remote_job_id": job_id,
        "remote_state": status["state"],
        "message": f"The job {status['state'].upper()}.",
        "result": None,
        "budget": {"status_requests_used": reads, "max_status_requests": MAX_READS},
        "error": None,
        "escalation": None,
    }
    if status["state"] == "succeeded":
        found = status["result"]
        view["result"] = await fetch_result(found["url"], found["sha256"])
    await send_callback(callback_url, view)
    return str(status["state"])


# --- the routes -------------------------------------------------------------------------


def _authorized(request: Request) -> bool:
    given = request.headers.get("authorization", "").encode()
    return hmac.compare_digest(given, b"Bearer " + S.api_token)


async def submit(request: Request) -> Response:
    if not _authorized(request):
        return JSONResponse({"error": "unauthorized"}, 401)
    body = await request.json()
    workflow_id = f"op-{body['idempotency_key']}"
    with SetWorkflowID(workflow_id):
        await S.queue.enqueue_async(operation, body["request"], body["callback_url"])
    return JSONResponse({"id": workflow_id, "state": "accepted"}, 202)


def _verified(request: Request, body: bytes) -> str | None:
    """The webhook's event id if its Standard Webhooks signature is good, else None."""
    msg_id = request.headers.get("webhook-id", "")
    try:
        timestamp = int(request.headers.get("webhook-timestamp", ""))
    except ValueError:
        return None
    if abs(time.time() - timestamp) > TOLERANCE:
        return None
    expected = _signature(S.webhook_key, msg_id, timestamp, body)
    for part in request.headers.get("webhook-signature", "").split():
        version, _, given = part.partition(",")
        if version == "v1" and hmac.compare_digest(given, expected):
            return msg_id
    return None


async def webhook(request: Request) -> Response:
    body = await request.body()
    event_id = _verified(request, body)
    if event_id is None:
        return JSONResponse({"error": "bad signature"}, 401)
    workflow_id = await workflow_of(json.loads(body)["data"]["job_id"])
    if workflow_id is None:
        # Not recorded yet: the provider delivers again; the fallback read is the net.
        return JSONResponse({"error": "unknown job"}, 404)
    await DBOS.send_async(workflow_id, event_id, "hint", idempotency_key=event_id)
    return Response(status_code=204)


async def healthz(request: Request) -> Response:
    return JSONResponse({"ok": True})


def app(args: argparse.Namespace) -> Starlette:
    config: DBOSConfig = {
        "name": "peer-bench",
        "system_database_url": args.database,
        "run_admin_server": False,
        "log_level": "WARNING",
    }
    if args.poll is not None:
        # Messages are polled for where the database has no LISTEN/NOTIFY (SQLite).
        config["notification_listener_polling_interval_sec"] = args.poll
    DBOS(config=config)

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        limits = httpx.Limits(max_connections=args.pool, max_keepalive_connections=args.pool)
        auth = {"Authorization": f"Bearer {args.provider_token}", "Accept": "application/json"}
        S.provider = httpx.AsyncClient(
            base_url=args.provider, headers=auth, limits=limits, timeout=30
        )
        # httpx's pool walks its queue of waiting requests on every change: the calls wait
        # in a semaphore of the pool's size instead, as reconciler's own calls do.
        S.gate = asyncio.Semaphore(args.pool)
        S.callbacks = httpx.AsyncClient(timeout=10)
        S.jobs = create_async_engine(args.app_database, pool_size=20, max_overflow=0)
        async with S.jobs.begin() as conn:
            await conn.execute(
                sa.text(
                    "CREATE TABLE IF NOT EXISTS jobs "
                    "(job_id TEXT PRIMARY KEY, workflow_id TEXT NOT NULL)"
                )
            )
        DBOS.launch()  # on this loop: queued async workflows run on it too
        polling = {} if args.poll is None else {"polling_interval_sec": args.poll}
        S.queue = await DBOS.register_queue_async("operations", **polling)
        try:
            yield
        finally:
            await S.provider.aclose()
            await S.callbacks.aclose()
            DBOS.destroy()
            await S.jobs.dispose()

    routes = [
        Route("/v1/operations", submit, methods=["POST"]),
        Route("/webhooks/sim", webhook, methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--database", required=True, help="DBOS's system database")
    parser.add_argument("--app-database", required=True, help="the application's (jobs)")
    parser.add_argument("--provider", required=True)
    parser.add_argument("--pool", type=int, default=64)
    parser.add_argument(
        "--poll",
        type=lambda text: None if text == "defaults" else float(text),
        default=0.2,
        help="seconds between the queue's polls (default: DBOS's own)",
    )
    args = parser.parse_args()
    # Secrets and tokens come from the environment, as a deployed app takes them.
    args.provider_token = os.environ["SIM_TOKEN"]
    S.webhook_key = _key(os.environ["SIM_WEBHOOK_SECRET"])
    S.callback_key = _key(os.environ["CALLBACK_SECRET"])
    S.api_token = os.environ["API_TOKEN"].encode()
    uvicorn.run(app(args), host="127.0.0.1", port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
