"""The providers page: webhooks, status reads per completed operation, error rates, trust.

Which figure comes from where (the page says it too): webhook events,
duplicates, conflicts and orphans, and status reads per completed operation are
read from the database (every replica's work); rejected webhook deliveries
(nothing is stored for them) and calls by HTTP status are this process's
metrics since it started. Each provider's chart of the last hours is drawn from
the database too (``console.provider_charts``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import Response

from reconciler.commands.provider_reads import READ_BUCKETS, read_providers
from reconciler.console import provider_charts
from reconciler.console.web import operator, page, render, runtime_of
from reconciler.core.trust import TrustState, TrustView
from reconciler.metrics import totals
from reconciler.runtime import Runtime
from reconciler.storage.provider_stats import ReadCounts, WebhookCounts
from reconciler.storage.webhook_events import Outcome

# Webhook results in the metrics that are not a stored event's outcome.
_NOT_REJECTED = {o.value for o in Outcome}


@dataclass
class ProviderFigures:
    name: str
    configured: bool
    webhooks: WebhookCounts
    reads: ReadCounts
    trust: TrustView | None
    rejected: dict[str, int] = field(default_factory=dict)  # this process
    statuses: dict[str, int] = field(default_factory=dict)  # status reads by HTTP status
    calls: dict[str, dict[str, int]] = field(default_factory=dict)  # other calls, by status
    chart: Markup = field(default_factory=Markup)  # the last hours, by hour (database)

    @property
    def status_total(self) -> int:
        return sum(self.statuses.values())

    def share(self, count: int) -> str:
        total = self.status_total
        return f"{100 * count / total:.1f}%" if total else "—"


def trust_words(view: TrustView) -> str:
    """A provider's webhook trust as the operator reads it (the streak, said as what it is)."""
    run, needed = view.streak, view.trust_after
    completions = "completion" if run == 1 else "completions"
    if view.state is TrustState.TRUSTED:
        return (
            f"Trusted: webhooks came first for the last {run} {completions} in a row "
            f"(trust takes {needed}). Status reads are only a slow fallback; the first "
            "missed webhook withdraws trust."
        )
    if view.state is TrustState.DISTRUSTED:
        return (
            "Distrusted: a webhook was missed, so every operation is read on the normal "
            f"schedule. {run} of the {needed} webhook-first completions in a row that earn "
            "trust again."
        )
    return (
        f"Learning: {run} of the {needed} webhook-first completions in a row that earn "
        "trust. Until then every operation is read on the normal schedule."
    )


def _process_figures(rt: Runtime) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    rejected: dict[str, dict[str, int]] = defaultdict(dict)
    for (provider, result), value in totals(rt.metrics.webhooks).items():
        if result not in _NOT_REJECTED:
            rejected[provider][result.removeprefix("rejected_")] = int(value)
    statuses: dict[str, dict[str, int]] = defaultdict(dict)
    for (provider, status), value in totals(rt.metrics.status_requests).items():
        statuses[provider][status] = int(value)
    calls: dict[str, dict[str, dict[str, int]]] = defaultdict(lambda: defaultdict(dict))
    for (provider, call, status), value in totals(rt.metrics.provider_calls).items():
        calls[provider][call][status] = int(value)
    return rejected, statuses, calls


@page
async def providers_page(request: Request) -> Response:
    who = await operator(request)
    rt = runtime_of(request)

    window = provider_charts.Window.ending_at(rt.clock.now())
    since = window.starts[0]
    policies = {name: spec.polling.trust() for name, spec in rt.providers.items()}
    found = await rt.db.run(
        read_providers, rt.db, policies, window.starts, window.end, rt.clock.now()
    )
    rejected, statuses, calls = _process_figures(rt)
    figures = [
        ProviderFigures(
            name=name,
            configured=name in rt.providers,
            webhooks=found.webhooks.get(name, WebhookCounts()),
            reads=found.reads.get(name, ReadCounts()),
            trust=found.trust.get(name),
            rejected=rejected.get(name, {}),
            statuses=dict(sorted(statuses.get(name, {}).items())),
            calls={k: dict(sorted(v.items())) for k, v in sorted(calls.get(name, {}).items())},
            chart=provider_charts.chart(
                f"provider-chart-{index}",
                name,
                window,
                found.hours.get(name) or provider_charts.empty_hours(window),
                provider_charts.transitions(h.verdicts, h.policy, h.stored, since)
                if (h := found.history.get(name)) is not None
                else [],
            ),
        )
        for index, name in enumerate(found.names)
    ]
    unknown = rejected.get("unknown", {})
    return render(
        request,
        "providers.html",
        {
            "figures": figures,
            "unknown_provider": sum(unknown.values()),
            "buckets": READ_BUCKETS,
            "trust_words": trust_words,
            "storage": {
                "size": found.size_bytes,
                "settings": rt.settings.retention,
                "progress": found.progress,
                "removed": {t[0]: int(v) for t, v in totals(rt.metrics.retention_removed).items()},
            },
        },
        who=who,
    )
