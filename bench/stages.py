"""Where an operation waits inside the service: a per-stage breakdown under load.

    (in the service) bench/throughput_parts.py serve ... --stages FILE
    python bench/stages.py FILE

``install(FILE)`` runs inside the measured service (``bench/throughput_parts.py serve
--stages FILE``, which ``bench/throughput.py --stages`` and ``bench/peer_dbos.py --stages``
pass) and wraps, from outside, a few of its methods by name, so that a checkout that knows
nothing of this module is measured alike (the unmodified tree before a change, too):

* ``Worker._spawn``: each claimed operation, with the time it was due (``next_poll_at``)
  and the time its claim came back to the loop: **due -> claimed**.
* ``ClaimRun._step``: each step (named by the state it runs in), from the time its task
  could start it (the claim, or the previous step's write) to its end: **ready -> step**.
* the provider's and the callback's HTTP transports: each call in a step, **step ->
  call** and the call itself.
* ``Shares.take`` and its slot's return: each share's slots held by running steps over
  time, and those a claim in flight asked for (held back from everything else until it
  returns), set beside the calls really in flight to the share's party: whether
  operations wait for a share whose slots are held but not calling, and by what.
* ``Writer._submit`` and the writer threads' runs: every write with the queue's depth
  when it was handed over, its **wait** in the queue, its transaction (and how many
  writes shared it) and the hop back to the loop; a step's last write gives **call ->
  committed**.
* ``fastsql.run`` on a writer thread: each statement's wall time (sent to answered, the
  transaction's ``BEGIN`` with its first) beside the thread's CPU time over it. The rest
  waited for the server, for the interpreter lock or for a core; the report says how
  much of the writers' statement time went to the slow tail (over 2 ms), which a
  server that logs its statements over 2 ms (``log_min_duration_statement``) can place.
* ``GroupCommitter.submit``: each webhook delivery's **wait for its commit** (and the
  ones refused past the bound).
* ``agent_actions.wait_until`` called by a create: the POST's **wait for the job id**,
  and whether the job id came within it.
* every thread's CPU time, read from /proc every quarter second: the cores each thread
  kept busy over the load, beside the share of it each writer thread spent inside a
  transaction. A writer in a transaction but not on a core waits for PostgreSQL's answer
  or for the interpreter lock; ``py-spy --idle --threads`` tells the two apart.

Each record is a tuple appended to a list (the GIL makes that safe from the writer
threads); the lists are written to FILE as JSON when the process exits. The wrappers
cost a few microseconds a record: CPU figures are for runs without ``--stages``.
``python bench/stages.py FILE`` prints the breakdown (``report``).
"""

from __future__ import annotations

import asyncio
import atexit
import contextvars
import functools
import json
import os
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.support import cpu_ticks, percentile, run_delay

# The step a task is in (its record), for the calls and writes made inside it.
_STEP: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "bench_stage_step", default=None
)
_WRITE: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "bench_stage_write", default=None
)


class Records:
    def __init__(self) -> None:
        self.claims: list[dict[str, Any]] = []  # per claimed operation
        self.ticks: list[dict[str, Any]] = []  # per claim: what each share asked and got
        self.steps: list[dict[str, Any]] = []
        self.writes: list[dict[str, Any]] = []
        self.webhooks: list[dict[str, Any]] = []
        self.posts: list[dict[str, Any]] = []
        self.spawned: dict[str, float] = {}  # operation -> when its claim reached the loop
        # (time, share, slots held after the change, capacity) on each take and return.
        self.slots: list[tuple[float, str, int, int]] = []
        # (thread, start, end) of each writer thread's transaction run.
        self.runs: list[tuple[str, float, float]] = []
        # (wall, thread CPU) seconds of each statement a writer thread ran.
        self.statements: list[tuple[float, float]] = []
        # (time, {thread name: CPU seconds so far}) every THREAD_SAMPLE_SECONDS.
        self.cpu: list[tuple[float, dict[str, float]]] = []
        # (time, {thread name: seconds so far ready to run but waiting for a core}).
        self.waits: list[tuple[float, dict[str, float]]] = []

    def dump(self, path: Path) -> None:
        data = {
            "claims": self.claims,
            "ticks": self.ticks,
            "steps": self.steps,
            "writes": self.writes,
            "webhooks": self.webhooks,
            "posts": self.posts,
            "slots": self.slots,
            "runs": self.runs,
            "statements": self.statements,
            "cpu": self.cpu,
            "waits": self.waits,
        }
        path.write_text(json.dumps(data), "utf-8")


