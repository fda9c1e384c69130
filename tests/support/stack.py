"""The whole system on loopback: the simulated provider and the service, both on uvicorn.

Each runs in its own thread with its own event loop, talking real HTTP to
each other: the service calls the provider's API, the provider signs and
sends webhooks to the service's endpoint.
"""

from __future__ import annotations

import base64
import copy
import time
import tomllib
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from starlette.applications import Starlette

from reconciler.app import create_app
from reconciler.config import (
    CallbackSettings,
    SchedulerSettings,
    ServerSettings,
    Settings,
    TelemetrySettings,
)
from reconciler.core.callback_secrets import agent_key, as_whsec
from reconciler.demo.sim import SimConfig, SimState
from reconciler.demo.sim import create_app as create_sim
from reconciler.engine.worker import Worker
from reconciler.runtime import Runtime
from reconciler.storage import operations as store
from reconciler.storage.database import Database
from reconciler.storage.tokens import callback_salt, create_token
from tests.support import loopback
from tests.support.servers import serve_asgi
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
SIM_TOML = ROOT / "service" / "reconciler" / "demo" / "sim" / "sim.toml"
SIM_TOKEN = "sim-token-for-tests"
WEBHOOK_SECRET = "whsec_" + base64.b64encode(b"provider-webhook-secret-0123456").decode()
CALLBACK_SECRET = "whsec_" + base64.b64encode(b"callback-signing-secret-0123456").decode()
# Fast reads and small budgets: every stop condition is reached within seconds.
QUICK_POLLING: dict[str, Any] = {
    "base_delay_seconds": 0.05,
    "max_delay_seconds": 0.2,
    "jitter_floor": 0.5,
    "deadline_seconds": 20,
    "max_status_requests": 12,
    "max_transport_failures": 3,
    "max_rate_limited": 3,
    "rate_limit_delay_seconds": 0.1,
}


def sim_provider_table(
    base_url: str, *, drop: tuple[str, ...] = (), **sections: Any
) -> dict[str, Any]:
    """The sim's provider table from its sim.toml, pointed at ``base_url``.

    ``drop`` removes whole sections (e.g. ``("lookup",)`` for a provider without one);
    a section given as a table is merged into the file's, any other value (and a
    ``request_schema``, as the loader does) replaces the key (``description="..."``).
    """
    with SIM_TOML.open("rb") as fh:
        table = copy.deepcopy(tomllib.load(fh)["providers"]["sim"])
    table["base_url"] = base_url
    for name in drop:
        table.pop(name, None)
    for name, values in sections.items():
        if isinstance(values, dict) and name != "request_schema":  # a schema replaces
            table.setdefault(name, {}).update(values)
        else:
            table[name] = values
    return table


@dataclass
class Stack:
    url: str
    sim_url: str
    sim: SimState
    runtime: Runtime
    agent_token: str
    operator_token: str
    workers: list[Worker] = field(default_factory=list)  # every worker serving this stack
    client: httpx.Client = field(init=False)

    def __post_init__(self) -> None:
        self.client = loopback.client(base_url=self.url, timeout=30.0)

    def headers(self, operator: bool = False) -> dict[str, str]:
        token = self.operator_token if operator else self.agent_token
        return {"Authorization": f"Bearer {token}"}

    def create(self, request: dict[str, Any], **fields: Any) -> httpx.Response:
        body = {"provider": "sim", "request": request, **fields}
        return self.client.post("/v1/operations", json=body, headers=self.headers())

    def get(self, op_id: str, operator: bool = False) -> dict[str, Any]:
        response = self.client.get(f"/v1/operations/{op_id}", headers=self.headers(operator))
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    def wait(self, op_id: str, timeout: float = 30.0) -> dict[str, Any]:
        """Long-poll until done (bounded); returns the last Operation seen."""
        deadline = time.monotonic() + timeout
        op = self.get(op_id)
        while not op["done"] and time.monotonic() < deadline:
            left = max(0.1, min(10.0, deadline - time.monotonic()))
            response = self.client.get(
                f"/v1/operations/{op_id}/wait",
                params={"timeout_seconds": left},
                headers=self.headers(),
            )
            response.raise_for_status()
            op = response.json()
        return op

    def wait_state(self, op_id: str, states: set[str], timeout: float = 30.0) -> dict[str, Any]:
        """Until the operation is in one of ``states`` (bounded); returns it."""
        op: dict[str, Any] = wait_until(
            lambda: (seen := self.get(op_id, operator=True))["state"] in states and seen,
            timeout,
            f"{op_id} to reach {sorted(states)}",
        )
        return op

    def settled(self, op_ids: Sequence[str], timeout: float = 30.0) -> None:
        """Wait (bounded) until nothing runs on these operations and nothing will start.

        Every worker of the stack is idle and each operation is unleased with nothing
        due, so no worker can claim it again: whatever was going to happen has happened,
        and a count taken now is final. This replaces "sleep a while and look again".
        """
        wait_until(
            lambda: (
                all(w.in_flight == 0 for w in self.workers)
                and all(quiescent(self.runtime.db, op_id) for op_id in op_ids)
            ),
            timeout,
            "the workers to go idle with nothing due",
        )

    def history(self, op_id: str) -> list[dict[str, Any]]:
        response = self.client.get(
            f"/v1/operations/{op_id}/history", headers=self.headers(operator=True)
        )
        response.raise_for_status()
        entries: list[dict[str, Any]] = response.json()["entries"]
        return entries

    def callback_secret(self, name: str = "agent-1") -> str:
        """The agent's own callback secret (what ``tokens create`` shows it once)."""
        return agent_callback_secret(self.runtime, name)

    def sim_job(self, job_id: str) -> dict[str, Any]:
        response = loopback.get(f"{self.sim_url}/_sim/jobs/{job_id}", timeout=10)
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    def sim_key(self, key: str) -> list[dict[str, Any]]:
        response = loopback.get(f"{self.sim_url}/_sim/keys/{key}", timeout=10)
        response.raise_for_status()
        data = response.json()
        jobs: list[dict[str, Any]] = data["jobs"] if isinstance(data, dict) else data
        return jobs


