"""The providers page's chart: the last hours of status reads and webhook-first share.

Per provider and per clock hour (UTC) of the last ``HOURS``: the status reads
per operation completed in that hour, and the webhook-first share of the
completions judged in it (as ``core.trust.share``); the trust state's
transitions are marked where they happened.

Transitions are not stored one by one: the health row keeps the last one
(``changed_at``). The earlier ones are found by counting the stored verdicts
again in the order they were judged, with ``core.trust.count`` (the function
that counted them). That replay is used only when the last transition falls in
the window, and only if it ends in the stored state (a policy changed since
would make it disagree); otherwise the stored last transition alone is marked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from markupsafe import Markup

from reconciler.console import charts
from reconciler.core.clock import utc
from reconciler.core.trust import Health, TrustPolicy, Verdict
from reconciler.core.trust import count as count_verdict
from reconciler.storage.provider_stats import Hour

HOURS = 24
HOUR = timedelta(hours=1)


@dataclass(frozen=True)
class Window:
    starts: tuple[datetime, ...]
    end: datetime

    @classmethod
    def ending_at(cls, now: datetime, hours: int = HOURS) -> Window:
        """``hours`` clock hours, the last one the hour ``now`` is in."""
        current = utc(now).replace(minute=0, second=0, microsecond=0)
        starts = tuple(current - HOUR * (hours - 1 - i) for i in range(hours))
        return cls(starts, current + HOUR)


def transitions(
    verdicts: Sequence[tuple[Verdict, datetime, str]],
    policy: TrustPolicy,
    stored: Health,
    since: datetime,
) -> list[charts.Marker]:
    """The trust state's transitions at or after ``since`` (see the module's docstring)."""
    if not policy.adaptive or stored.changed_at is None or stored.changed_at < since:
        return []
    health = Health()
    found: list[charts.Marker] = []
    for verdict, at, operation_id in verdicts:
        health, change = count_verdict(health, verdict, operation_id, at, policy)
        if change is not None and at >= since:
            found.append(charts.Marker(at, change.after.value, change.after.value))
    if health.state is stored.state and found:
        return found
    return [charts.Marker(stored.changed_at, stored.state.value, stored.state.value)]


def _judged(count: int) -> str:
    return f"{count} judged completion" + ("" if count == 1 else "s")


def chart(
    ident: str,
    provider: str,
    window: Window,
    hours: Sequence[Hour],
    markers: Sequence[charts.Marker],
) -> Markup:
    ends = (*window.starts[1:], window.end)
    reads = [
        charts.Bar(h.start, end, h.reads_per_completed, f"{h.completed} completed")
        for h, end in zip(hours, ends, strict=True)
        if h.reads_per_completed is not None
    ]
    shares = [
        charts.Bar(h.start, end, h.webhook_first_share, _judged(h.judged))
        for h, end in zip(hours, ends, strict=True)
        if h.webhook_first_share is not None
    ]
    return charts.bar_panels(
        ident,
        f"{provider}: the last {len(window.starts)} hours",
        window.starts[0],
        window.end,
        [
            charts.Panel("status reads per completed operation", reads),
            charts.Panel("webhook-first share of judged completions", shares, percent=True),
        ],
        markers,
    )


def empty_hours(window: Window) -> list[Hour]:
    return [Hour(s) for s in window.starts]
