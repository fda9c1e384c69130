"""The soak's verdict: invariants as counts that must be zero, and the run's figures.

The inputs are plain snapshots taken after the run has settled and every process
has stopped: the database (operations, escalations, completion steps, ``step_done``
history entries, stored webhook event ids), the simulated provider (jobs per
idempotency key, every request with its time, answer and Retry-After, every webhook
delivery attempt with its HTTP status), the callback receiver's log and the hook
log. The checks are pure functions of those values.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import Any

import sqlalchemy as sa
from bench.soak_infra import Delivery
from bench.soak_load import OpRecord
from tests.support.hooks import HookRun

from reconciler.core.states import END_STATES, State
from reconciler.engine.steps.complete import CALLBACK_STEP
from reconciler.storage.database import Database
from reconciler.storage.tables import ESCALATIONS, EVENTS, HISTORY, OPS, STEPS, VERDICTS

END = frozenset(s.value for s in END_STATES)
PROVIDER_END = {
    "succeeded": {"succeeded"},
    "completed_with_errors": {"completed_with_errors"},
    "failed": {"failed", "expired"},
    "cancelled": {"cancelled"},
}
PROVIDER_TERMINAL = frozenset(
    {"succeeded", "completed_with_errors", "failed", "cancelled", "expired"}
)


# --- snapshots -----------------------------------------------------------------------


@dataclass(frozen=True)
class OpRow:
    id: str
    state: str
    idempotency_key: str | None
    token: str
    remote_job_id: str | None
    created_at: float
    done_at: float | None
    deadline_at: float
    cancel_deadline_at: float | None
    max_status_requests: int
    status_requests_used: int
    escalation_id: int | None
    completion_pending: bool
    callback_url: str | None
    error: Any


@dataclass(frozen=True)
class StepRow:
    op_id: str
    round: int
    step: str
    status: str
    attempts: int
    key: str


@dataclass(frozen=True)
class DbSnapshot:
    ops: dict[str, OpRow]
    escalations: dict[int, tuple[str, bool]]  # id -> (reason, decided)
    steps: list[StepRow]
    step_done: list[tuple[str, str, int]]  # (op id, step, the attempt that finished)
    event_ids: frozenset[str]
    # Webhook trust: completions by verdict, and stretched waits brought back on distrust.
    verdicts: Mapping[str, int] = field(default_factory=dict)
    trust_withdrawn: int = 0
    # Operations given their one status read after an outage of ours (or a restart) covered
    # the deadline: that read may come after the deadline and past the budget, by one.
    recovery_looks: frozenset[str] = frozenset()
    # When the service sent each status read whose answer it recorded (its own clock, from
    # the history): a read that reached the provider late is judged by when it was sent.
    status_sent: Mapping[str, tuple[float, ...]] = field(default_factory=dict)


def _ts(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def read_db(url: str) -> DbSnapshot:
    db = Database(url)
    try:
        with db.read() as conn:
            ops = {
                r.id: OpRow(
                    r.id,
                    r.state,
                    r.idempotency_key,
                    r.idempotency_token,
                    r.remote_job_id,
                    r.created_at.timestamp(),
                    _ts(r.done_at),
                    r.deadline_at.timestamp(),
                    _ts(r.cancel_deadline_at),
                    r.max_status_requests,
                    r.status_requests_used,
                    r.escalation_id,
                    bool(r.completion_pending),
                    r.callback_url,
                    r.error,
                )
                for r in conn.execute(sa.select(OPS))
            }
            escalations = {
                r.id: (r.reason, r.decided_at is not None)
                for r in conn.execute(sa.select(ESCALATIONS))
            }
            steps = [
                StepRow(r.operation_id, r.round, r.step, r.status, r.attempts, r.idempotency_key)
                for r in conn.execute(sa.select(STEPS))
            ]
            done = conn.execute(
                sa.select(HISTORY.c.operation_id, HISTORY.c.cause, HISTORY.c.detail).where(
                    HISTORY.c.kind == "step", HISTORY.c.cause.like("step_done:%")
                )
            )
            step_done = [
                (r.operation_id, r.cause.removeprefix("step_done:"), int(r.detail["attempt"]))
                for r in done
            ]
            events = frozenset(r.event_id for r in conn.execute(sa.select(EVENTS.c.event_id)))
            verdicts = {
                str(v): int(n)
                for v, n in conn.execute(
                    sa.select(VERDICTS.c.verdict, sa.func.count()).group_by(VERDICTS.c.verdict)
                )
            }
            withdrawn = conn.execute(
                sa.select(sa.func.count()).where(HISTORY.c.cause == "webhook_trust_withdrawn")
            ).scalar_one()
            notes = conn.execute(
                sa.select(HISTORY.c.operation_id, HISTORY.c.detail).where(
                    HISTORY.c.kind == "note", HISTORY.c.cause == "storage_outage"
                )
            )
            looks = frozenset(
                r.operation_id
                for r in notes
                if isinstance(r.detail, dict) and r.detail.get("recovery_look")
            )
            reads = conn.execute(
                sa.select(HISTORY.c.operation_id, HISTORY.c.detail).where(
                    HISTORY.c.kind == "observation", HISTORY.c.cause == "status_read"
                )
            )
            sent: dict[str, list[float]] = {}
            for r in reads:
                at = r.detail.get("sent_at") if isinstance(r.detail, dict) else None
                if at is not None:
                    sent.setdefault(r.operation_id, []).append(
                        datetime.fromisoformat(at).timestamp()
                    )
    finally:
        db.dispose()
    return DbSnapshot(
        ops,
        escalations,
        steps,
        step_done,
        events,
        verdicts,
        int(withdrawn),
        looks,
        {op_id: tuple(sorted(times)) for op_id, times in sent.items()},
    )


@dataclass(frozen=True)
class Req:
    at: float
    answered_at: float | None
    status: int | None
    retry_after: str | None


@dataclass(frozen=True)
class JobView:
    job_id: str
    key: str
    state: str
    created_at: float
    final_at: float | None  # when the provider reached a terminal state
    status: tuple[Req, ...]


@dataclass(frozen=True)
class SimSnapshot:
    jobs: dict[str, JobView]
    keys: dict[str, list[str]]
    delivered_ok: frozenset[str]  # event ids some attempt got a 2xx for
    delivery_attempts: int
    requests_by_endpoint: dict[str, Counter[str]]


def read_sim(
    jobs: Sequence[Mapping[str, Any]], stats: Mapping[str, Any], deliveries: Mapping[str, Any]
) -> SimSnapshot:
    """From the control API: ``/_sim/jobs``, ``/_sim/stats`` and ``/_sim/deliveries``."""
    views: dict[str, JobView] = {}
    keys: dict[str, list[str]] = defaultdict(list)
    for job in sorted(jobs, key=lambda j: j["created_at"]):
        final = next((t["at"] for t in job["timeline"] if t["state"] in PROVIDER_TERMINAL), None)
        status = tuple(
            Req(r["at"], r.get("answered_at"), r["status"], r.get("retry_after"))
            for r in sorted(job["requests"]["status"], key=lambda r: r["at"])
        )
        views[job["job_id"]] = JobView(
            job["job_id"], job["idempotency_key"], job["state"], job["created_at"], final, status
        )
        keys[job["idempotency_key"]].append(job["job_id"])
    attempts = deliveries["attempts"]
    return SimSnapshot(
        views,
        dict(keys),
        frozenset(a["event_id"] for a in attempts if a["ok"]),
        len(attempts),
        {ep: Counter(c) for ep, c in stats["requests"].items()},
    )


# --- invariants ----------------------------------------------------------------------


@dataclass
class Invariant:
    name: str
    what: str
    breaches: list[str] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.breaches)


@dataclass(frozen=True)
class Tolerances:
    deadline: float = 0.5  # seconds a request may reach the provider after the deadline check
    retry_after: float = 0.05


def jobs_per_key(db: DbSnapshot, sim: SimSnapshot) -> Invariant:
    inv = Invariant(
        "provider jobs per idempotency key above one",
        "provider jobs beyond the first, per idempotency token the service sent and per "
        "agent idempotency key (over all its operations)",
    )
    for token, job_ids in sim.keys.items():
        inv.breaches += [f"token {token}: job {j} is extra" for j in job_ids[1:]]
    jobs_by_agent_key: dict[str, set[str]] = defaultdict(set)
    ops_by_agent_key: Counter[str] = Counter()
    for op in db.ops.values():
        if op.idempotency_key is None:
            continue
        ops_by_agent_key[op.idempotency_key] += 1
        jobs_by_agent_key[op.idempotency_key].update(sim.keys.get(op.token, []))
    for key, jobs in sorted(jobs_by_agent_key.items()):
        if len(jobs) > 1 and ops_by_agent_key[key] > 1:
            inv.breaches.append(
                f"agent key {key}: {len(jobs)} jobs over {ops_by_agent_key[key]} ops"
            )
    tokens = {op.token for op in db.ops.values()}
    inv.breaches += [
        f"job {j} was created with token {t}, which no operation holds"
        for t, job_ids in sim.keys.items()
        if t not in tokens
        for j in job_ids
    ]
    return inv


def lost_jobs(db: DbSnapshot, sim: SimSnapshot) -> Invariant:
    inv = Invariant(
        "provider jobs the service lost track of",
        "a job exists for an operation's token but the operation names another job, or names "
        "none and is not escalated",
    )
    for op in db.ops.values():
        jobs = sim.keys.get(op.token, [])
        if not jobs:
            continue
        if op.remote_job_id is not None and op.remote_job_id not in jobs:
            inv.breaches.append(f"{op.id}: records {op.remote_job_id}, provider made {jobs}")
        elif op.remote_job_id is None and not _escalated(db, op):
            inv.breaches.append(f"{op.id} ({op.state}): job {jobs[0]} exists, none recorded")
    return inv


def _escalated(db: DbSnapshot, op: OpRow) -> bool:
    if op.escalation_id is None:
        return False
    reason, decided = db.escalations.get(op.escalation_id, ("", True))
    return bool(reason) and not decided


@dataclass(frozen=True)
class StepCheck:
    """Runs of one completion step, from three witnesses: the step row, its history and the
    step's own log (hook log lines of finished runs, callback requests the receiver got)."""

    key: str
    op_id: str
    step: str
    status: str
    attempts: int  # times the service marked the step running; every run follows one
    recorded_done: int  # step_done history entries
    done_attempt: int | None  # the attempt the (first) step_done entry names
    runs: int  # finished hook runs / callback requests that arrived
    effective_runs: int  # runs that had their effect: finished hook runs / 2xx callbacks

    @property
    def started_after_done(self) -> int:
        """Starts after the step was recorded done (each one is a run of a finished step)."""
        if self.done_attempt is None:
            return 0
        return max(0, self.attempts - self.done_attempt)


