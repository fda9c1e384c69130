"""The provider_health and webhook_verdicts tables: webhook trust as durable, shared data.

Guarantee: no lost update and no process memory. A provider's health row changes only
inside the transaction that records the completion deciding it, by an UPDATE
conditional on the version that was read (PostgreSQL also locks the row first, so two
replicas counting at once queue instead of failing); SQLite serialises writers already.
Which completions were webhook-first, late or missed is read from what is stored: the
verified webhooks (``webhook_events.received_at``) and the status reads (the verdict rows).

``trust_view``/``trust_views`` are the read for operators (``GET /v1/providers``, the
console, ``/metrics``); they never write.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection

from reconciler.core.errors import StaleWrite
from reconciler.core.records import OperationRecord
from reconciler.core.states import State
from reconciler.core.trust import Change, Health, TrustPolicy, TrustState, TrustView, Verdict
from reconciler.core.trust import count as count_verdict
from reconciler.core.trust import view as trust_view_of
from reconciler.core.vocabulary import DelaySource
from reconciler.storage.fastsql import insert_many, raw_for, run
from reconciler.storage.journal import OPS
from reconciler.storage.models import ProviderHealth, WebhookEvent, WebhookVerdict, operation_record

HEALTH = ProviderHealth.__table__  # type: ignore[attr-defined]
VERDICTS = WebhookVerdict.__table__  # type: ignore[attr-defined]
EVENTS = WebhookEvent.__table__  # type: ignore[attr-defined]
VERDICT_COLUMNS = (
    "operation_id",
    "provider",
    "remote_job_id",
    "verdict",
    "asked_at",
    "seen_at",
    "hinted_at",
    "settle_after",
    "judged_at",
)
# Written as literal SQL so that SQLite's planner can match the partial index's predicate.
STRETCHED = sa.text(f"operations.delay_source = '{DelaySource.WEBHOOK_TRUST.value}'")


def _health(row: Any) -> Health:
    return Health(
        state=TrustState(row.state),
        streak=row.streak,
        misses=row.misses,
        webhook_first=row.webhook_first,
        late=row.late,
        missed=row.missed,
        changed_at=row.changed_at,
        last_miss_operation=row.last_miss_operation,
    )


def load_health(conn: Connection, provider: str) -> Health:
    """The provider's health as stored; a provider never judged yet is learning."""
    row = conn.execute(sa.select(HEALTH).where(HEALTH.c.provider == provider)).first()
    return _health(row) if row is not None else Health()


def load_all(conn: Connection) -> dict[str, Health]:
    return {row.provider: _health(row) for row in conn.execute(sa.select(HEALTH))}


def is_trusted(conn: Connection, provider: str) -> bool:
    raw = raw_for(conn.dialect.name)
    sql = raw.statement(
        "trust-state", lambda r: f"SELECT state FROM provider_health WHERE provider = {r.mark}"
    )
    row = run(conn, sql, [provider]).fetchone()
    return row is not None and row[0] == TrustState.TRUSTED.value


def _ensure_row(conn: Connection, provider: str, now: datetime) -> None:
    values = {
        "provider": provider,
        "state": TrustState.LEARNING.value,
        "streak": 0,
        "misses": 0,
        "webhook_first": 0,
        "late": 0,
        "missed": 0,
        "updated_at": now,
        "version": 1,
    }
    insert = pg_insert if conn.dialect.name == "postgresql" else sqlite_insert
    conn.execute(insert(HEALTH).values(**values).on_conflict_do_nothing())


def _locked(conn: Connection, provider: str, now: datetime) -> tuple[Health, int]:
    query = sa.select(HEALTH).where(HEALTH.c.provider == provider)
    if conn.dialect.name == "postgresql":
        query = query.with_for_update()
    row = conn.execute(query).first()
    if row is None:  # the provider's first judged completion: make its row (once, any replica)
        _ensure_row(conn, provider, now)
        row = conn.execute(query).one()
    return _health(row), int(row.version)


