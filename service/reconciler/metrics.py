"""Prometheus metrics, one registry per runtime (so several runtimes can share a process).

Names follow Prometheus conventions: a counter ends in ``_total``, a value with a unit
ends in its base unit (``_seconds``), a share in ``_ratio``, and a gauge that counts
things is named for what it holds so that it does not read as a counter;
``tests/integration/test_metric_names.py`` parses ``/metrics`` and holds every family
to these rules. Families read from the database at scrape time (operations by state,
webhook trust) give the same value on every replica: aggregate them with ``max``. A
scrape's reads are as long as what is in flight, never as the stored history.

Labels carry only bounded, non-secret values: provider names, HTTP status
codes, enum values. Never a token, URL, body or job id.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from reconciler.core.states import State
from reconciler.core.trust import TrustState, TrustView

# How stale the ended states' counts in ``reconciler_stored_operations`` may be.
ENDED_RECOUNT_SECONDS = 600.0
LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
READS_BUCKETS = (0, 1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 64, 128)


class _StateCounts(Collector):
    """Operations by state, read from the database: those in flight at each scrape (an index
    range as long as what is in flight), the ended ones recounted in a thread of their own
    at most every ``ENDED_RECOUNT_SECONDS`` (a count as long as the retention window, which
    every scrape of every replica paid for before: 0.2 s at a million rows). The first
    scrape counts them itself."""

    def __init__(
        self,
        in_flight: Callable[[], dict[str, int]],
        ended: Callable[[], dict[str, int]],
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._in_flight = in_flight
        self._count_ended = ended
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._ended: dict[str, int] | None = None
        self._counted_at = -math.inf
        self._recounting = False

    def _recount(self) -> None:
        try:
            counts: dict[str, int] | None = self._count_ended()
        except Exception:  # the next scrape tries again
            counts = None
        with self._lock:
            if counts is not None:
                self._ended, self._counted_at = counts, self._monotonic()
            self._recounting = False

    def ended(self) -> dict[str, int]:
        with self._lock:
            first = self._ended is None and not self._recounting
            stale = self._monotonic() - self._counted_at > ENDED_RECOUNT_SECONDS
            start = stale and not self._recounting
            if start:
                self._recounting = True
        if first:
            self._recount()
        elif start:
            threading.Thread(target=self._recount, name="ended-recount", daemon=True).start()
        return self._ended or {}

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "reconciler_stored_operations",
            "Operations stored in the database, by local state: in flight as of this scrape, "
            f"ended ones as counted at most {ENDED_RECOUNT_SECONDS / 60:g} minutes ago.",
            labels=["state"],
        )

    def describe(self) -> Iterable[Metric]:
        """The family without a count (the registry asks at registration)."""
        yield self._family()

    def collect(self) -> Iterable[Metric]:
        family = self._family()
        try:
            counts = {**self.ended(), **self._in_flight()}
        except Exception:  # a scrape must not fail because the database blinked
            counts = {}
        for state in State:
            family.add_metric([state.value], counts.get(state.value, 0))
        yield family


class _WriteCount(Collector):
    """The database's counts of write transactions begun by this process, and of those
    PostgreSQL undid to break a lock cycle (no query)."""

    def __init__(self, count: Callable[[], int], cycles: Callable[[], int]) -> None:
        self._count = count
        self._cycles = cycles

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(
            "reconciler_write_transactions",
            "Write transactions this process began (each BEGIN ... COMMIT or ROLLBACK).",
        )
        family.add_metric([], float(self._count()))
        yield family
        cycles = CounterMetricFamily(
            "reconciler_write_cycles",
            "Write transactions PostgreSQL undid to break a lock cycle; each ran again.",
        )
        cycles.add_metric([], float(self._cycles()))
        yield cycles


class _TrustGauges(Collector):
    """Each provider's webhook trust, read from the database at scrape time."""

    def __init__(self, views: Callable[[], dict[str, TrustView]]) -> None:
        self._views = views

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily, CounterMetricFamily]:
        state = GaugeMetricFamily(
            "reconciler_webhook_trust_state",
            "1 for the provider's current webhook trust state (adaptive trust only).",
            labels=["provider", "state"],
        )
        share = GaugeMetricFamily(
            "reconciler_webhook_first_ratio",
            "Ratio (0 to 1) of judged completions a verified webhook announced before a read.",
            labels=["provider"],
        )
        # The stored count only grows, so it is a counter, though every replica reports it.
        misses = CounterMetricFamily(
            "reconciler_webhook_misses",
            "Completions a scheduled read found with no webhook within the grace.",
            labels=["provider"],
        )
        return state, share, misses

    def describe(self) -> Iterable[Metric]:
        """The families without a sample: the registry asks at registration, before the
        service has started, and a query then would be start-up work for nothing."""
        yield from self._families()

    def collect(self) -> Iterable[Metric]:
        state, share, misses = self._families()
        try:
            views = self._views()
        except Exception:  # a scrape must not fail because the database blinked
            views = {}
        for name, v in sorted(views.items()):
            if v.state is not None:
                for s in TrustState:
                    state.add_metric([name, s.value], 1.0 if v.state is s else 0.0)
            if v.webhook_first_share is not None:
                share.add_metric([name], v.webhook_first_share)
            misses.add_metric([name], float(v.misses))
        yield state
        yield share
        yield misses