def step_checks(
    db: DbSnapshot, hook_runs: Sequence[HookRun], deliveries: Sequence[Delivery]
) -> list[StepCheck]:
    finished = Counter(run.key for run in hook_runs if not run.started)
    done: dict[tuple[str, str], list[int]] = defaultdict(list)
    for op_id, step, attempt in db.step_done:
        done[(op_id, step)].append(attempt)
    arrived: Counter[str] = Counter()
    acknowledged: Counter[str] = Counter()
    for delivery in deliveries:
        arrived[delivery.webhook_id] += 1
        if 200 <= delivery.status < 300 and not delivery.hung:
            acknowledged[delivery.webhook_id] += 1
    checks = []
    for row in db.steps:
        attempts_done = sorted(done.get((row.op_id, row.step), []))
        if row.step == CALLBACK_STEP:
            webhook_id = row.op_id if row.round <= 1 else f"{row.op_id}_r{row.round}"
            runs, effective = arrived[webhook_id], acknowledged[webhook_id]
        else:
            runs = effective = finished.get(row.key, 0)
        checks.append(
            StepCheck(
                row.key,
                row.op_id,
                row.step,
                row.status,
                row.attempts,
                len(attempts_done),
                attempts_done[0] if attempts_done else None,
                runs,
                effective,
            )
        )
    return checks