def worker_of(app: Starlette) -> Worker:
    """The worker behind an app made by ``create_app``."""
    worker: Worker = app.state.background.worker
    return worker


def quiescent(db: Database, op_id: str) -> bool:
    """No lease on the operation and nothing due on it: no worker can start work on it
    (a claim needs a due ``next_poll_at``) until something outside the workers changes it."""
    with db.read() as conn:
        op = store.load_operation(conn, op_id)
    return op.lease_owner is None and op.next_poll_at is None


def agent_callback_secret(runtime: Runtime, name: str = "agent-1") -> str:
    """The agent ``name``'s own callback secret (what ``tokens create`` shows it once)."""
    with runtime.db.read() as conn:
        salt = callback_salt(conn, name)
    assert salt is not None and runtime.callback_key is not None
    return as_whsec(agent_key(runtime.callback_key, salt))


def make_tokens(runtime: Runtime) -> tuple[str, str]:
    with runtime.db.write() as conn:
        agent = create_token(conn, "agent-1", "agent", runtime.clock.now())
        operator = create_token(conn, "ops-1", "operator", runtime.clock.now())
    return agent, operator


@contextmanager
def running_stack(
    tmp_path: Path,
    db_url: str,
    *,
    provider: dict[str, Any] | None = None,
    sim_config: dict[str, Any] | None = None,
    hooks: tuple[str, ...] = (),
    tick_seconds: float = 0.2,
    callbacks: dict[str, Any] | None = None,
    drop: tuple[str, ...] = (),
    server: dict[str, Any] | None = None,
    scheduler: dict[str, Any] | None = None,
    table: Callable[[str], dict[str, Any]] | None = None,
    telemetry: dict[str, Any] | None = None,
) -> Iterator[Stack]:
    """The service on uvicorn with the sim; ``table(sim_url)`` replaces the provider table;
    ``telemetry``: the ``[telemetry]`` section (an OTLP endpoint turns tracing on)."""
    with ExitStack() as stack:
        sim = SimState(
            SimConfig(token=SIM_TOKEN, webhook_secret=WEBHOOK_SECRET, **(sim_config or {}))
        )
        sim_url = stack.enter_context(serve_asgi(create_sim(state=sim)))
        providers_dir = tmp_path / "no-provider-files"
        providers_dir.mkdir(exist_ok=True)
        settings = Settings(
            database_url=db_url,
            providers_dir=str(providers_dir),
            providers={
                "sim": table(sim_url)
                if table is not None
                else sim_provider_table(sim_url, drop=drop, **(provider or {}))
            },
            hooks=hooks,
            server=ServerSettings(**{"wait_max_seconds": 30.0, **(server or {})}),
            scheduler=SchedulerSettings(
                **{"tick_seconds": tick_seconds, "lease_seconds": 10.0, **(scheduler or {})}
            ),
            callbacks=CallbackSettings(**{"allow_hosts": ("127.0.0.1",), **(callbacks or {})}),
            telemetry=TelemetrySettings(**(telemetry or {})),
        )
        environ = {
            "SIM_TOKEN": SIM_TOKEN,
            "SIM_WEBHOOK_SECRETS": WEBHOOK_SECRET,
            "RECONCILER_CALLBACK_SECRET": CALLBACK_SECRET,
        }
        runtime = Runtime.build(settings, environ=environ)
        agent, operator = make_tokens(runtime)
        app = create_app(runtime)
        url = stack.enter_context(serve_asgi(app))
        sim.config.webhook_url = f"{url}/webhooks/sim"
        result = Stack(url, sim_url, sim, runtime, agent, operator, [worker_of(app)])
        try:
            yield result
        finally:
            result.client.close()