class _DatabaseSize(Collector):
    """The database's size on disk, read at scrape time (the same on every replica)."""

    def __init__(self, size: Callable[[], int]) -> None:
        self._size = size

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "reconciler_database_size_bytes",
            "The database's size on disk (PostgreSQL: the database; SQLite: file and WAL).",
        )

    def describe(self) -> Iterable[Metric]:
        yield self._family()  # no query at registration (``_TrustGauges.describe``)

    def collect(self) -> Iterable[Metric]:
        family = self._family()
        try:
            family.add_metric([], self._size())
        except Exception:  # a scrape must not fail because the database blinked
            return
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
            "From a webhook hint's arrival to the completion handler's start, in seconds.",
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
        self.client_disconnects = Counter(
            "reconciler_client_disconnects",
            "Requests whose client went away before the body arrived, by endpoint family.",
            ["endpoint"],
            registry=r,
        )
        self.reads_per_operation = Histogram(
            "reconciler_status_reads_per_operation",
            "Status requests an operation had used when it reached an end state.",
            ["provider"],
            buckets=READS_BUCKETS,
            registry=r,
        )
        self.front_door_refusals = Counter(
            "reconciler_front_door_refusals",
            "Connections the server cut off or refused before the app, by reason "
            "(too many connections, headers too large or too many, header or body too slow).",
            ["reason"],
            registry=r,
        )
        self.retention_removed = Counter(
            "reconciler_retention_removed_rows",
            "Rows the retention sweep removed, by table (this process's sweeps).",
            ["table"],
            registry=r,
        )
        self.retention_sweeps = Counter(
            "reconciler_retention_sweeps",
            "Retention sweep turns this process ran, by outcome (pruned, idle, skipped, failed).",
            ["outcome"],
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

    def watch_states(
        self, in_flight: Callable[[], dict[str, int]], ended: Callable[[], dict[str, int]]
    ) -> None:
        self.registry.register(_StateCounts(in_flight, ended))

    def watch_writes(self, count: Callable[[], int], cycles: Callable[[], int]) -> None:
        self.registry.register(_WriteCount(count, cycles))

    def watch_database_size(self, size: Callable[[], int]) -> None:
        self.registry.register(_DatabaseSize(size))

    def pruned(self, tables: Mapping[str, int]) -> None:
        for table, count in tables.items():
            self.retention_removed.labels(table).inc(count)

    def watch_trust(self, views: Callable[[], dict[str, TrustView]]) -> None:
        self.registry.register(_TrustGauges(views))

    def render(self) -> bytes:
        return generate_latest(self.registry)


def status_label(http_status: int | None, transport_error: str | None) -> str:
    if http_status is not None:
        return str(http_status)
    return f"no_response_{transport_error or 'other'}"


def totals(counter: Counter) -> dict[tuple[str, ...], float]:
    """A counter's current values by label values (this process only, since it started)."""
    found: dict[tuple[str, ...], float] = {}
    for metric in counter.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total"):
                found[tuple(sample.labels.values())] = sample.value
    return found
