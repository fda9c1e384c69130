"""The demo's batch, planned (pure): which scenarios, in what order, on which provider.

Two simulated providers (``reconciler.demo.sim``) take the batch: ``sim`` announces its
jobs' ends by webhook, ``sim-lossy`` loses or lies about them. Each scenario is a create
body for the simulator with the end it must reach (``EXPECTED_ENDS``); a seeded RNG picks
the mix and the order, so one seed is one batch.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# Two simulated providers, each its own process and its own webhook trust: one announces
# its jobs' ends by webhook (it earns trust, and its jobs cost one read each), the other
# loses or lies about them (its misses distrust it, and its jobs are polled normally).
# On one provider, a lost webhook under trust is found only by the final look before
# the deadline (a minute late here), and every loss costs the healthy jobs their trust.
PROVIDER = "sim"
LOSSY_PROVIDER = "sim-lossy"
LOSSY_DESCRIPTION = (
    "The same simulated job provider as sim, with the same request, but this one loses or "
    "lies about its jobs' webhooks: the service polls it on its normal schedule, so its "
    "jobs are seen finished later than sim's. Use sim unless you want to see that."
)
PROVIDERS = (PROVIDER, LOSSY_PROVIDER)
# The demo's own polling values: short enough for a one-minute run, long enough that
# webhooks (not the fallback poller) bring most answers.
DEMO_POLLING = {
    "base_delay_seconds": 1.0,
    "max_delay_seconds": 10.0,
    "jitter_floor": 0.5,
    "deadline_seconds": 60,
    "max_status_requests": 30,
    "max_transport_failures": 5,
    "max_rate_limited": 4,
    "rate_limit_delay_seconds": 2.0,
    # Webhook trust, scaled to a one-minute run: trust is earned after 6 webhook-first
    # completions (the default 20 would take most of the batch) and a webhook may come up
    # to 3 s after a read found the end before it counts as a miss.
    "trust_after": 6,
    "webhook_grace_seconds": 3,
}
# The batch goes in two waves. The first is a warm-up: WARMUP_COUNT jobs whose provider
# announces their end by webhook (enough webhook-first completions to earn trust), plus
# the rate-limit storm, whose 429s must meet the normal schedule to escalate as
# rate_limited rather than run into its deadline. The second, everything else, is sent
# once the provider is trusted (or after demo.driver's TRUST_WAIT_SECONDS without): its
# healthy jobs then cost one confirmation read each, and its first lost webhook shows
# the outage response (distrust, stretched waits brought back) and the final look.
WARMUP_KINDS = ("webhooks_delivered", "webhooks_duplicated")
WARMUP_COUNT = 8
ALWAYS_FIRST = frozenset({"rate_limit_storm"})
# --quick: one short operation per path the summary checks (a webhook that arrives, a
# lost one found by polling, an escalation, a cancel), a repeated key, the MCP job and
# the audit; no job runs longer than QUICK_SECONDS (a cancel ends its own).
QUICK_KINDS = ("webhooks_delivered", "webhooks_lost", "unknown_state", "cancelled")
QUICK_SECONDS = 3.0


def _secs(rng: random.Random, low: float, high: float) -> float:
    return round(rng.uniform(low, high), 1)


def _job(scenario: str, rng: random.Random, low: float, high: float, **knobs: Any) -> Any:
    # The demo's provider announces a job's end by webhook, not its start: a "running"
    # event would bring one more (pending) read forward per job, whatever the trust.
    return {
        "scenario": scenario,
        "duration": _secs(rng, low, high),
        "webhooks": "normal",
        "webhook_on_running": False,
        **knobs,
    }


# Each builds a create body for the simulated provider (see reconciler.demo.sim).
KINDS: dict[str, Callable[[random.Random], dict[str, Any]]] = {
    "webhooks_delivered": lambda r: _job("success", r, 1, 20),
    "webhooks_lost": lambda r: _job("success", r, 1, 20, webhooks="never"),
    "webhooks_duplicated": lambda r: _job("success", r, 1, 20, webhooks="duplicate"),
    "webhooks_lying": lambda r: _job("success", r, 4, 20, webhooks="early_lie"),
    "webhooks_out_of_order": lambda r: _job("success", r, 1, 15, webhooks="out_of_order"),
    # Late by less than the grace (3 s): a late webhook, not a miss.
    "webhooks_delayed": lambda r: _job("success", r, 1, 15, webhooks="delayed", webhook_delay=2),
    "slow_job": lambda r: _job("slow_success", r, 14, 20),
    "late_failure": lambda r: _job("late_failure", r, 5, 10),
    "partial_results": lambda r: _job("partial", r, 2, 8, failed_items=r.randint(1, 5)),
    "rate_limit_burst": lambda r: _job(
        "success", r, 3, 8, status_fault=429, status_fault_count=3, retry_after=1
    ),
    "rate_limit_storm": lambda r: _job(
        "success", r, 15, 20, webhooks="never", status_fault=429, retry_after=1
    ),
    "unknown_state": lambda r: _job("unknown_state", r, 2, 6),
    "cancelled": lambda r: _job("slow_success", r, 30, 30),
}
CANCEL_AFTER = {"cancelled": (2.0, 5.0)}
# The scenarios whose provider loses or lies about webhooks go to the lossy provider.
LOSSY_KINDS = frozenset({"webhooks_lost", "webhooks_lying"})
# How each scenario ends (the state, and the reason when it escalates); the report fails
# the run when an operation ends otherwise, so trust can never buy fewer reads with a
# different outcome.
EXPECTED_ENDS: dict[str, str] = {
    "webhooks_delivered": "succeeded",
    "webhooks_lost": "succeeded",
    "webhooks_duplicated": "succeeded",
    "webhooks_lying": "succeeded",
    "webhooks_out_of_order": "succeeded",
    "webhooks_delayed": "succeeded",
    "slow_job": "succeeded",
    "late_failure": "failed",
    "partial_results": "completed_with_errors",
    "rate_limit_burst": "succeeded",
    "rate_limit_storm": "escalated:rate_limited",
    "unknown_state": "escalated:unknown_state",
    "cancelled": "cancelled",
}
# Every scenario once (the cancellation twice) before the random fill; a small batch
# takes a prefix.
REQUIRED = (
    "webhooks_delivered",
    "webhooks_lost",
    "webhooks_duplicated",
    "webhooks_lying",
    "late_failure",
    "partial_results",
    "rate_limit_storm",
    "unknown_state",
    "cancelled",
    "rate_limit_burst",
    "slow_job",
    "webhooks_out_of_order",
    "webhooks_delayed",
    "cancelled",
)
FILL_WEIGHTS = {
    "webhooks_delivered": 4,
    "webhooks_lost": 3,
    "webhooks_duplicated": 2,
    "slow_job": 2,
    "webhooks_lying": 1,
    "webhooks_out_of_order": 1,
    "webhooks_delayed": 1,
    "partial_results": 1,
}


@dataclass(frozen=True)
class Planned:
    index: int
    kind: str
    request: dict[str, Any]
    key: str
    cancel_after: float | None = None

    @property
    def provider(self) -> str:
        return LOSSY_PROVIDER if self.kind in LOSSY_KINDS else PROVIDER


def plan_batch(
    count: int, rng: random.Random, seed: int, required: tuple[str, ...] = REQUIRED
) -> list[Planned]:
    """``count`` operations across the scenarios, in a seeded random order."""
    kinds = list(required[:count])
    names, weights = zip(*FILL_WEIGHTS.items(), strict=True)
    kinds += rng.choices(names, weights=weights, k=count - len(kinds))
    rng.shuffle(kinds)
    planned = []
    for index, kind in enumerate(kinds):
        request = {**KINDS[kind](rng), "item": f"demo-{index:03d}"}
        window = CANCEL_AFTER.get(kind)
        cancel_after = _secs(rng, *window) if window else None
        key = f"demo-{seed}-{index:03d}"
        planned.append(Planned(index, kind, request, key, cancel_after))
    return planned


def plan_quick(rng: random.Random, seed: int) -> list[Planned]:
    """The --quick batch: QUICK_KINDS once each, in a seeded order, each job short."""

    def shortened(p: Planned) -> Planned:
        if p.cancel_after is not None:
            return p
        request = {**p.request, "duration": min(p.request["duration"], QUICK_SECONDS)}
        return dataclasses.replace(p, request=request)

    return [shortened(p) for p in plan_batch(len(QUICK_KINDS), rng, seed, QUICK_KINDS)]


def first_wave(planned: list[Planned]) -> list[Planned]:
    """The warm-up wave (see WARMUP_KINDS): sent before the rest, in plan order."""
    warm = [p for p in planned if p.kind in WARMUP_KINDS][:WARMUP_COUNT]
    return [p for p in planned if p in warm or p.kind in ALWAYS_FIRST]


def pick_repeats(planned: list[Planned], rng: random.Random) -> list[Planned]:
    """A few submissions to send again, same key and request: each must get its operation."""
    candidates = [p for p in planned if p.cancel_after is None]
    return rng.sample(candidates, min(len(candidates), max(1, len(planned) // 16)))
