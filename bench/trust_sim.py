"""A fleet of jobs sharing one provider's webhook health, on a virtual clock.

Used by ``bench/poller.py`` (part c). Every poll is decided by the real decision core
(``core.next_read.first_poll``, ``core.poll.before_request``, ``decide``, ``restore``) and every
completion judged and counted by the real trust core (``core.trust``), with the
shell's rules modelled as the service applies them:

* a verified webhook marks the operation hinted and makes its next read due at once;
* the read that confirms an end is webhook-first when a webhook was stored before it,
  otherwise pending until the grace is over (judged one tick later, as the keeper runs
  once a tick), then late or a miss;
* on the distrust transition every stretched wait is brought back (``restore``),
  spread by ``core.trust.spread`` within the provider concurrency.

Jobs arrive as a Poisson stream (a service in steady state, not one burst), so the
provider's health evolves while they run. Nothing sleeps.
"""

from __future__ import annotations

import heapq
import itertools
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from reconciler.core import next_read as schedule
from reconciler.core import poll as decisions
from reconciler.core import poll_values as values
from reconciler.core import trust as core
from reconciler.core.vocabulary import DelaySource, RemoteCategory

EPOCH = datetime(2025, 4, 18, 10, 20, tzinfo=UTC)
TICK = timedelta(seconds=1.0)


@dataclass(frozen=True)
class Regime:
    name: str
    lost_from: float | None = None  # webhooks lost for jobs ending in [lost_from, lost_until)
    lost_until: float | None = None

    def delivered(self, end: float) -> bool:
        if self.lost_from is None:
            return True
        until = self.lost_until if self.lost_until is not None else float("inf")
        return not (self.lost_from <= end < until)


@dataclass
class Job:
    index: int
    arrival: float
    duration: float
    record: values.PollRecord
    next_read: datetime | None = None
    source: DelaySource = DelaySource.LOCAL_BACKOFF
    hint_at: datetime | None = None  # a valid provider hint's moment (none in this fleet)
    hinted_at: datetime | None = None
    last_read: datetime | None = None
    reads: int = 0
    confirmed_at: float | None = None
    outcome: str | None = None
    version: int = 0  # bumps when the scheduled read changes, so stale events are skipped

    @property
    def end(self) -> float:
        return self.arrival + self.duration


@dataclass
class Transition:
    at: float
    before: str
    after: str
    verdict: str
    job: int


