"""The provider_health and webhook_verdicts tables: webhook trust as durable, shared data.

Guarantee: no lost update and no process memory. A provider's health row changes only
inside the transaction that records the completion deciding it, by an UPDATE
conditional on the version that was read (PostgreSQL also locks the row first, so two
replicas counting at once queue instead of failing); SQLite serialises writers already.
Which completions were webhook-first, late or missed is read from what is stored: the
verified webhooks (``webhook_events.received_at``) and the status reads (the verdict rows).

``trust_view`` and ``trust_views`` are the read for operators
(``GET /v1/providers``, the console, ``/metrics``); they never write.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

from sqlalchemy.engine import Connection

from reconciler.core.errors import StaleWrite
from reconciler.core.records import OperationRecord
from reconciler.core.states import State
from reconciler.core.trust import Change, Health, TrustPolicy, TrustState, TrustView, Verdict
from reconciler.core.trust import count as count_verdict
from reconciler.core.trust import view as trust_view_of
from reconciler.core.vocabulary import DelaySource
from reconciler.storage.fastsql import AS_IS, Bound, Sql
from reconciler.storage.models import record_of_values
from reconciler.storage.tables import EVENTS, HEALTH, OPS, OPS_COLUMNS, VERDICTS

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
# Written as a literal so that SQLite's planner can match the partial index's predicate.
STRETCHED = f"delay_source = '{DelaySource.WEBHOOK_TRUST.value}'"
HEALTH_COLUMNS = (
    "state",
    "streak",
    "misses",
    "webhook_first",
    "late",
    "missed",
    "changed_at",
    "last_miss_operation",
)
_HEALTH_LIST = ", ".join(HEALTH_COLUMNS)

_HEALTH_OF = Sql(
    "health-of",
    HEALTH,
    f"SELECT {_HEALTH_LIST} FROM provider_health WHERE provider = ?",
    params=("provider",),
    returns=HEALTH_COLUMNS,
)
_HEALTH_LOCKED = Sql(
    "health-locked",
    HEALTH,
    f"SELECT {_HEALTH_LIST}, version FROM provider_health WHERE provider = ? [[FOR UPDATE|]]",
    params=("provider",),
    returns=(*HEALTH_COLUMNS, "version"),
)
_ALL_HEALTH = Sql(
    "health-all",
    HEALTH,
    f"SELECT {_HEALTH_LIST}, provider FROM provider_health",
    returns=(*HEALTH_COLUMNS, "provider"),
)
_TRUST_STATE = Sql(
    "trust-state",
    HEALTH,
    "SELECT state FROM provider_health WHERE provider = ?",
    params=("provider",),
)
_ENSURE = Sql(
    "health-ensure",
    HEALTH,
    "INSERT INTO provider_health (provider, state, streak, misses, webhook_first, late, "
    "missed, updated_at, version) VALUES (?, ?, 0, 0, 0, 0, 0, ?, 1) ON CONFLICT DO NOTHING",
    params=("provider", "state", "updated_at"),
)
_STORE = Sql(
    "health-store",
    HEALTH,
    f"UPDATE provider_health SET {', '.join(f'{c} = ?' for c in HEALTH_COLUMNS)}, "
    "updated_at = ?, version = ? WHERE provider = ? AND version = ?",
    params=(*HEALTH_COLUMNS, "updated_at", "version", "provider", "version"),
)
_INCREMENT = Sql(
    "trust-increment",
    HEALTH,
    "UPDATE provider_health SET streak = streak + ?, webhook_first = webhook_first + ?, "
    "updated_at = ?, version = version + 1 WHERE provider = ? AND state = ?",
    params=("streak", "webhook_first", "updated_at", "provider", "state"),
)
_INSERT_VERDICT = Sql(
    "verdict-insert",
    VERDICTS,
    f"INSERT INTO webhook_verdicts ({', '.join(VERDICT_COLUMNS)}) "
    f"VALUES ({', '.join(['?'] * len(VERDICT_COLUMNS))})",
    params=VERDICT_COLUMNS,
)
_PENDING_COLUMNS = ("id", "operation_id", "provider", "remote_job_id", "asked_at", "settle_after")
_ANY_DUE_PENDING = Sql(
    "pending-any-due",
    VERDICTS,
    "SELECT id FROM webhook_verdicts WHERE verdict = ? AND settle_after <= ? LIMIT 1",
    params=("verdict", "settle_after"),
)
_DUE_PENDING = Sql(
    "pending-due",
    VERDICTS,
    f"SELECT {', '.join(_PENDING_COLUMNS)} FROM webhook_verdicts "
    "WHERE verdict = ? AND settle_after <= ? ORDER BY settle_after, id LIMIT ? "
    "[[FOR UPDATE SKIP LOCKED|]]",
    params=("verdict", "settle_after", AS_IS),
    returns=_PENDING_COLUMNS,
)
_JUDGE = Sql(
    "verdict-judge",
    VERDICTS,
    "UPDATE webhook_verdicts SET verdict = ?, hinted_at = ?, judged_at = ? "
    "WHERE id = ? AND verdict = ?",
    params=("verdict", "hinted_at", "judged_at", "id", "verdict"),
)
_STRETCHED = Sql(
    "stretched-operations",
    OPS,
    f"SELECT {', '.join(OPS_COLUMNS)} FROM operations "
    f"WHERE provider = ? AND {STRETCHED} AND state = ? ORDER BY next_poll_at LIMIT ? "
    "[[FOR UPDATE SKIP LOCKED|]]",
    params=("provider", "state", AS_IS),
    returns=OPS_COLUMNS,
)
_ANY_STRETCHED = Sql(
    "stretched-any",
    OPS,
    f"SELECT id FROM operations WHERE provider = ? AND {STRETCHED} AND state = ? LIMIT 1",
    params=("provider", "state"),
)
_LAST_WEBHOOK = Sql(
    "webhook-last",
    EVENTS,
    "SELECT max(received_at) FROM webhook_events WHERE provider = ?",
    params=("provider",),
    returns=("received_at",),
)


@cache
def _first_webhook_sql(after: bool, until: bool) -> Sql:
    """The first webhook stored for a job, for one shape of window."""
    window = (" AND received_at > ?" if after else "") + (" AND received_at <= ?" if until else "")
    return Sql(
        "webhook-first-after",
        EVENTS,
        "SELECT min(received_at) FROM webhook_events "
        "WHERE provider = ? AND remote_job_id = ? AND NOT ignored" + window,
        params=("provider", "remote_job_id", *(["received_at"] * (after + until))),
        returns=("received_at",),
    )


def _health(row: Sequence[Any]) -> Health:
    state, streak, misses, webhook_first, late, missed, changed_at, last_miss = row[:8]
    return Health(
        state=TrustState(state),
        streak=streak,
        misses=misses,
        webhook_first=webhook_first,
        late=late,
        missed=missed,
        changed_at=changed_at,
        last_miss_operation=last_miss,
    )


def load_health(conn: Connection, provider: str) -> Health:
    """The provider's health as stored; a provider never judged yet is learning."""
    row = _HEALTH_OF.first(conn, provider)
    return _health(row) if row is not None else Health()