def _store(conn: Connection, provider: str, health: Health, version: int, now: datetime) -> None:
    result = conn.execute(
        sa.update(HEALTH)
        .where(HEALTH.c.provider == provider, HEALTH.c.version == version)
        .values(
            state=health.state.value,
            streak=health.streak,
            misses=health.misses,
            webhook_first=health.webhook_first,
            late=health.late,
            missed=health.missed,
            changed_at=health.changed_at,
            last_miss_operation=health.last_miss_operation,
            updated_at=now,
            version=version + 1,
        )
    )
    if result.rowcount != 1:
        raise StaleWrite(f"provider {provider}: webhook health changed since version {version}")


def _trusted_increment(conn: Connection, provider: str, count: int, now: datetime) -> bool:
    """The steady state in one atomic statement: a trusted provider's webhook-first count.

    The increments are expressions on the row as it is when locked, so concurrent writers
    add up; the state is untouched (``core.trust.count`` never moves a trusted provider on
    a webhook-first completion). False when the provider is not trusted: count normally.
    """
    raw = raw_for(conn.dialect.name)
    sql = raw.statement(
        "trust-increment",
        lambda r: (
            f"UPDATE provider_health SET streak = streak + {r.mark}, "
            f"webhook_first = webhook_first + {r.mark}, updated_at = {r.mark}, "
            "version = version + 1 "
            f"WHERE provider = {r.mark} AND state = {r.mark}"
        ),
    )
    params = [count, count, raw.time(now), provider, TrustState.TRUSTED.value]
    return bool(run(conn, sql, params).rowcount == 1)


def count_completions(
    conn: Connection,
    provider: str,
    judged: Sequence[tuple[Verdict, str]],
    now: datetime,
    policy: TrustPolicy,
) -> list[Change]:
    """Count judged completions ``(verdict, operation id)`` into the provider's health, in order.

    Call last in the transaction that stores the evidence: the health row stays locked
    (PostgreSQL) from here to the commit, and nothing else waits on it meanwhile.
    """
    if not judged:
        return []
    if all(v is Verdict.WEBHOOK_FIRST for v, _ in judged) and _trusted_increment(
        conn, provider, len(judged), now
    ):
        return []  # already trusted: more webhook-first completions cannot change the state
    health, version = _locked(conn, provider, now)
    changes: list[Change] = []
    for verdict, operation_id in judged:
        health, change = count_verdict(health, verdict, operation_id, now, policy)
        if change is not None:
            changes.append(change)
    _store(conn, provider, health, version, now)
    return changes


def record_verdict(
    conn: Connection,
    op: OperationRecord,
    verdict: Verdict,
    *,
    asked_at: datetime,
    seen_at: datetime,
    hinted_at: datetime | None,
    settle_after: datetime | None,
) -> None:
    raw = raw_for(conn.dialect.name)
    row = {
        "operation_id": op.id,
        "provider": op.provider,
        "remote_job_id": op.remote_job_id,
        "verdict": verdict.value,
        "asked_at": asked_at,
        "seen_at": seen_at,
        "hinted_at": hinted_at,
        "settle_after": settle_after,
        "judged_at": None if verdict is Verdict.PENDING else seen_at,
    }
    insert_many(conn, VERDICTS, VERDICT_COLUMNS, [raw.row_encoder(VERDICTS, VERDICT_COLUMNS)(row)])


@dataclass(frozen=True)
class PendingVerdict:
    id: int
    operation_id: str
    provider: str
    remote_job_id: str | None
    asked_at: datetime
    settle_after: datetime


def any_due_pending(conn: Connection, now: datetime) -> bool:
    """Whether any pending completion's grace is over (a probe of the index, no lock)."""
    row = conn.execute(
        sa.select(VERDICTS.c.id)
        .where(VERDICTS.c.verdict == Verdict.PENDING.value, VERDICTS.c.settle_after <= now)
        .limit(1)
    ).first()
    return row is not None