@dataclass
class FleetResult:
    regime: str
    mode: str
    jobs: list[Job]
    transitions: list[Transition] = field(default_factory=list)
    restored: int = 0
    first_miss_read: float | None = None  # when the first miss's read found the end

    @property
    def completed(self) -> list[Job]:
        return [j for j in self.jobs if j.outcome == "collect"]

    @property
    def mean_reads(self) -> float:
        done = self.completed
        return statistics.fmean(j.reads for j in done) if done else float("nan")

    def stopped(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for j in self.jobs:
            if j.outcome != "collect":
                key = j.outcome or "unfinished"
                out[key] = out.get(key, 0) + 1
        return out


def arrivals(count: int, mean_gap: float, rng: random.Random) -> list[float]:
    at, out = 0.0, []
    for _ in range(count):
        out.append(at)
        at += rng.expovariate(1.0 / mean_gap)
    return out


def _t(seconds: float) -> datetime:
    return EPOCH + timedelta(seconds=seconds)


def _s(moment: datetime) -> float:
    return (moment - EPOCH).total_seconds()


class Fleet:
    """One run: one regime, one mode (trust adaptive or off)."""

    def __init__(
        self,
        durations: Sequence[float],
        starts: Sequence[float],
        regime: Regime,
        *,
        adaptive: bool,
        policy: values.PollPolicy,
        trust: core.TrustPolicy,
        limits: tuple[float, int, int],
        concurrency: int,
        seed: int,
    ) -> None:
        self.regime = regime
        self.adaptive = adaptive
        self.policy = (
            policy
            if adaptive
            else replace(policy, trusted_max_delay_seconds=None, final_look_seconds=None)
        )
        self.trust = trust
        self.concurrency = concurrency
        self.rng = random.Random(seed)
        deadline, budget, failures = limits
        self.jobs = [
            Job(
                i,
                start,
                duration,
                values.PollRecord(
                    deadline_at=_t(start + deadline),
                    accepted_at=_t(start),
                    max_status_requests=budget,
                    status_requests_used=0,
                    max_transport_failures=failures,
                ),
            )
            for i, (start, duration) in enumerate(zip(starts, durations, strict=True))
        ]
        self.health = core.Health()
        self.result = FleetResult(
            regime.name, "trust adaptive" if adaptive else "trust off", self.jobs
        )
        self._events: list[tuple[datetime, int, str, int, int]] = []
        self._seq = itertools.count()

    # --- the event queue -------------------------------------------------------------------

    def _push(self, at: datetime, kind: str, job: int, version: int = 0) -> None:
        heapq.heappush(self._events, (at, next(self._seq), kind, job, version))

    def _schedule(self, job: Job, at: datetime, source: DelaySource) -> None:
        job.version += 1
        job.next_read, job.source = at, source
        self._push(at, "read", job.index, job.version)

    @property
    def trusted(self) -> bool:
        return self.adaptive and self.health.state is core.TrustState.TRUSTED

    def run(self) -> FleetResult:
        for job in self.jobs:
            self._push(_t(job.arrival), "create", job.index)
            if self.regime.delivered(job.end):
                self._push(_t(job.end), "webhook", job.index)
        while self._events:
            at, _, kind, index, version = heapq.heappop(self._events)
            job = self.jobs[index]
            if kind == "create":
                first, source = schedule.first_poll(
                    at, job.record.deadline_at, self.rng, self.policy, trusted=self.trusted
                )
                self._schedule(job, first, source)
            elif kind == "webhook":
                self._webhook(job, at)
            elif kind == "read" and version == job.version and job.outcome is None:
                self._read(job, at)
            elif kind == "settle":
                self._settle(job, at)
        return self.result

    # --- what the shell does ---------------------------------------------------------------

    def _webhook(self, job: Job, at: datetime) -> None:
        job.hinted_at = job.hinted_at or at
        if job.outcome is None and job.next_read is not None:
            self._schedule(job, at, DelaySource.WEBHOOK_HINT)

    def _read(self, job: Job, now: datetime) -> None:
        stop = decisions.before_request(job.record, now)
        if stop is not None:
            job.outcome = (
                "result_timed_out"
                if stop.reason.value == "deadline_exceeded"
                else stop.reason.value
            )
            return
        job.record = replace(job.record, status_requests_used=job.record.status_requests_used + 1)
        job.reads += 1
        done = now >= _t(job.end)
        obs = values.Observation(
            at=now,
            http_status=200,
            category=RemoteCategory.SUCCESS if done else RemoteCategory.PENDING,
            remote_state="succeeded" if done else "running",
            required_fields_ok=done,
        )
        decision = decisions.decide(
            job.record, obs, now, self.rng, self.policy, trusted=self.trusted
        )
        job.last_read = now
        if isinstance(decision, values.Collect):
            job.outcome, job.confirmed_at = "collect", _s(now)
            self._judge(job, now)
            return
        if not isinstance(decision, values.Wait):
            reason = getattr(decision, "reason", None)
            job.outcome = reason.value if reason is not None else type(decision).__name__
            return
        c = decision.counters
        job.record = replace(
            job.record,
            poll_attempt=c.poll_attempt,
            transport_failures_used=c.transport_failures_used,
            rate_limited_count=c.rate_limited_count,
            hinted=False,
        )
        if c.hint_consumed:
            job.hinted_at = None
        job.hint_at = decision.hint_at
        self._schedule(job, decision.at, decision.source)

    def _judge(self, job: Job, now: datetime) -> None:
        if not self.adaptive:
            return
        verdict = core.judge_read(job.hinted_at, now)
        if verdict is core.Verdict.WEBHOOK_FIRST:
            self._count(job, verdict, now)
            return
        # Judged by the keeper in the first tick after the grace is over.
        self._push(core.settle_after(now, self.trust) + TICK, "settle", job.index)

    def _settle(self, job: Job, now: datetime) -> None:
        assert job.confirmed_at is not None
        asked = _t(job.confirmed_at)
        webhook = _t(job.end) if self.regime.delivered(job.end) else None
        # The job ended, the read found it, and only then did a webhook arrive: late.
        verdict = core.settle(asked, webhook, core.settle_after(asked, self.trust))
        if verdict is core.Verdict.MISS and self.result.first_miss_read is None:
            self.result.first_miss_read = job.confirmed_at
        self._count(job, verdict, now)

    def _count(self, job: Job, verdict: core.Verdict, now: datetime) -> None:
        self.health, change = core.count(self.health, verdict, f"job {job.index}", now, self.trust)
        if change is None:
            return
        self.result.transitions.append(
            Transition(_s(now), change.before.value, change.after.value, verdict.value, job.index)
        )
        if change.distrusted:
            self._restore(now)

    def _restore(self, now: datetime) -> None:
        stretched = [
            j for j in self.jobs if j.outcome is None and j.source is DelaySource.WEBHOOK_TRUST
        ]
        slots = core.spread(
            len(stretched), now, self.policy.backoff.base_seconds, self.concurrency, self.rng
        )
        for job, slot in zip(stretched, slots, strict=True):
            assert job.next_read is not None
            back = schedule.restore(
                job.record,
                job.last_read or _t(job.arrival),
                job.next_read,
                job.hint_at,
                None,
                slot,
                now,
                self.rng,
                self.policy,
            )
            self._schedule(job, back.at, back.source)
        self.result.restored += len(stretched)
