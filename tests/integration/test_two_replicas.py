"""Two replicas, one PostgreSQL: 154 operations worked by two ``reconciler serve`` processes.

The simulated provider runs in this process (so its request log can be read); its
webhooks go through a small round-robin forwarder that alternates between the two
replicas, so every replica takes webhooks for operations the other one may be
polling. Agents submit to both replicas. The jobs are short, end in success,
partial success or failure, and send their webhooks normally, in duplicate, or
not at all (lost: only the fallback poller finds out). Jobs that send webhooks ask,
while running, for a late next look (``poll_after_seconds``), so that it is mostly
their webhook that brings the next status read forward. The provider delivers
several webhooks at once, so copies of one event can reach both replicas together.
Status answers are slowed down a little, so that two reads for one job in flight at
once would show.

Checked afterwards: every operation reached its expected end state; each
completion step ran once (hook log per idempotency key, callback deliveries per
``webhook-id``, step entries in the history); no operation was polled by two
owners at once (the provider's [arrival, answer] intervals per job never overlap,
and each status read starts only after the previous one, whoever made it, was
recorded); every webhook event was stored once, its repeats counted, and hinted at
most once, and webhooks did bring reads forward; both replicas worked operations
(status reads and completions) and took webhooks; ``reconciler audit verify`` passes.

The topology (``Topology``, ``replica_pair``, ``job_request``, ``submit``,
``wait_completed``) is shared with ``bench/replicas.py``.
"""

from __future__ import annotations

import itertools
import json
import secrets
import threading
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from reconciler.core.states import END_STATES
from reconciler.demo.sim import FaultRates, SimConfig, SimState
from reconciler.demo.sim import create_app as create_sim
from reconciler.storage.database import Database
from reconciler.storage.tables import EVENTS, HISTORY, OPS
from tests.support import hooks, loopback
from tests.support.process import cli, make_tokens, service_config, service_env, service_process
from tests.support.servers import serve_asgi
from tests.support.stack import SIM_TOKEN, WEBHOOK_SECRET
from tests.support.waiting import wait_until

# Twice every combination of outcome and duration (indices mod 7 and mod 11), each outcome
# with each webhook behaviour (mod 3) several times: what 500 proved, in a third of the time
# (``bench/replicas.py`` runs the large counts).
OPERATIONS = 154
# Every status answer takes this long in the provider: a second reader would overlap.
STATUS_DELAY = 0.05
# The service and the sim read the same wall clock (separate processes): a little slack.
SKEW = 0.05
TICK = 0.2
# Long enough that a starved process (2 cores, other suites) keeps its leases through a step.
LEASE_SECONDS = 30.0
POLLING: dict[str, Any] = {
    "base_delay_seconds": 0.2,
    "max_delay_seconds": 1.0,
    "deadline_seconds": 150,
    "max_status_requests": 60,
}
SUBMIT_ATTEMPTS = 3
HINTED_POLL_AFTER = 5
WEBHOOK_CONCURRENCY = 8
WEBHOOK_MODES = ("normal", "duplicate", "never")
# (scenario, end state) by operation index: mostly success, some partial, some failures.
OUTCOMES = {"success": "succeeded", "partial": "completed_with_errors", "late_failure": "failed"}
END_VALUES = frozenset(s.value for s in END_STATES)


def scenario_of(index: int) -> str:
    if index % 11 == 5:
        return "late_failure"
    if index % 7 == 3:
        return "partial"
    return "success"