def steps_run_twice(checks: Sequence[StepCheck], hook_runs: Sequence[HookRun]) -> Invariant:
    inv = Invariant(
        "completion steps run more than once",
        "a finished step ran again: it was recorded done more than once (step_done entries), "
        "or started again after the attempt recorded done, or it ran more often than the "
        "service started it (hook log lines / callback requests > attempts). A re-run of a "
        "step that a SIGKILL (or a lost lease) interrupted before it was recorded done is the "
        "documented at-least-once case with the same idempotency key and is not counted",
    )
    known = {c.key for c in checks}
    for c in checks:
        if c.recorded_done > 1:
            inv.breaches.append(f"{c.key}: recorded done {c.recorded_done} times")
        elif c.started_after_done:
            inv.breaches.append(f"{c.key}: started {c.started_after_done}x after it was done")
        elif c.runs > c.attempts:
            inv.breaches.append(f"{c.key}: {c.runs} runs for {c.attempts} attempts")
    strays = Counter(r.key for r in hook_runs if not r.started and r.key not in known)
    inv.breaches += [f"{key}: {n} runs without a step row" for key, n in strays.items()]
    return inv


def unfinished(db: DbSnapshot) -> Invariant:
    inv = Invariant(
        "operations neither in an end state nor escalated with a reason",
        "operations still working (or escalated without an open escalation) after the run settled",
    )
    for op in db.ops.values():
        if op.state in END:
            continue
        if op.state == State.ESCALATED.value and _escalated(db, op):
            continue
        inv.breaches.append(f"{op.id}: {op.state}")
    return inv