def _kind(fn: Any) -> str:
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    return str(name).replace(".<locals>", "")


def install(path: Path) -> None:
    """Wrap the service's methods (by name) and write the records at exit."""
    rec = Records()
    atexit.register(rec.dump, path)
    _wrap_claims(rec)
    _wrap_steps(rec)
    _wrap_writes(rec)
    _wrap_statements(rec)
    _wrap_requests(rec)
    threading.Thread(target=_sample_cpu, args=(rec,), name="bench-cpu", daemon=True).start()


# How often each thread's CPU time is read; the report takes the busy window from these.
THREAD_SAMPLE_SECONDS = 0.25


def _thread_cpu() -> tuple[dict[str, float], dict[str, float]]:
    """CPU seconds so far of each thread of this process, by its name, and the seconds each
    waited for a core (Linux /proc; the second is empty without scheduler statistics)."""
    tick = os.sysconf("SC_CLK_TCK")
    cpu: dict[str, float] = {}
    waits: dict[str, float] = {}
    for thread in threading.enumerate():
        if thread.native_id is None or thread.name == "bench-cpu":
            continue
        task = Path(f"/proc/self/task/{thread.native_id}")
        try:
            ticks = cpu_ticks(str(task / "stat"))
        except OSError:
            continue
        cpu[thread.name] = cpu.get(thread.name, 0.0) + ticks / tick
        waited = run_delay(task)
        if waited is not None:
            waits[thread.name] = waits.get(thread.name, 0.0) + waited
    return cpu, waits


def _sample_cpu(rec: Records) -> None:
    while True:
        now = time.time()
        cpu, waits = _thread_cpu()
        rec.cpu.append((now, cpu))
        rec.waits.append((now, waits))
        time.sleep(THREAD_SAMPLE_SECONDS)


def _wrap_claims(rec: Records) -> None:
    from reconciler.engine import worker

    spawn = worker.Worker._spawn

    def _spawn(self: Any, claimed: Any, share: str, *, held: bool = False) -> None:
        now = time.time()
        op = claimed.op
        if held:  # started by its insert (``engine.create_start``): due since it was made
            state, due = f"{op.state} (at insert)", op.created_at.timestamp()
        else:
            state = op.state
            due = op.next_poll_at.timestamp() if op.next_poll_at is not None else None
        rec.claims.append({"state": state, "due": due, "at": now})
        rec.spawned[op.id] = now
        spawn(self, claimed, share, held=held)

    worker.Worker._spawn = _spawn  # type: ignore[method-assign]
    claim = worker.Worker._claim

    async def _claim(self: Any, wants: dict[str, int]) -> Any:
        entry: dict[str, Any] = {"start": time.time(), "wants": dict(wants)}
        try:
            claims = await claim(self, wants)
        finally:
            entry["end"] = time.time()
            rec.ticks.append(entry)
        entry["got"] = {key: len(batch) for key, batch in claims.items()}
        return claims

    worker.Worker._claim = _claim  # type: ignore[method-assign]
    _wrap_slots(rec)


def _wrap_slots(rec: Records) -> None:
    from reconciler.engine import shares

    def held(self: Any, key: str) -> tuple[str, int, int]:
        if key in self._capacity:
            return key, self._used[key], self._capacity[key]
        return shares.CALLBACKS, sum(self._hosts.values()), self._pool

    take, drop = shares.Shares.take, shares.Shares._drop

    def _take(self: Any, key: str, *, claimed: bool = False) -> bool:
        took = take(self, key, claimed=claimed)
        if took:
            rec.slots.append((time.time(), *held(self, key)))
        return bool(took)

    def _drop(self: Any, key: str) -> None:
        drop(self, key)
        rec.slots.append((time.time(), *held(self, key)))

    shares.Shares.take = _take  # type: ignore[method-assign]
    shares.Shares._drop = _drop  # type: ignore[method-assign]


