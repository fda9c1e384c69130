"""What the console's providers page reads from the database (every replica's work): each
provider's stored webhooks, status reads per completed operation, the last hours by
hour, its webhook trust and what its chart marks it from, retention's progress and the
database's size. The page adds this process's own figures (``metrics``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from reconciler.core.trust import Health, TrustPolicy, TrustView, Verdict, needs_replay
from reconciler.storage import provider_stats, retention
from reconciler.storage import trust as trust_store
from reconciler.storage.database import Database
from reconciler.storage.inbox import providers_seen
from reconciler.storage.provider_stats import Hour, ReadCounts, WebhookCounts
from reconciler.storage.retention import Progress

# The labels of the buckets of status reads per completed operation, in order.
READ_BUCKETS = [label for label, _, _ in provider_stats.READ_BUCKETS]


@dataclass(frozen=True)
class TrustHistory:
    """What a chart marks a provider's trust transitions from (``core.trust.needs_replay``):
    its policy, its stored health, and the verdicts that moved it, in the order judged."""

    policy: TrustPolicy
    stored: Health
    verdicts: list[tuple[Verdict, datetime, str]]


@dataclass(frozen=True)
class ProviderReads:
    names: list[str]  # configured, with operations, or with webhooks stored: sorted
    webhooks: dict[str, WebhookCounts]
    reads: dict[str, ReadCounts]
    hours: dict[str, list[Hour]]  # only providers with any hour's figures
    history: dict[str, TrustHistory]  # only providers whose last change is in the window
    trust: dict[str, TrustView]
    progress: Progress
    size_bytes: int


def read_providers(
    db: Database,
    policies: Mapping[str, TrustPolicy],
    starts: Sequence[datetime],
    end: datetime,
    now: datetime,
) -> ProviderReads:
    """The page's figures for the hours ``[starts[0], end)``, read in one transaction (and
    the database's size in a read of its own). ``policies``: the trust keys of each
    configured provider; one no longer configured has none, and no trust is shown."""
    with db.read() as conn:
        webhooks = provider_stats.webhook_counts(conn)
        seen = providers_seen(conn)
        names = sorted(set(policies) | set(seen) | set(webhooks))
        history: dict[str, TrustHistory] = {}
        healths = trust_store.load_all(conn)
        for name, policy in policies.items():
            stored = healths.get(name, Health())
            if needs_replay(policy, stored, starts[0]):
                verdicts = provider_stats.deciding_verdicts(conn, name)
                history[name] = TrustHistory(policy, stored, verdicts)
        trust = trust_store.trust_views(conn, policies)
        reads = provider_stats.status_reads(conn)
        hours = provider_stats.hourly(conn, starts, end)
        progress = retention.progress(conn, now)
    return ProviderReads(
        names,
        webhooks,
        reads,
        hours,
        history,
        trust,
        progress,
        db.size_bytes(),
    )