def completion_unfinished(db: DbSnapshot, checks: Sequence[StepCheck]) -> Invariant:
    inv = Invariant(
        "end states whose completion did not finish",
        "operations in an end state with the completion handler still pending, or a step "
        "left neither done nor given up",
    )
    inv.breaches += [
        f"{op.id}: {op.state}, completion pending"
        for op in db.ops.values()
        if op.state in END and op.completion_pending
    ]
    inv.breaches += [f"{c.key}: {c.status}" for c in checks if c.status not in ("done", "gave_up")]
    return inv


def webhooks_lost(db: DbSnapshot, sim: SimSnapshot) -> Invariant:
    inv = Invariant(
        "webhooks answered 2xx but absent from the database",
        "event ids the service acknowledged with a 2xx that are not in webhook_events",
    )
    inv.breaches += sorted(sim.delivered_ok - db.event_ids)
    return inv


def _job_of(db: DbSnapshot, sim: SimSnapshot) -> Iterable[tuple[OpRow, JobView]]:
    for op in db.ops.values():
        for job_id in sim.keys.get(op.token, []):
            yield op, sim.jobs[job_id]


# A status read arrives within its timeout of being sent (5 s in the soak's provider file,
# doubled for slack); the service and the simulator read the same machine's clock.
STATUS_TRANSIT = 10.0
CLOCK_SLACK = 0.05