def _wrap_steps(rec: Records) -> None:
    from reconciler.engine import claim_run
    from reconciler.outbound.callbacks import DeliveryTransport
    from reconciler.providers.aiohttp_transport import AiohttpTransport

    step = claim_run.ClaimRun._step

    async def _step(self: Any, fn: Any, op: Any, prep: Any) -> Any:
        start = time.time()
        ready = getattr(self, "_bench_ready", None) or rec.spawned.pop(op.id, start)
        entry: dict[str, Any] = {
            "state": op.state,
            "completion": bool(op.completion_pending),
            "ready": ready,
            "start": start,
            "calls": [],
            "writes": [],
        }
        token = _STEP.set(entry)
        try:
            return await step(self, fn, op, prep)
        finally:
            _STEP.reset(token)
            entry["end"] = self._bench_ready = time.time()
            rec.steps.append(entry)

    claim_run.ClaimRun._step = _step  # type: ignore[method-assign]
    for cls, label in ((AiohttpTransport, "provider"), (DeliveryTransport, "callback")):
        _time_calls(cls, label)


def _time_calls(cls: Any, label: str) -> None:
    handle = cls.handle_async_request

    async def handle_async_request(self: Any, request: Any) -> Any:
        entry = _STEP.get()
        start = time.time()
        try:
            return await handle(self, request)
        finally:
            if entry is not None:
                entry["calls"].append([label, request.method, start, time.time()])

    cls.handle_async_request = handle_async_request


def _wrap_writes(rec: Records) -> None:
    from reconciler.storage import writer

    class _Job(writer._Job):  # type: ignore[name-defined,misc]
        def __init__(self, *args: Any, **kw: Any) -> None:
            super().__init__(*args, **kw)
            self.bench = _WRITE.get()

    writer._Job = _Job  # type: ignore[attr-defined]
    submit = writer.Writer._submit

    async def _submit(self: Any, fn: Any, args: Any, wait: Any, **kw: Any) -> Any:
        step_entry = _STEP.get()
        entry: dict[str, Any] = {
            "kind": _kind(fn),
            "depth": self._queue.qsize(),
            "queued": time.time(),
            "state": step_entry["state"] if step_entry is not None else None,
        }
        token = _WRITE.set(entry)
        try:
            return await submit(self, fn, args, wait, **kw)
        except Exception as exc:
            entry["error"] = type(exc).__name__
            raise
        finally:
            _WRITE.reset(token)
            entry["done"] = time.time()
            rec.writes.append(entry)
            if step_entry is not None:
                step_entry["writes"].append(entry)

    writer.Writer._submit = _submit  # type: ignore[method-assign]
    writer.Writer._run_joined = _stamped(writer.Writer._run_joined, rec)  # type: ignore[method-assign]
    writer.Writer._run_one = _stamped(writer.Writer._run_one, rec)  # type: ignore[method-assign]


def _wrap_statements(rec: Records) -> None:
    from reconciler.storage import fastsql

    run = fastsql.run

    @functools.wraps(run)
    def timed(*args: Any, **kw: Any) -> Any:
        if _writer_name() is None:
            return run(*args, **kw)
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            return run(*args, **kw)
        finally:
            rec.statements.append((time.perf_counter() - wall, time.thread_time() - cpu))

    fastsql.run = timed


def _stamped(run: Any, rec: Records) -> Any:
    """A writer thread's run of one job or of joined ones, stamped on each job's record."""

    @functools.wraps(run)
    def wrapper(self: Any, jobs: Any) -> Any:
        many = [j for j in (jobs if isinstance(jobs, list) else [jobs])]
        entries = [j.bench for j in many if getattr(j, "bench", None) is not None]
        start = time.time()
        for entry in entries:
            entry["start"], entry["batch"] = start, len(many)
        try:
            return run(self, jobs)
        finally:
            end = time.time()
            for entry in entries:
                entry["committed"] = end
            rec.runs.append((_writer_name() or threading.current_thread().name, start, end))

    return wrapper


def _writer_name() -> str | None:
    """The writer running this: its thread, or its task when it runs on the loop."""
    from reconciler.storage import on_loop

    name = threading.current_thread().name
    if name.startswith("db-writer"):
        return name
    if on_loop.driven() is None:
        return None
    task = asyncio.current_task()
    return f"{task.get_name() if task else 'db-writer'} (on the loop)"