def job_request(index: int) -> dict[str, Any]:
    """Short jobs (0.4-2.6 s) with a mix of outcomes and webhook behaviours."""
    mode = WEBHOOK_MODES[index % len(WEBHOOK_MODES)]
    # Jobs that send webhooks run a little longer, so that most are still running at
    # the first status read and it is their webhook that says when to look again.
    duration = 0.4 + (index % 7) * 0.2 + (0.0 if mode == "never" else 1.0)
    request: dict[str, Any] = {
        "scenario": scenario_of(index),
        "duration": round(duration, 1),
        "webhooks": mode,
        # Final events only: fewer deliveries to make on two shared cores.
        "webhook_on_running": False,
        "n": index,
    }
    if mode != "never":
        # The provider asks for a late next look; its webhook is what brings it forward.
        request["poll_after_seconds"] = HINTED_POLL_AFTER
    return request


# --- the round-robin webhook forwarder -------------------------------------------


@dataclass(frozen=True)
class Forwarded:
    event_id: str
    replica: int
    status: int | None
    error: str | None = None  # the forwarder's own transport error, when there was no answer


class RoundRobin:
    """Forwards each webhook request to the next replica in turn and answers with its answer."""

    def __init__(self, targets: Sequence[str]) -> None:
        self.targets = list(targets)
        self._turn = itertools.count()
        self._lock = threading.Lock()
        self.log: list[Forwarded] = []
        self.in_flight = 0
        self._client: httpx.AsyncClient | None = None
        self.app = Starlette(
            routes=[Route("/webhooks/{provider}", self._forward, methods=["POST"])],
            lifespan=self._lifespan,
        )

    @asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        # Longer than the provider waits: an answer it gave up on is still logged here. A
        # new connection per request, as the provider makes: a pooled one can be closed by
        # the replica's keep-alive timeout just as it is reused, which is this stand-in's
        # failure and not the replica's.
        limits = httpx.Limits(max_keepalive_connections=0)
        async with loopback.async_client(timeout=60.0, trust_env=False, limits=limits) as client:
            self._client = client
            yield

    async def _forward(self, request: Request) -> Response:
        assert self._client is not None
        with self._lock:
            self.in_flight += 1
        try:
            return await self._pass_on(request)
        finally:
            with self._lock:
                self.in_flight -= 1

    async def _pass_on(self, request: Request) -> Response:
        assert self._client is not None
        replica = next(self._turn) % len(self.targets)
        body = await request.body()
        keep = ("content-type", "webhook-id", "webhook-timestamp", "webhook-signature")
        headers = {k: v for k, v in request.headers.items() if k in keep}
        url = f"{self.targets[replica]}{request.url.path}"
        try:
            answer = await self._client.post(url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"
            self._note(Forwarded(headers.get("webhook-id", ""), replica, None, error))
            return Response(status_code=502)
        self._note(Forwarded(headers.get("webhook-id", ""), replica, answer.status_code))
        return Response(answer.content, status_code=answer.status_code)

    def _note(self, forwarded: Forwarded) -> None:
        with self._lock:
            self.log.append(forwarded)

    def idle(self) -> bool:
        with self._lock:
            return self.in_flight == 0

    def answers(self) -> list[Forwarded]:
        with self._lock:
            return list(self.log)


# --- the topology ----------------------------------------------------------------


@dataclass
class Topology:
    urls: list[str]
    sim: SimState
    sim_url: str
    forwarder: RoundRobin
    receiver: hooks.CallbackReceiver
    receiver_url: str
    configs: list[Path]
    env: dict[str, str]
    agent: str
    operator: str
    db_url: str
    hook_log: Path
    clients: list[httpx.Client] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)

    def headers(self, operator: bool = False) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.operator if operator else self.agent}"}


def slow_status_sim() -> SimState:
    status = FaultRates(delay=1.0, delay_seconds=STATUS_DELAY)
    config = SimConfig(
        token=SIM_TOKEN,
        webhook_secret=WEBHOOK_SECRET,
        endpoint_faults={"status": status},
        # Several deliveries in flight, like a real provider: duplicates of one event may
        # reach both replicas at the same time.
        webhook_concurrency=WEBHOOK_CONCURRENCY,
        webhook_timeout=15.0,
    )
    return SimState(config)