def due_pending(conn: Connection, now: datetime, limit: int) -> list[PendingVerdict]:
    """Pending completions whose grace is over, oldest first, locked for this transaction."""
    query = (
        sa.select(
            VERDICTS.c.id,
            VERDICTS.c.operation_id,
            VERDICTS.c.provider,
            VERDICTS.c.remote_job_id,
            VERDICTS.c.asked_at,
            VERDICTS.c.settle_after,
        )
        .where(VERDICTS.c.verdict == Verdict.PENDING.value, VERDICTS.c.settle_after <= now)
        .order_by(VERDICTS.c.settle_after, VERDICTS.c.id)
        .limit(limit)
    )
    if conn.dialect.name == "postgresql":
        query = query.with_for_update(skip_locked=True)
    return [PendingVerdict(*row) for row in conn.execute(query)]


def first_webhook_after(
    conn: Connection,
    provider: str,
    job_id: str | None,
    after: datetime | None,
    until: datetime | None = None,
) -> datetime | None:
    """The first verified webhook stored for the job after ``after`` (orphans included),
    and at or before ``until`` when given; ``after`` None: since the job began."""
    if job_id is None:
        return None
    query = sa.select(sa.func.min(EVENTS.c.received_at)).where(
        EVENTS.c.provider == provider, EVENTS.c.remote_job_id == job_id
    )
    if after is not None:
        query = query.where(EVENTS.c.received_at > after)
    if until is not None:
        query = query.where(EVENTS.c.received_at <= until)
    value = conn.execute(query).scalar()
    return value if isinstance(value, datetime) else None


def judge(
    conn: Connection,
    pending: PendingVerdict,
    verdict: Verdict,
    hinted_at: datetime | None,
    now: datetime,
) -> None:
    conn.execute(
        sa.update(VERDICTS)
        .where(VERDICTS.c.id == pending.id, VERDICTS.c.verdict == Verdict.PENDING.value)
        .values(verdict=verdict.value, hinted_at=hinted_at, judged_at=now)
    )


def stretched_operations(conn: Connection, provider: str, limit: int) -> list[OperationRecord]:
    """Observing operations of ``provider`` on a stretched schedule, locked (PostgreSQL).

    Rows another transaction holds are skipped: the next sweep finds them again.
    """
    query = (
        sa.select(OPS)
        .where(OPS.c.provider == provider, STRETCHED, OPS.c.state == State.OBSERVING.value)
        .order_by(OPS.c.next_poll_at)
        .limit(limit)
    )
    if conn.dialect.name == "postgresql":
        query = query.with_for_update(skip_locked=True)
    return [operation_record(row) for row in conn.execute(query).mappings()]


def has_stretched(conn: Connection, provider: str) -> bool:
    """Whether any operation of ``provider`` waits on a stretched schedule (an index probe)."""
    row = conn.execute(
        sa.select(OPS.c.id)
        .where(OPS.c.provider == provider, STRETCHED, OPS.c.state == State.OBSERVING.value)
        .limit(1)
    ).first()
    return row is not None


def last_webhook_at(conn: Connection, provider: str) -> datetime | None:
    value = conn.execute(
        sa.select(sa.func.max(EVENTS.c.received_at)).where(EVENTS.c.provider == provider)
    ).scalar()
    return value if isinstance(value, datetime) else None


def trust_view(conn: Connection, provider: str, policy: TrustPolicy) -> TrustView:
    """What an operator sees of one provider's webhook trust; a read, never a write."""
    return trust_view_of(
        provider, load_health(conn, provider), policy, last_webhook_at(conn, provider)
    )


def trust_views(conn: Connection, policies: Mapping[str, TrustPolicy]) -> dict[str, TrustView]:
    """``trust_view`` for every provider named in ``policies`` (one read of the health table)."""
    healths = load_all(conn)
    return {
        name: trust_view_of(name, healths.get(name, Health()), policy, last_webhook_at(conn, name))
        for name, policy in policies.items()
    }