def past_deadline(db: DbSnapshot, sim: SimSnapshot, tol: Tolerances) -> tuple[Invariant, float]:
    inv = Invariant(
        "status requests past the operation's deadline",
        f"status requests that reached the provider more than {tol.deadline:g} s after the "
        "deadline (the cancellation window when a cancel was sent), beyond the one recorded "
        "recovery read after an outage of ours covered the deadline and the one last look "
        "after a cancellation window",
    )
    worst = -math.inf
    for op, job in _job_of(db, sim):
        until = op.deadline_at
        if op.cancel_deadline_at is not None:
            until = max(until, op.cancel_deadline_at)
        sends = list(db.status_sent.get(op.id, ()))
        late = []
        for req in job.status:
            worst = max(worst, req.at - until)
            sent = _sent_for(sends, req.at)
            # Judged by when the service sent it where its answer was recorded: the time
            # between our check and the provider's arrival is the machine's, not a decision.
            if (sent if sent is not None else req.at) > until + tol.deadline:
                late.append((req, sent))
        # One read may follow by design: the recorded recovery read after an outage of ours
        # covered the deadline, and the last look after a cancellation window closed (it
        # may show the cancel landed), whenever the service is next up to make it.
        allowed = (op.id in db.recovery_looks) + (op.cancel_deadline_at is not None)
        late = late[allowed:]
        for req, sent in late:
            when = f", sent {sent - until:.2f} s after" if sent is not None else ""
            inv.breaches.append(f"{op.id}: status request {req.at - until:.2f} s late{when}")
    return inv, worst


def _sent_for(sends: list[float], arrived: float) -> float | None:
    """The recorded send this arrival belongs to (the latest one before it, each used once);
    ``None`` when the answer went unrecorded (the service was killed while it asked)."""
    earlier = [s for s in sends if arrived - STATUS_TRANSIT <= s <= arrived + CLOCK_SLACK]
    if not earlier:
        return None
    sent = max(earlier)
    sends.remove(sent)
    return sent


def over_budget(db: DbSnapshot, sim: SimSnapshot) -> Invariant:
    inv = Invariant(
        "status requests beyond the operation's budget",
        "status requests the provider received beyond max_status_requests, and operations "
        "whose charged count is lower than what the provider saw",
    )
    for op, job in _job_of(db, sim):
        seen = len(job.status)
        budget = op.max_status_requests + (1 if op.id in db.recovery_looks else 0)
        if seen > budget:
            inv.breaches.append(f"{op.id}: {seen} status requests, budget {budget}")
        elif seen > op.status_requests_used:
            inv.breaches.append(f"{op.id}: provider saw {seen}, charged {op.status_requests_used}")
    return inv


def retry_after_until(req: Req) -> float | None:
    """The earliest moment the provider allowed the next request, by its Retry-After."""
    value = (req.retry_after or "").strip()
    if not value:
        return None
    if value.isdigit():
        return req.at + int(value)
    try:
        return parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None


def before_retry_after(sim: SimSnapshot, tol: Tolerances) -> Invariant:
    inv = Invariant(
        "status requests earlier than a Retry-After",
        "a status request for a job sent after the client had a Retry-After answer for that "
        f"job and before the time it named (tolerance {tol.retry_after:g} s)",
    )
    for job in sim.jobs.values():
        for i, req in enumerate(job.status):
            until = retry_after_until(req)
            if until is None:
                continue
            known = req.answered_at if req.answered_at is not None else req.at
            for nxt in job.status[i + 1 :]:
                if nxt.at < known:
                    continue  # in flight before the answer came back
                if nxt.at < until - tol.retry_after:
                    inv.breaches.append(
                        f"{job.job_id}: request {until - nxt.at:.2f} s before the Retry-After"
                    )
                break
    return inv


