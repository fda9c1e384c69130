"""Recorders for the downstream steps of completion: hook runs and agent callbacks.

Hooks (configure as ``"tests.support.hooks:record"`` and so on) append one line per
run to the file named by ``$RECONCILER_TEST_HOOK_LOG``::

    <idempotency_key> <op_id> <state>            a finished run
    <idempotency_key> <op_id> <state> started    ``slow`` only: the run has begun

Each line is written with one ``O_APPEND`` write and fsynced before the hook goes
on, so runs can be counted across processes, including one killed right after.
``slow`` sleeps ``$RECONCILER_TEST_HOOK_SLEEP`` seconds (default 30) between its two
lines, which gives a test time to kill the process inside the hook.

The crash point: with ``$RECONCILER_TEST_HOOK_KILL`` naming a marker file that does
not exist yet, ``record_then_crash`` and ``effect`` make the marker and SIGKILL their
own process once their effect is done, so the step is never recorded (a restart,
which finds the marker, runs normally). ``effect`` is the transactional hook: it
writes one row in ``hook_effects`` (see ``create_effects_table``) through the
step's own connection, so that row commits with the step or not at all.

``CallbackReceiver`` is the other downstream step's witness: a small Starlette app
(served with ``serve_receiver``) that records every callback request and answers
as each path's script says.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from reconciler.storage import operations as store
from reconciler.storage.database import Database
from reconciler.storage.history import history_of
from reconciler.storage.tables import STEPS
from tests.support.servers import serve_asgi

LOG_ENV = "RECONCILER_TEST_HOOK_LOG"
SLEEP_ENV = "RECONCILER_TEST_HOOK_SLEEP"
KILL_ENV = "RECONCILER_TEST_HOOK_KILL"
GATE_ENV = "RECONCILER_TEST_HOOK_GATE"  # a file: ``gated`` returns once it exists
STARTED = "started"

RECORD = "tests.support.hooks:record"
AUDIT = "tests.support.hooks:audit"
RECORD_ASYNC = "tests.support.hooks:record_async"
SLOW = "tests.support.hooks:slow"
RECORD_THEN_CRASH = "tests.support.hooks:record_then_crash"
EFFECT = "tests.support.hooks:effect"
FAILING_EFFECT = "tests.support.hooks:failing_effect"
FAILS_WHEN_ASKED = "tests.support.hooks:fails_when_asked"
GATED = "tests.support.hooks:gated"
EFFECT_THEN_CRASH_JOINED = "tests.support.hooks:effect_then_crash_when_joined"
EFFECTS_TABLE = "hook_effects"


# --- hooks -----------------------------------------------------------------------


def _append(line: str) -> None:
    fd = os.open(os.environ[LOG_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)


def _line(operation: Mapping[str, Any], key: str) -> str:
    return f"{key} {operation['id']} {operation['state']}"


def record(operation: Mapping[str, Any], idempotency_key: str) -> None:
    _append(_line(operation, idempotency_key))


def audit(operation: Mapping[str, Any], idempotency_key: str) -> None:
    """A second, distinct hook (its own step and key), to see the order of steps."""
    _append(_line(operation, idempotency_key))


async def record_async(operation: Mapping[str, Any], idempotency_key: str) -> None:
    _append(_line(operation, idempotency_key))


def slow(operation: Mapping[str, Any], idempotency_key: str) -> None:
    _append(f"{_line(operation, idempotency_key)} {STARTED}")
    time.sleep(float(os.environ.get(SLEEP_ENV, "30")))
    _append(_line(operation, idempotency_key))


def gated(operation: Mapping[str, Any], idempotency_key: str) -> None:
    """Says it started, then returns once the file named by ``GATE_ENV`` exists (at most
    60 s): operations held here are let go together."""
    _append(f"{_line(operation, idempotency_key)} {STARTED}")
    gate = Path(os.environ[GATE_ENV])
    deadline = time.monotonic() + 60
    while not gate.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    _append(_line(operation, idempotency_key))


def fails_when_asked(operation: Mapping[str, Any], idempotency_key: str) -> None:
    """Fails for an operation whose metadata says ``{"hook": "fail"}``; else does nothing."""
    if (operation.get("metadata") or {}).get("hook") == "fail":
        raise RuntimeError("the downstream system is down")


def _crash_once() -> None:
    """The crash point: the first run that finds no marker makes it and dies at once."""
    marker = os.environ.get(KILL_ENV)
    if not marker:
        return
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return
    os.fsync(fd)
    os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)


def record_then_crash(operation: Mapping[str, Any], idempotency_key: str) -> None:
    """A plain hook whose process dies after its effect, before its step is recorded."""
    _append(_line(operation, idempotency_key))
    _crash_once()


def effect(operation: Mapping[str, Any], idempotency_key: str, conn: Connection) -> None:
    """A transactional hook: one row in its own table, in the step's transaction."""
    conn.execute(
        sa.text(f"INSERT INTO {EFFECTS_TABLE} (idempotency_key, operation_id) VALUES (:k, :o)"),
        {"k": idempotency_key, "o": operation["id"]},
    )
    _crash_once()


# Effects written per PostgreSQL transaction id, in this process.
_EFFECTS_IN: Counter[int] = Counter()
# How long the first effect of a transaction keeps it open: the writes that arrive
# meanwhile queue behind it, and the next transaction carries several of them.
_ALONE_SECONDS = 0.2