@contextmanager
def replica_pair(tmp_path: Path, db_url: str, replicas: int = 2) -> Iterator[Topology]:
    """The sim, a callback receiver, ``replicas`` service processes and the forwarder."""
    hook_log = tmp_path / "hooks.log"
    with ExitStack() as stack:
        sim = slow_status_sim()
        sim_url = stack.enter_context(serve_asgi(create_sim(state=sim)))
        receiver, receiver_url = stack.enter_context(hooks.serve_receiver())
        agent, operator = make_tokens(db_url)
        env = service_env(
            {hooks.LOG_ENV: str(hook_log), "RECONCILER_AUDIT_KEY": secrets.token_hex(16)}
        )
        services = []
        configs = []
        for index in range(replicas):
            config, port = service_config(
                tmp_path / f"replica-{index + 1}",
                db_url,
                sim_url,
                hooks=[hooks.RECORD],
                scheduler={"tick_seconds": TICK, "lease_seconds": LEASE_SECONDS},
                log_level="WARNING",
                provider=POLLING,
            )
            configs.append(config)
            services.append(
                stack.enter_context(service_process(config, port, env=env, ready=False))
            )
        for service in services:
            service.wait_ready()
        urls = [s.url for s in services]
        forwarder = RoundRobin(urls)
        forward_url = stack.enter_context(serve_asgi(forwarder.app))
        sim.config.webhook_url = f"{forward_url}/webhooks/sim"
        clients = [stack.enter_context(loopback.client(base_url=u, timeout=30.0)) for u in urls]
        yield Topology(
            urls, sim, sim_url, forwarder, receiver, receiver_url, configs, env,
            agent, operator, db_url, hook_log, clients, [s.pid for s in services],
        )  # fmt: skip


def submit(top: Topology, count: int, *, threads: int = 16) -> list[str]:
    """POST ``count`` operations as fast as the API takes them, alternating replicas."""

    def one(index: int) -> str:
        client = top.clients[index % len(top.clients)]
        body = {
            "provider": "sim",
            "request": job_request(index),
            "idempotency_key": f"submit-{index}",
            "callback_url": f"{top.receiver_url}/cb/op{index}",
        }
        for attempt in range(SUBMIT_ATTEMPTS):
            try:
                response = client.post("/v1/operations", json=body, headers=top.headers())
                break
            except httpx.TransportError:
                # A pooled keep-alive connection the server closed as we reused it: the
                # idempotency key makes sending the same request again safe.
                if attempt + 1 == SUBMIT_ATTEMPTS:
                    raise
        # 200: a retry found the operation the first attempt made.
        assert response.status_code in (200, 202), response.text
        op_id: str = response.json()["id"]
        return op_id

    with ThreadPoolExecutor(max_workers=threads) as pool:
        return list(pool.map(one, range(count)))


def completed_count(db: Database, ids: Sequence[str]) -> int:
    """Operations in an end state whose completion handler has closed its round."""
    with db.read() as conn:
        count = conn.execute(
            sa.select(sa.func.count())
            .select_from(OPS)
            .where(
                OPS.c.id.in_(list(ids)),
                OPS.c.state.in_(END_VALUES),
                OPS.c.completion_pending.is_(False),
            )
        ).scalar()
    return int(count or 0)


def wait_completed(db: Database, ids: Sequence[str], timeout: float) -> float:
    """Wait (bounded) until every operation completed; returns the monotonic time it did."""
    wait_until(
        lambda: completed_count(db, ids) == len(ids), timeout, f"{len(ids)} operations completed"
    )
    return time.monotonic()


# --- checks ----------------------------------------------------------------------


def histories(db: Database) -> dict[str, list[dict[str, Any]]]:
    with db.read() as conn:
        rows = conn.execute(sa.select(HISTORY).order_by(HISTORY.c.operation_id, HISTORY.c.seq))
        found: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for row in rows.mappings():
            found[row["operation_id"]].append(dict(row))
    return found