def _wrap_requests(rec: Records) -> None:
    from reconciler.commands import agent_actions
    from reconciler.core.states import State
    from reconciler.engine.group_commit import GroupCommitter

    group_submit = GroupCommitter.submit

    async def webhook_submit(self: Any, event: Any) -> Any:
        entry: dict[str, Any] = {"start": time.time()}
        try:
            return await group_submit(self, event)
        except Exception as exc:
            entry["error"] = type(exc).__name__
            raise
        finally:
            entry["end"] = time.time()
            rec.webhooks.append(entry)

    GroupCommitter.submit = webhook_submit  # type: ignore[method-assign]
    wait_until = agent_actions.wait_until

    async def create_wait(
        rt: Any, op_id: str, who: Any, deadline: float, *a: Any, **kw: Any
    ) -> Any:
        start = time.time()
        op = await wait_until(rt, op_id, who, deadline, *a, **kw)
        if kw.get("current") is not None:  # a create's wait (an agent's own waits read first)
            pending = op.state == State.CREATE_PENDING.value
            rec.posts.append({"start": start, "end": time.time(), "job": not pending})
        return op

    agent_actions.wait_until = create_wait


# --- what the agent and the provider see (any system, no wrapper) -----------------------


@dataclass(frozen=True)
class Waits:
    """A run's waits as its peers see them: the agent's POST and its callback, and the
    provider's webhook deliveries refused (by status)."""

    posts: int
    post_p50: float
    post_p99: float
    callback_p50: float  # create (the POST sent) -> its callback at the receiver
    callback_p90: float
    agent_refused: int  # POSTs answered 503
    webhooks_refused: dict[str, int]  # delivery attempts answered otherwise, by status
    # create -> callback p50 of each fifth of the operations, in the order they were sent:
    # a backlog building up inside shows as a rising trend.
    trend: tuple[float, ...] = ()

    def describe(self) -> str:
        refused = ", ".join(f"{n} x {code}" for code, n in sorted(self.webhooks_refused.items()))
        trend = " ".join(f"{t:.2f}" for t in self.trend)
        return (
            f"POST p50/p99 {self.post_p50 * 1000:.0f}/{self.post_p99 * 1000:.0f} ms  "
            f"create -> callback p50/p90 {self.callback_p50:.2f}/{self.callback_p90:.2f} s "
            f"(by fifths: {trend})  agent 503s {self.agent_refused}  "
            f"webhook deliveries refused: {refused or 'none'}"
        )