def contradicts_provider(db: DbSnapshot, sim: SimSnapshot) -> Invariant:
    inv = Invariant(
        "end states that contradict the provider",
        "succeeded / completed_with_errors / failed / cancelled while the provider's job "
        "ended otherwise",
    )
    for op in db.ops.values():
        allowed = PROVIDER_END.get(op.state)
        if allowed is None:
            continue
        jobs = [sim.jobs[j] for j in sim.keys.get(op.token, [])]
        if not jobs:
            no_job_ok = op.state in ("cancelled", "failed")
            if not no_job_ok:
                inv.breaches.append(f"{op.id}: {op.state} without any provider job")
            continue
        job = next((j for j in jobs if j.job_id == op.remote_job_id), jobs[0])
        if job.state not in allowed:
            inv.breaches.append(f"{op.id}: {op.state}, provider job {job.job_id} is {job.state}")
    return inv


GAVE_UP = "gave up"


def agent_answers(records: Sequence[OpRecord]) -> Invariant:
    inv = Invariant(
        "agent requests answered wrongly",
        "a repeated idempotency key that returned another operation, or a create/cancel "
        "refused with a 4xx (requests that found no replica up for the whole retry window are "
        "counted among the figures instead)",
    )
    for rec in records:
        if rec.resubmitted_id is not None and rec.resubmitted_id != rec.op_id:
            inv.breaches.append(f"{rec.plan.key}: {rec.op_id} then {rec.resubmitted_id}")
        inv.breaches += [f"{rec.plan.key}: {e}" for e in rec.errors if GAVE_UP not in e]
    return inv


def agent_gave_up(records: Sequence[OpRecord]) -> int:
    return sum(1 for rec in records for e in rec.errors if GAVE_UP in e)


def audit_failures(returncode: int, output: str) -> Invariant:
    inv = Invariant(
        "reconciler audit verify failures", "a non-zero exit of `reconciler audit verify`"
    )
    if returncode != 0:
        inv.breaches.append(output.splitlines()[-1] if output else f"exit {returncode}")
    return inv


# --- figures --------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


@dataclass(frozen=True)
class Figures:
    operations: int
    seconds: float
    ops_per_second: float
    status_requests: int
    status_per_op: float
    lags: tuple[float, ...]
    states: Mapping[str, int]
    escalation_reasons: Mapping[str, int]
    reruns_after_interruption: int
    webhook_attempts: int
    callback_deliveries: int
    requests: Mapping[str, Mapping[str, int]]


def figures(
    db: DbSnapshot,
    sim: SimSnapshot,
    checks: Sequence[StepCheck],
    deliveries: Sequence[Delivery],
    started: float,
) -> Figures:
    ops = list(db.ops.values())
    last = max((op.done_at or op.created_at for op in ops), default=started)
    seconds = max(1e-9, last - started)
    status = sum(len(j.status) for j in sim.jobs.values())
    lags = []
    for op, job in _job_of(db, sim):
        if op.done_at is not None and job.final_at is not None and op.state in PROVIDER_END:
            lags.append(op.done_at - job.final_at)
    reasons: Counter[str] = Counter()
    for op in ops:
        if op.escalation_id is not None:
            reasons[db.escalations.get(op.escalation_id, ("?", False))[0]] += 1
    return Figures(
        operations=len(ops),
        seconds=seconds,
        ops_per_second=len(ops) / seconds,
        status_requests=status,
        status_per_op=status / max(1, len(ops)),
        lags=tuple(sorted(lags)),
        states=dict(Counter(op.state for op in ops)),
        escalation_reasons=dict(reasons),
        reruns_after_interruption=sum(
            1 for c in checks if c.effective_runs > 1 and c.recorded_done == 1
        ),
        webhook_attempts=sim.delivery_attempts,
        callback_deliveries=len(deliveries),
        requests={k: dict(v) for k, v in sim.requests_by_endpoint.items()},
    )


def lag_line(lags: Sequence[float]) -> str:
    if not lags:
        return "no operations with a provider end and a matching end state"
    parts = [f"p{q} {percentile(lags, q):.2f} s" for q in (50, 90, 99)]
    return f"{', '.join(parts)}, max {max(lags):.2f} s (n={len(lags)})"