def operations(db: Database) -> dict[str, dict[str, Any]]:
    with db.read() as conn:
        return {r["id"]: dict(r) for r in conn.execute(sa.select(OPS)).mappings()}


def all_via_api(top: Topology) -> dict[str, dict[str, Any]]:
    """Every operation as the API answers it (paged, through the second replica)."""
    found: dict[str, dict[str, Any]] = {}
    cursor: str | None = None
    client = top.clients[-1]
    for _ in range(OPERATIONS):
        params: dict[str, Any] = {"limit": 200, **({"cursor": cursor} if cursor else {})}
        page = client.get("/v1/operations", params=params, headers=top.headers(operator=True))
        page.raise_for_status()
        data = page.json()
        found.update({op["id"]: op for op in data["operations"]})
        cursor = data.get("next_cursor")
        if not cursor:
            break
    return found


def check_end_states(top: Topology, ids: list[str], db: Database) -> None:
    views = all_via_api(top)
    rows = operations(db)
    for index, op_id in enumerate(ids):
        expected = OUTCOMES[scenario_of(index)]
        view = views[op_id]
        assert view["done"] is True and view["state"] == expected, (op_id, view["state"])
        assert rows[op_id]["state"] == expected and rows[op_id]["completion_pending"] is False


def check_steps_once(
    top: Topology, ids: list[str], entries: dict[str, list[dict[str, Any]]]
) -> None:
    # Hooks: one finished run per idempotency key, for every operation, nothing else.
    runs = hooks.finished_by_key(top.hook_log)
    assert runs == Counter({hooks.hook_key(op_id, hooks.RECORD): 1 for op_id in ids})
    # Callbacks: one delivery per webhook-id (stable per operation), to the right path.
    deliveries = top.receiver.deliveries()
    assert Counter(d.webhook_id for d in deliveries) == Counter(ids)
    path_of = {op_id: f"/cb/op{index}" for index, op_id in enumerate(ids)}
    for delivery in deliveries:
        operation = json.loads(delivery.body)["operation"]
        assert delivery.path == path_of[delivery.webhook_id], delivery.path
        assert operation["id"] == delivery.webhook_id and operation["done"] is True
    # And the history: one end transition, one of each step, one completion per operation.
    for op_id in ids:
        causes = Counter(e["cause"] for e in entries[op_id])
        ends = [
            e for e in entries[op_id] if e["kind"] == "transition" and e["to_state"] in END_VALUES
        ]
        assert len(ends) == 1, (op_id, [e["to_state"] for e in ends])
        assert causes[f"step_done:hook:{hooks.RECORD}"] == 1, op_id
        assert causes["step_done:callback"] == 1, op_id
        assert causes["completion_finished"] == 1, op_id
        assert not any(c.startswith("step_failed") for c in causes), (op_id, causes)


def status_reads(sim: SimState, job_id: str) -> list[dict[str, Any]]:
    records = sorted(sim.jobs[job_id].requests["status"], key=lambda r: r.at)
    return [r.to_json() for r in records]


def check_no_overlap(op_id: str, reads: list[dict[str, Any]]) -> None:
    """The provider's [arrival, answer] intervals of one job's status requests are disjoint."""
    for earlier, later in itertools.pairwise(sorted(reads, key=lambda r: r["at"])):
        assert earlier["answered_at"] is not None, (op_id, earlier)
        assert later["at"] >= earlier["answered_at"], (op_id, "overlap", earlier, later)