def waits(
    timings: list[tuple[str, float, float, int]],
    arrived: dict[str, float],
    webhooks_refused: dict[str, int],
) -> Waits:
    """From the submitter's (operation id, sent, answered, status) and the receiver's
    arrival of each operation's first callback."""
    posts = [answered - sent for _, sent, answered, _ in timings]
    done = sorted(
        (sent, arrived[op] - sent) for op, sent, _, code in timings if code < 300 and op in arrived
    )
    ends = [end for _, end in done]
    fifth = max(1, len(ends) // 5)
    return Waits(
        posts=len(posts),
        post_p50=percentile(posts, 50),
        post_p99=percentile(posts, 99),
        callback_p50=percentile(ends, 50),
        callback_p90=percentile(ends, 90),
        agent_refused=sum(1 for *_, code in timings if code == 503),
        webhooks_refused=dict(webhooks_refused),
        trend=tuple(
            percentile(ends[i : i + fifth], 50) for i in range(0, fifth * 5, fifth) if ends[i:]
        ),
    )


# --- the report -------------------------------------------------------------------------


def _ms(values: list[float], qs: tuple[int, ...] = (50, 90, 99)) -> str:
    if not values:
        return "-"
    shown = "/".join(f"{percentile(values, q) * 1000:.0f}" for q in qs)
    return f"{shown} (max {max(values) * 1000:.0f})"


def _short(state: str, completion: bool) -> str:
    return f"{state}+completion" if completion else state


def report(path: Path, out: Any = None) -> None:
    """The breakdown of one run's records: milliseconds, p50/p90/p99 (max)."""
    data = json.loads(path.read_text("utf-8"))
    lines = ["  stages, ms p50/p90/p99 (max):"]
    lines += _claimed(data["claims"])
    lines += _occupancy(data.get("slots", []), data["steps"], data["ticks"])
    lines += _steps(data["steps"])
    lines += _writes(data["writes"])
    lines += _threads(
        data.get("cpu", []), data.get("runs", []), data["writes"], data.get("waits", [])
    )
    lines += _statements(data.get("statements", []))
    hooks = data["webhooks"]
    refused = sum(1 for h in hooks if "error" in h)
    lines.append(
        f"    webhook wait for its commit  n={len(hooks)} "
        f"{_ms([h['end'] - h['start'] for h in hooks])}  refused {refused}"
    )
    posts = data["posts"]
    got = sum(1 for p in posts if p["job"])
    lines.append(
        f"    POST wait for the job id     n={len(posts)} "
        f"{_ms([p['end'] - p['start'] for p in posts])}  job id within it: {got}"
    )
    print("\n".join(lines), file=out or sys.stdout)


def _claimed(claims: list[dict[str, Any]]) -> list[str]:
    by_state: dict[str, list[float]] = defaultdict(list)
    for c in claims:
        if c["due"] is not None:
            by_state[c["state"]].append(max(0.0, c["at"] - c["due"]))
    return [
        f"    due -> claimed      {state:<22} n={len(lags):<5} {_ms(lags)}"
        for state, lags in sorted(by_state.items())
    ]


def _occupancy(
    slots: list[list[Any]], steps: list[dict[str, Any]], ticks: list[dict[str, Any]]
) -> list[str]:
    """Each share's slots held on average and the time it was full, over the window its
    slots moved in, beside the calls in flight to its party and the claims' own time."""
    if not slots:
        return []
    start, end = slots[0][0], slots[-1][0]
    window = end - start
    if window <= 0:
        return []
    held: dict[str, float] = defaultdict(float)
    full: dict[str, float] = defaultdict(float)
    last: dict[str, tuple[float, int, int]] = {}
    for at, share, used, capacity in slots:
        if share in last:
            since, was, cap = last[share]
            held[share] += was * (at - since)
            if was >= cap:
                full[share] += at - since
        last[share] = (at, used, capacity)
    in_flight: dict[str, float] = defaultdict(float)
    for step in steps:
        for label, _method, began, ended in step["calls"]:
            in_flight[label] += max(0.0, min(ended, end) - max(began, start))
    asked_for: dict[str, float] = defaultdict(float)
    claiming = 0.0
    for t in ticks:
        overlap = max(0.0, min(t["end"], end) - max(t["start"], start))
        claiming += overlap
        for key, n in t["wants"].items():
            asked_for[key] += n * overlap
    claimed = sum(sum(t.get("got", {}).values()) for t in ticks)
    asked = sum(sum(t["wants"].values()) for t in ticks)
    lines = [
        "    shares, slots on average: held by steps + asked for by the claim in flight, "
        "of the capacity; time full (steps alone); calls in flight:"
    ]
    for share in sorted(last):
        party = {":callbacks": "callback", ":hooks": ""}.get(share, "provider")
        calls = f"  {party} calls {in_flight[party] / window:.1f}" if party else ""
        lines.append(
            f"      {share[:24]:<24} {held[share] / window:5.1f} + {asked_for[share] / window:4.1f}"
            f" of {last[share][2]:<3} full {100 * full[share] / window:3.0f}%{calls}"
        )
    lines.append(
        f"    claims: in flight {100 * claiming / window:.0f}% of the time, "
        f"{claimed / max(1, len(ticks)):.1f} operations each of "
        f"{asked / max(1, len(ticks)):.1f} asked for (n={len(ticks)})"
    )
    return lines


def _steps(records: list[dict[str, Any]]) -> list[str]:
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for s in records:
        groups[_short(s["state"], s["completion"])].append(s)
    lines = []
    for name, steps in sorted(groups.items()):
        committed = []
        for s in steps:
            done = [w for w in s["writes"] if "committed" in w]
            if s["calls"] and done:
                committed.append(done[-1]["committed"] - s["calls"][-1][3])
        lines += [
            f"    step {name} (n={len(steps)}):",
            f"      ready -> step start       {_ms([s['start'] - s['ready'] for s in steps])}",
            "      step start -> call        "
            + _ms([s["calls"][0][2] - s["start"] for s in steps if s["calls"]]),
            "      call                      "
            + _ms([c[3] - c[2] for s in steps for c in s["calls"]]),
            f"      call end -> committed     {_ms(committed)}",
            f"      step                      {_ms([s['end'] - s['start'] for s in steps])}",
        ]
    return lines


def _writes(records: list[dict[str, Any]]) -> list[str]:
    kinds: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for w in records:
        kinds[w["kind"]].append(w)
    lines = ["    writes: queue depth p50/p90/max, wait in queue, transaction, back to the loop:"]
    for kind, writes in sorted(kinds.items(), key=lambda kv: -len(kv[1])):
        started = [w for w in writes if "start" in w]
        depth = [float(w["depth"]) for w in writes]
        batch = [float(w["batch"]) for w in started]
        failed = sum(1 for w in writes if "error" in w)
        lines.append(
            f"      {kind[:44]:<44} n={len(writes):<5} depth "
            f"{percentile(depth, 50):.0f}/{percentile(depth, 90):.0f}/{max(depth):.0f}  "
            f"batch {percentile(batch, 50):.0f}" + (f"  FAILED {failed}" if failed else "")
        )
        lines.append(
            f"        wait {_ms([w['start'] - w['queued'] for w in started])}"
            f"  txn {_ms([w['committed'] - w['start'] for w in started])}"
            f"  hop {_ms([w['done'] - w['committed'] for w in started])}"
        )
    return lines


def _threads(
    cpu: list[list[Any]],
    runs: list[list[Any]],
    writes: list[dict[str, Any]],
    waits: list[list[Any]] | None = None,
) -> list[str]:
    """Each thread's cores over the busy window (first write queued to last committed), the
    time it was ready to run but waited for a core (``waits``, sampled with ``cpu``), and
    the writers' share of the window inside a transaction: the part of that neither on a
    core nor waiting for one waited for PostgreSQL's answers or the interpreter lock."""
    started = [w for w in writes if "start" in w]
    if not cpu or not started:
        return []
    begin = min(w["queued"] for w in started)
    end = max(w["committed"] for w in started)
    # The samples that bracket the window (a short run may have none inside it).
    t0, first = max((c for c in cpu if c[0] <= begin), default=cpu[0], key=lambda c: c[0])
    t1, last = min((c for c in cpu if c[0] >= end), default=cpu[-1], key=lambda c: c[0])
    wall = t1 - t0
    if wall <= 0:
        return []
    in_txn: dict[str, float] = defaultdict(float)
    for name, start, stop in runs:
        in_txn[name] += max(0.0, min(stop, t1) - max(start, t0))
    busy = {name: (last[name] - first.get(name, 0.0)) / wall for name in last}
    waited_at = {at: by_name for at, by_name in waits or ()}
    w0, w1 = waited_at.get(t0), waited_at.get(t1)
    waited = (
        {name: max(0.0, w1[name] - w0.get(name, 0.0)) / wall for name in w1}
        if w0 is not None and w1
        else {}
    )
    head = "cores busy, waiting for a core" if waited else "cores busy"
    lines = [f"    threads over {wall:.1f} s of load, {head} (writers: time in a transaction):"]
    shown = sorted((n for n in busy if busy[n] >= 0.01 or n in in_txn), key=lambda n: -busy[n])
    rest = sum(b for n, b in busy.items() if n not in shown)
    for name in shown:
        wait = f"  {waited.get(name, 0.0):.2f}" if waited else ""
        txn = f"  (in a transaction {in_txn[name] / wall:.2f})" if name in in_txn else ""
        lines.append(f"      {name[:28]:<28} {busy[name]:.2f}{wait}{txn}")
    for name in sorted(set(in_txn) - set(busy)):  # writers on the loop: its thread's cores
        lines.append(f"      {name[:28]:<28} {'':>4}  (in a transaction {in_txn[name] / wall:.2f})")
    total = f", waiting for a core {sum(waited.values()):.2f}" if waited else ""
    lines.append(f"      {'all others':<28} {rest:.2f}   process {sum(busy.values()):.2f}{total}")
    return lines


# A statement slower than this, on a writer thread, is the tail the report sizes.
SLOW_STATEMENT_SECONDS = 0.002


def _statements(records: list[list[float]]) -> list[str]:
    """The writers' statements: wall time, time on a core, and the share of the writers'
    statement time spent in the slow tail."""
    if not records:
        return []
    walls = [wall for wall, _ in records]
    total = sum(walls)
    slow = [wall for wall in walls if wall > SLOW_STATEMENT_SECONDS]
    on_core = sum(cpu for _, cpu in records) / len(records)
    shown = "/".join(f"{percentile(walls, q) * 1000:.2f}" for q in (50, 90, 99))
    return [
        f"    writer statements n={len(walls)} {shown} (max {max(walls) * 1000:.0f}), mean "
        f"{total / len(walls) * 1000:.2f} ms, on a core {on_core * 1000:.2f} ms each; "
        f"over {SLOW_STATEMENT_SECONDS * 1000:g} ms: {100 * len(slow) / len(walls):.0f}% "
        f"of them, {100 * sum(slow) / max(total, 1e-9):.0f}% of the time"
    ]


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    report(Path(sys.argv[1]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
