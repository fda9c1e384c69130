"""What the console's inbox reads: its three lists (waiting for a decision, at risk,
matching the filter), the counts by state, the escalations its words are judged against,
and the stamp its script polls. Each answer is one read transaction."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from reconciler.core.records import EscalationRecord
from reconciler.storage import inbox
from reconciler.storage.database import Database
from reconciler.storage.escalations import escalations_by_operation
from reconciler.storage.inbox import InboxFilter, Slice
from reconciler.storage.operations import count_by_state


@dataclass(frozen=True)
class Inbox:
    """The inbox's lists, each one page (``Slice``), as one read found them."""

    escalated: Slice
    at_risk: Slice | None  # None when the filter names a reason: none is at risk yet
    matching: Slice | None  # None unless the filter narrows
    counts: dict[str, int]
    stamp: str
    # Each waiting operation's escalations, oldest first (how this one repeats them).
    before: Mapping[str, list[EscalationRecord]]
    # Each operation at risk: the reason of its last escalation, if it had one.
    reasons: Mapping[str, str]


def providers_seen(db: Database) -> list[str]:
    """Every provider name that has operations (a provider file may since have gone)."""
    with db.read() as conn:
        return inbox.providers_seen(conn)


def stamp(db: Database) -> str:
    """Changes whenever an operation escalates or an escalation is decided (any replica)."""
    with db.read() as conn:
        return inbox.stamp(conn)


def read_inbox(
    db: Database, f: InboxFilter, pages: Mapping[str, int], page_size: int, now: datetime
) -> Inbox:
    """The page ``pages`` names of each list (``page``, ``risk_page``, ``all_page``)."""

    def offset(name: str) -> int:
        return (pages[name] - 1) * page_size

    with db.read() as conn:
        escalated = inbox.escalated(conn, f, page_size, offset("page"))
        # The reason is an escalation's: an operation at risk has none yet.
        at_risk = (
            inbox.at_risk(conn, f, now, page_size, offset("risk_page"))
            if f.reason is None
            else None
        )
        matching = inbox.matching(conn, f, page_size, offset("all_page")) if f.narrows else None
        before = escalations_by_operation(conn, [op.id for op, _ in escalated.items])
        return Inbox(
            escalated,
            at_risk,
            matching,
            count_by_state(conn),
            inbox.stamp(conn),
            before,
            at_risk.reasons if at_risk is not None else {},
        )