def pair_reads(op_id: str, reads: list[dict[str, Any]], observed: list[dict[str, Any]]) -> None:
    """Pair each status observation, in order, with the provider's record of its request.

    Each request must arrive after the previous observation (whoever made it) was
    recorded, and before its own. An observation with a transport error may have no
    record: the request never reached the provider (e.g. a reset keep-alive connection).
    """
    left = list(reads)
    previous = float("-inf")
    for index, entry in enumerate(observed):
        recorded = entry["at"].timestamp()
        if left and left[0]["at"] <= recorded + SKEW:
            read = left.pop(0)
            assert read["at"] >= previous - SKEW, (op_id, index, "read before the last answer")
        else:
            assert "transport_error" in entry["detail"], (op_id, index, "no request seen")
        previous = recorded
    assert not left, (op_id, "requests the history does not show", left)


def check_one_owner_at_a_time(
    sim: SimState, ids: list[str], entries: dict[str, list[dict[str, Any]]], db: Database
) -> tuple[set[str], int]:
    """No two status requests for one job in flight at once, whoever sent them.

    In the provider: the [arrival, answer] intervals of one job's status requests do
    not overlap. In the history: every request charged is observed, and the requests
    pair in order with the observations, each arriving only after the previous answer
    was recorded, so two owners never interleave within a read. Returns the actors that
    made status reads and how many operations changed hands between them.
    """
    rows = operations(db)
    actors: set[str] = set()
    handed_over = 0
    for op_id in ids:
        reads = status_reads(sim, rows[op_id]["remote_job_id"])
        check_no_overlap(op_id, reads)
        observed = [e for e in entries[op_id] if e["cause"] == "status_read"]
        assert len(observed) == rows[op_id]["status_requests_used"], op_id
        pair_reads(op_id, reads, observed)
        owners = [e["actor"] for e in observed]
        actors.update(owners)
        handed_over += len(set(owners)) > 1
    return actors, handed_over


def ok(status: int) -> bool:
    return 200 <= status < 300


def check_webhooks(top: Topology, ids: list[str], db: Database, entries: dict[str, Any]) -> None:
    sim = top.sim
    assert not sim.outbox.pending, "the provider still has webhooks to deliver"
    attempts = list(sim.outbox.attempts)
    # The provider saw every event acknowledged (a slow answer may have been retried).
    acknowledged = {a.event_id for a in attempts if a.ok}
    assert acknowledged == {a.event_id for a in attempts}
    # The replicas answered every request they got with 2xx, or with 503 where the write
    # bound ran out (seen at a load of ten times the cores: the provider retries it), and
    # both took webhooks.
    answers = top.forwarder.answers()
    assert all(f.status is not None and (ok(f.status) or f.status == 503) for f in answers), [
        f for f in answers if f.status is None or not (ok(f.status) or f.status == 503)
    ][:5]
    per_replica = Counter(f.replica for f in answers)
    assert len(per_replica) == len(top.urls) and min(per_replica.values()) > 0, per_replica
    with db.read() as conn:
        stored = {r["event_id"]: dict(r) for r in conn.execute(sa.select(EVENTS)).mappings()}
    # Every event stored once with every repeat counted (none lost, none twice).
    assert set(stored) == acknowledged
    # A refused delivery may or may not have been stored (its bound ran out, not its write).
    received = Counter(f.event_id for f in answers)
    taken = Counter(f.event_id for f in answers if f.status is not None and ok(f.status))
    for event_id, times in received.items():
        duplicates = stored[event_id]["duplicates"]
        assert taken[event_id] - 1 <= duplicates <= times - 1, (event_id, times, stored[event_id])
        assert stored[event_id]["conflicts"] == 0
    rows = operations(db)
    modes = {rows[op_id]["remote_job_id"]: WEBHOOK_MODES[i % 3] for i, op_id in enumerate(ids)}
    for job_id, mode in modes.items():
        job_events = {a.event_id for a in attempts if a.job_id == job_id}
        assert (mode == "never") == (not job_events), (job_id, mode)
    # A hint per event at most: a duplicate delivered to the other replica hints nothing.
    hinted = 0
    for op_id in ids:
        hints = [e for e in entries[op_id] if e["kind"] == "hint"]
        assert all(n == 1 for n in Counter(e["cause"] for e in hints).values()), (op_id, hints)
        hinted += any(e["delay_source"] == "webhook_hint" for e in hints)
    # Webhooks did their job: they brought status reads forward (the provider asked for
    # a late look on every job that sends them).
    assert hinted > 0