def load_all(conn: Connection) -> dict[str, Health]:
    return {row[8]: _health(row) for row in _ALL_HEALTH.rows(conn)}


def is_trusted(conn: Connection, provider: str) -> bool:
    state = _TRUST_STATE.value(conn, provider)
    return state is not None and state == TrustState.TRUSTED.value


def _locked(conn: Connection, provider: str, now: datetime) -> tuple[Health, int]:
    row = _HEALTH_LOCKED.first(conn, provider)
    if row is None:  # the provider's first judged completion: make its row (once, any replica)
        _ENSURE.run(conn, provider, TrustState.LEARNING.value, now)
        row = _HEALTH_LOCKED.first(conn, provider)
        assert row is not None
    return _health(row), int(row[8])


def _store(conn: Connection, provider: str, health: Health, version: int, now: datetime) -> None:
    values = (
        health.state.value,
        health.streak,
        health.misses,
        health.webhook_first,
        health.late,
        health.missed,
        health.changed_at,
        health.last_miss_operation,
    )
    if _STORE.run(conn, *values, now, version + 1, provider, version).rowcount != 1:
        raise StaleWrite(f"provider {provider}: webhook health changed since version {version}")


def trusted_increment(provider: str, count: int, now: datetime) -> Bound:
    """The steady state in one atomic statement: a trusted provider's webhook-first count.

    The increments are expressions on the row as it is when locked, so concurrent writers
    add up; the state is untouched (``core.trust.count`` never moves a trusted provider on
    a webhook-first completion). It changes no row when the provider is not trusted: then
    count normally (``count_completions(..., increment_tried=True)``). Run on its own, or
    with the write that stores the evidence (``Journal.write``'s ``Checked``).
    """
    return Bound(_INCREMENT, (count, count, now, provider, TrustState.TRUSTED.value))


