"""The operation_payloads table: an operation's big parts, each written once, beside its row.

Guarantee: a status read writes only what changed. The create request (up to the
body limit), the metadata, the status answer that confirmed success and the
result are stored here, one row per part, and never rewritten by the row's
other writes: on SQLite an UPDATE rewrites the whole record, overflow pages
included, so a 1 MB request on the operations row would be written again by
every claim, charge, observation and release. Written only through the journal
(``storage.journal``), in the transaction of the change they belong to.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from reconciler.storage.models import PAYLOADS, OperationPayload

PAYLOAD_TABLE = OperationPayload.__table__  # type: ignore[attr-defined]
# Read with every operation: the view shows metadata and result, collection needs the status.
# The request is read only by the create step, which sends it.
WITH_ROW = ("meta", "status_body", "result")
REQUEST = "request"


def split(changes: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``changes`` as (row columns, payloads)."""
    row: dict[str, Any] = {}
    parts: dict[str, Any] = {}
    for name, value in changes.items():
        (parts if name in PAYLOADS else row)[name] = value
    return row, parts


def store(conn: Connection, operation_id: str, parts: Mapping[str, Any]) -> None:
    """Write the given parts (insert, or replace that part only); None removes a part."""
    gone = [name for name, value in parts.items() if value is None]
    if gone:
        conn.execute(
            sa.delete(PAYLOAD_TABLE).where(
                PAYLOAD_TABLE.c.operation_id == operation_id, PAYLOAD_TABLE.c.name.in_(gone)
            )
        )
    rows = [
        {"operation_id": operation_id, "name": name, "value": value}
        for name, value in parts.items()
        if value is not None
    ]
    if not rows:
        return
    insert = postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert
    statement = insert(PAYLOAD_TABLE).values(rows)
    conn.execute(
        statement.on_conflict_do_update(
            index_elements=["operation_id", "name"], set_={"value": statement.excluded.value}
        )
    )


def load(
    conn: Connection, operation_ids: Sequence[str], names: Sequence[str] = WITH_ROW
) -> dict[str, dict[str, Any]]:
    """The named parts of each operation, by operation id (absent parts are left out)."""
    if not operation_ids:
        return {}
    query = sa.select(PAYLOAD_TABLE.c.operation_id, PAYLOAD_TABLE.c.name, PAYLOAD_TABLE.c.value)
    if len(operation_ids) == 1:
        query = query.where(PAYLOAD_TABLE.c.operation_id == operation_ids[0])
    else:
        query = query.where(PAYLOAD_TABLE.c.operation_id.in_(list(operation_ids)))
    out: dict[str, dict[str, Any]] = defaultdict(dict)
    for op_id, name, value in conn.execute(query.where(PAYLOAD_TABLE.c.name.in_(list(names)))):
        out[op_id][name] = value
    return out


def load_request(conn: Connection, operation_id: str) -> Any:
    """The create request as the agent sent it (None if the operation has none stored)."""
    return load(conn, [operation_id], (REQUEST,)).get(operation_id, {}).get(REQUEST)