def check_creates_once(sim: SimState, ids: list[str]) -> None:
    assert len(sim.jobs) == len(ids)
    assert all(len(jobs) == 1 for jobs in sim.keys.values())


# --- the test --------------------------------------------------------------------


@pytest.fixture(
    params=[
        pytest.param(
            "sqlite",
            marks=pytest.mark.skip(
                reason="several replicas need PostgreSQL (SQLite is one process's database)"
            ),
        ),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ]
)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.mark.slow
@pytest.mark.timeout(360)
def test_two_replicas_on_one_postgres_complete_every_operation_once(
    tmp_path: Path, db_url: str
) -> None:
    db = Database(db_url)
    try:
        with replica_pair(tmp_path, db_url) as top:
            ids = submit(top, OPERATIONS)
            assert len(set(ids)) == OPERATIONS
            wait_completed(db, ids, timeout=120)
            wait_until(lambda: len(top.receiver.deliveries()) >= OPERATIONS, 10, "callbacks")
            wait_until(lambda: not top.sim.outbox.pending, 30, "webhook deliveries")
            wait_until(top.forwarder.idle, 30, "forwarded webhooks")
            entries = histories(db)
            check_end_states(top, ids, db)
            check_steps_once(top, ids, entries)
            check_creates_once(top.sim, ids)
            actors, handed_over = check_one_owner_at_a_time(top.sim, ids, entries, db)
            check_webhooks(top, ids, db, entries)
            # Both replicas worked operations, and operations changed hands between them.
            assert len(actors) == 2, actors
            assert handed_over > 0
            finishers = {
                e["actor"] for op_id in ids for e in entries[op_id]
                if e["cause"] == "completion_finished"
            }  # fmt: skip
            assert finishers == actors
            audit = cli(top.configs[0], "audit", "verify", env=top.env)
            assert audit.returncode == 0, audit.stderr
            assert f"{OPERATIONS} operations" in audit.stdout
    finally:
        db.dispose()


def _read(at: float, answered_at: float) -> dict[str, Any]:
    return {"at": at, "answered_at": answered_at}


def _observed(at: float, actor: str, **detail: Any) -> dict[str, Any]:
    return {"at": datetime.fromtimestamp(at, UTC), "actor": actor, "detail": detail}


def test_the_owner_checks_catch_two_readers_at_once() -> None:
    """The checks above fail on the logs two owners reading at once would leave."""
    check_no_overlap("op", [_read(10.0, 10.1), _read(10.1, 10.2)])
    with pytest.raises(AssertionError):
        check_no_overlap("op", [_read(10.0, 10.1), _read(10.05, 10.15)])
    # One owner after the other: each request after the previous answer was recorded.
    reads = [_read(10.0, 10.05), _read(11.0, 11.05)]
    pair_reads("op", reads, [_observed(10.1, "worker:a"), _observed(11.1, "worker:b")])
    # The second owner asked while the first one's answer was not recorded yet.
    late = [_observed(10.9, "worker:a"), _observed(11.1, "worker:b")]
    with pytest.raises(AssertionError):
        pair_reads("op", [_read(10.0, 10.05), _read(10.5, 10.55)], late)
    # A request the history does not show (charged by an owner that lost it).
    with pytest.raises(AssertionError):
        pair_reads("op", reads, [_observed(11.1, "worker:b")])
    # A transport error may leave no request at the provider; nothing else may.
    pair_reads("op", reads[:1], [_observed(10.1, "a"), _observed(10.5, "b", transport_error="x")])
    with pytest.raises(AssertionError):
        pair_reads("op", reads[:1], [_observed(10.1, "a"), _observed(10.5, "b")])