def effect_then_crash_when_joined(
    operation: Mapping[str, Any], idempotency_key: str, conn: Connection
) -> None:
    """``effect`` whose process dies at the second effect written in one transaction: a
    commit shared by several operations' writes, killed before it commits (PostgreSQL)."""
    conn.execute(
        sa.text(f"INSERT INTO {EFFECTS_TABLE} (idempotency_key, operation_id) VALUES (:k, :o)"),
        {"k": idempotency_key, "o": operation["id"]},
    )
    transaction = int(conn.execute(sa.text("SELECT txid_current()")).scalar_one())
    _EFFECTS_IN[transaction] += 1
    if _EFFECTS_IN[transaction] >= 2:
        _crash_once()
    elif not Path(os.environ[KILL_ENV]).exists():
        time.sleep(_ALONE_SECONDS)


def failing_effect(operation: Mapping[str, Any], idempotency_key: str, conn: Connection) -> None:
    """Writes its row, then fails: the row must not outlive the failure."""
    effect(operation, idempotency_key, conn)
    raise RuntimeError("the downstream system said no")


def create_effects_table(db: Database) -> None:
    with db.write() as conn:
        conn.execute(
            sa.text(
                f"CREATE TABLE IF NOT EXISTS {EFFECTS_TABLE} "
                "(idempotency_key VARCHAR(300) NOT NULL, operation_id VARCHAR(40) NOT NULL)"
            )
        )


def effects_by_key(db: Database) -> Counter[str]:
    """How many rows the transactional hook left, per idempotency key."""
    with db.read() as conn:
        rows = conn.execute(sa.text(f"SELECT idempotency_key FROM {EFFECTS_TABLE}")).all()
    return Counter(row[0] for row in rows)


@dataclass(frozen=True)
class HookRun:
    key: str
    op_id: str
    state: str
    started: bool  # a start marker, not a finished run

    @property
    def hook(self) -> str:
        """The hook's spec, from the key ``<op_id>:<round>:hook:<spec>``."""
        return self.key.split(":", 3)[3]


def read_runs(path: Path) -> list[HookRun]:
    if not path.exists():
        return []
    runs = []
    for text in path.read_text("utf-8").splitlines():
        parts = text.split(" ")
        runs.append(HookRun(parts[0], parts[1], parts[2], parts[3:] == [STARTED]))
    return runs


def finished_by_key(path: Path) -> Counter[str]:
    return Counter(run.key for run in read_runs(path) if not run.started)


def started_by_key(path: Path) -> Counter[str]:
    return Counter(run.key for run in read_runs(path) if run.started)


def hook_key(op_id: str, hook: str, completion_round: int = 1) -> str:
    """The idempotency key the service gives ``hook`` for this operation and round."""
    return f"{op_id}:{completion_round}:hook:{hook}"


# --- what a completion left ----------------------------------------------------


def completion_finished(db: Database, op_id: str) -> bool:
    """Whether the completion handler closed the operation's current round."""
    with db.read() as conn:
        op = store.get_operation(conn, op_id)
        entries = history_of(conn, op_id)
    return (
        op is not None
        and not op.completion_pending
        and any(e.cause == "completion_finished" for e in entries)
    )


def completion_steps(db: Database, op_id: str) -> dict[str, dict[str, Any]]:
    """The ``completion_steps`` rows of an operation, by step name."""
    steps = STEPS
    with db.read() as conn:
        rows = conn.execute(sa.select(steps).where(steps.c.operation_id == op_id)).mappings()
        return {str(r["step"]): dict(r) for r in rows}


# --- the agent's callback receiver -----------------------------------------------


@dataclass(frozen=True)
class Reply:
    status: int = 204
    headers: Mapping[str, str] = field(default_factory=dict)
    delay: float = 0.0  # seconds to hang before answering


@dataclass(frozen=True)
class Delivery:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float  # time.monotonic() when the request arrived

    @property
    def webhook_id(self) -> str:
        return self.headers.get("webhook-id", "")


class CallbackReceiver:
    """Records every request to ``/cb/<name>``; answers with ``name``'s script, in order.

    The last reply of a script repeats; a name without a script gets 204.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._scripts: dict[str, list[Reply]] = {}
        self._served: Counter[str] = Counter()
        self._deliveries: list[Delivery] = []
        self.app = Starlette(routes=[Route("/cb/{name}", self._handle, methods=["POST"])])

    def script(self, name: str, replies: Sequence[Reply]) -> None:
        with self._lock:
            self._scripts[name] = list(replies)
            self._served[name] = 0

    def deliveries(self, name: str | None = None) -> list[Delivery]:
        with self._lock:
            found = list(self._deliveries)
        return [d for d in found if name is None or d.path == f"/cb/{name}"]

    def by_webhook_id(self) -> Counter[str]:
        return Counter(d.webhook_id for d in self.deliveries())

    async def _handle(self, request: Request) -> Response:
        at = time.monotonic()
        body = await request.body()
        name = request.path_params["name"]
        with self._lock:
            self._deliveries.append(Delivery(request.url.path, dict(request.headers), body, at))
            script = self._scripts.get(name) or [Reply()]
            reply = script[min(self._served[name], len(script) - 1)]
            self._served[name] += 1
        if reply.delay:
            await asyncio.sleep(reply.delay)
        return Response(status_code=reply.status, headers=dict(reply.headers))


@contextmanager
def serve_receiver() -> Iterator[tuple[CallbackReceiver, str]]:
    """A receiver on 127.0.0.1; yields it and its base URL (``<base>/cb/<name>``)."""
    receiver = CallbackReceiver()
    with serve_asgi(receiver.app, lifespan="off") as url:
        yield receiver, url
