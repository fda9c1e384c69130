"""One handle per table: the ``sa.Table`` each SQLModel model declares, typed.

The models (``storage.models``) are the one declaration of the schema; the queries
(``storage.fastsql`` and the modules beside this one) need the table itself, which
SQLModel sets as ``__table__`` without telling the type checker. ``table_of`` reads
it once, checked, and every module takes its table from here, so no two names stand
for one table.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlmodel import SQLModel

from reconciler.storage.models import (
    ApiToken,
    CompletionStep,
    Escalation,
    HistoryEntry,
    MaintenanceLease,
    Operation,
    OperationPayload,
    ProviderHealth,
    RetentionHead,
    RetentionRecord,
    Tombstone,
    WebhookEvent,
    WebhookVerdict,
)


def table_of(model: type[SQLModel]) -> sa.Table:
    """The table a ``table=True`` model declares (a plain model has none: TypeError)."""
    table = getattr(model, "__table__", None)
    if not isinstance(table, sa.Table):
        raise TypeError(f"{model.__name__} declares no table (is it table=True?)")
    return table


OPS = table_of(Operation)
# The row's columns in the table's order, which is a record's (``core.records.COLUMNS``).
OPS_COLUMNS = tuple(c.name for c in OPS.c)
HISTORY = table_of(HistoryEntry)
PAYLOAD_TABLE = table_of(OperationPayload)  # not core.records.PAYLOADS: those are its fields
TOKENS = table_of(ApiToken)
EVENTS = table_of(WebhookEvent)
ESCALATIONS = table_of(Escalation)
STEPS = table_of(CompletionStep)
HEALTH = table_of(ProviderHealth)
VERDICTS = table_of(WebhookVerdict)
TOMBSTONES = table_of(Tombstone)
RETENTION_LOG = table_of(RetentionRecord)
RETENTION_HEAD = table_of(RetentionHead)
LEASES = table_of(MaintenanceLease)
