"""Prometheus metrics, one registry per runtime (so several runtimes can share a process).

Labels carry only bounded, non-secret values: provider names, HTTP status
codes, enum values. Never a token, URL, body or job id.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from reconciler.core.states import State

LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class _StateCounts(Collector):
    """Operations by state, read from the database at scrape time (the truth is there)."""

    def __init__(self, counts: Callable[[], dict[str, int]]) -> None:
        self._counts = counts

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(
            "reconciler_operations", "Operations by local state.", labels=["state"]
        )
        try:
            counts = self._counts()
        except Exception:  # a scrape must not fail because the database blinked
            counts = {}
        for state in State:
            family.add_metric([state.value], counts.get(state.value, 0))
        yield family


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.webhooks = Counter(
            "reconciler_webhooks",
            "Webhook deliveries by provider and result.",
            ["provider", "result"],
            registry=r,
        )
        self.status_requests = Counter(
            "reconciler_status_requests",
            "Status requests sent, by provider and HTTP status.",
            ["provider", "status"],
            registry=r,
        )
        self.provider_calls = Counter(
            "reconciler_provider_calls",
            "Other provider calls (create, lookup, cancel, result).",
            ["provider", "call", "status"],
            registry=r,
        )
        self.escalations = Counter(
            "reconciler_escalations",
            "Escalations raised, by reason.",
            ["reason"],
            registry=r,
        )
        self.completions = Counter(
            "reconciler_completions",
            "Operations that reached an end state.",
            ["state"],
            registry=r,
        )
        self.lag = Histogram(
            "reconciler_hint_to_completion_seconds",
            "From a webhook hint's arrival to the completion handler's start.",
            buckets=LAG_BUCKETS,
            registry=r,
        )
        self.lease_takeovers = Counter(
            "reconciler_lease_takeovers",
            "Leases taken over after their holder stopped.",
            registry=r,
        )
        self.callback_attempts = Counter(
            "reconciler_callback_attempts",
            "Agent callback delivery attempts by result.",
            ["result"],
            registry=r,
        )
        self.front_door_refusals = Counter(
            "reconciler_front_door_refusals",
            "Connections the server cut off or refused before the app, by reason "
            "(too many connections, headers too large or too many, header or body too slow).",
            ["reason"],
            registry=r,
        )
        self._webhook_children: dict[tuple[str, str], Any] = {}
        self.hook_runs = Counter(
            "reconciler_hook_runs",
            "Completion hook runs by result.",
            ["result"],
            registry=r,
        )

    def webhook(self, provider: str, result: str) -> None:
        """Count one webhook delivery (children cached: this runs on every delivery)."""
        child = self._webhook_children.get((provider, result))
        if child is None:
            child = self._webhook_children[(provider, result)] = self.webhooks.labels(
                provider, result
            )
        child.inc()

    def watch_states(self, counts: Callable[[], dict[str, int]]) -> None:
        self.registry.register(_StateCounts(counts))

    def render(self) -> bytes:
        return generate_latest(self.registry)


def status_label(http_status: int | None, transport_error: str | None) -> str:
    if http_status is not None:
        return str(http_status)
    return f"no_response_{transport_error or 'other'}"