def count_completions(
    conn: Connection,
    provider: str,
    judged: Sequence[tuple[Verdict, str]],
    now: datetime,
    policy: TrustPolicy,
    *,
    increment_tried: bool = False,
) -> list[Change]:
    """Count judged completions ``(verdict, operation id)`` into the provider's health, in order.

    Call last in the transaction that stores the evidence: the health row stays locked
    (PostgreSQL) from here to the commit, and nothing else waits on it meanwhile.
    ``increment_tried``: ``trusted_increment`` of these ran already and changed nothing.
    """
    if not judged:
        return []
    if (
        not increment_tried
        and all(v is Verdict.WEBHOOK_FIRST for v, _ in judged)
        and trusted_increment(provider, len(judged), now).run(conn).rowcount == 1
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


def verdict_row(
    op: OperationRecord,
    verdict: Verdict,
    *,
    asked_at: datetime,
    seen_at: datetime,
    hinted_at: datetime | None,
    settle_after: datetime | None,
) -> Bound:
    """How ``op``'s end was first learned of: a row written with the move that records the
    end (``Journal.transition(also=...)``), so the evidence exists exactly when the move does."""
    values = (
        op.id,
        op.provider,
        op.remote_job_id,
        verdict.value,
        asked_at,
        seen_at,
        hinted_at,
        settle_after,
        None if verdict is Verdict.PENDING else seen_at,
    )
    return Bound(_INSERT_VERDICT, values)


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
    return _ANY_DUE_PENDING.first(conn, Verdict.PENDING.value, now) is not None


def due_pending(conn: Connection, now: datetime, limit: int) -> list[PendingVerdict]:
    """Pending completions whose grace is over, oldest first, locked for this transaction."""
    rows = _DUE_PENDING.rows(conn, Verdict.PENDING.value, now, limit)
    return [PendingVerdict(*row) for row in rows]


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
    window = [at for at in (after, until) if at is not None]
    sql = _first_webhook_sql(after is not None, until is not None)
    value = sql.value(conn, provider, job_id, *window)
    return value if isinstance(value, datetime) else None


def judge(
    conn: Connection,
    pending: PendingVerdict,
    verdict: Verdict,
    hinted_at: datetime | None,
    now: datetime,
) -> None:
    _JUDGE.run(conn, verdict.value, hinted_at, now, pending.id, Verdict.PENDING.value)


def stretched_operations(conn: Connection, provider: str, limit: int) -> list[OperationRecord]:
    """Observing operations of ``provider`` on a stretched schedule, locked (PostgreSQL).

    Rows another transaction holds are skipped: the next sweep finds them again.
    """
    rows = _STRETCHED.rows(conn, provider, State.OBSERVING.value, limit)
    return [record_of_values(row) for row in rows]


def has_stretched(conn: Connection, provider: str) -> bool:
    """Whether any operation of ``provider`` waits on a stretched schedule (an index probe)."""
    return _ANY_STRETCHED.first(conn, provider, State.OBSERVING.value) is not None


def last_webhook_at(conn: Connection, provider: str) -> datetime | None:
    value = _LAST_WEBHOOK.value(conn, provider)
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
