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

from sqlalchemy.engine import Connection

from reconciler.core.records import PAYLOADS, OperationRecord
from reconciler.storage.fastsql import Bound, Sql
from reconciler.storage.tables import PAYLOAD_TABLE

_DELETE = Sql(
    "payload-delete",
    PAYLOAD_TABLE,
    "DELETE FROM operation_payloads WHERE operation_id = ? AND name IN (?*)",
    params=("operation_id", "name"),
)
_UPSERT = Sql(
    "payload-upsert",
    PAYLOAD_TABLE,
    "INSERT INTO operation_payloads (operation_id, name, value) VALUES (?, ?, ?) "
    "ON CONFLICT (operation_id, name) DO UPDATE SET value = excluded.value",
    params=("operation_id", "name", "value"),
)
_LOAD = Sql(
    "payload-load",
    PAYLOAD_TABLE,
    "SELECT operation_id, name, value FROM operation_payloads "
    "WHERE operation_id IN (?*) AND name IN (?*)",
    params=("operation_id", "name"),
    returns=("operation_id", "name", "value"),
)
# Read with every operation: the view shows metadata and result, collection needs the status.
# The request is read only by the create step, which sends it.
WITH_ROW = ("meta", "status_body", "result")
REQUEST = "request"


def _part(name: str) -> str:
    return (
        "(SELECT value FROM operation_payloads "
        f"WHERE operation_id = operations.id AND name = '{name}')"
    )


def inline(request_when: str = "") -> str:
    """PostgreSQL reads an operation's parts with its row, in the same statement: one
    subquery per part, each a lookup of the parts' primary key, in ``PAYLOADS`` order after
    the row's columns (``records_of``). A claim or a lookup is then one round trip, not
    two; SQLite keeps its second statement (``load``), which costs it no round trip. The
    request only for the rows where ``request_when`` (SQL) holds, else never."""
    return ", ".join(
        _part(name)
        if name in WITH_ROW
        else (f"CASE WHEN {request_when} THEN {_part(name)} END" if request_when else "NULL")
        for name in PAYLOADS
    )


INLINE_RETURNS = ("operation_payloads.value",) * len(PAYLOADS)


def split(changes: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``changes`` as (row columns, payloads)."""
    row: dict[str, Any] = {}
    parts: dict[str, Any] = {}
    for name, value in changes.items():
        (parts if name in PAYLOADS else row)[name] = value
    return row, parts


def changes(operation_id: str, parts: Mapping[str, Any]) -> list[Bound]:
    """The statements that write the given parts (insert, or replace that part only); None
    removes a part. For ``Journal.write``'s ``also``, or ``store``."""
    gone = [name for name, value in parts.items() if value is None]
    out = [Bound(_DELETE, (operation_id, gone))] if gone else []
    out += [
        Bound(_UPSERT, (operation_id, name, value))
        for name, value in parts.items()
        if value is not None
    ]
    return out


def store(conn: Connection, operation_id: str, parts: Mapping[str, Any]) -> None:
    """Write the given parts now (see ``changes``)."""
    for change in changes(operation_id, parts):
        change.run(conn)


def load(
    conn: Connection, operation_ids: Sequence[str], names: Sequence[str] = WITH_ROW
) -> dict[str, dict[str, Any]]:
    """The named parts of each operation, by operation id (absent parts are left out)."""
    if not operation_ids:
        return {}
    out: dict[str, dict[str, Any]] = defaultdict(dict)
    for op_id, name, value in _LOAD.rows(conn, operation_ids, names):
        out[op_id][name] = value
    return out


def request_of(conn: Connection, op: OperationRecord) -> Any:
    """The create request: the record's when its read carried it (PostgreSQL's claim of a
    create not sent), else read now."""
    return op.request if op.request is not None else load_request(conn, op.id)


def load_request(conn: Connection, operation_id: str) -> Any:
    """The create request as the agent sent it (None if the operation has none stored)."""
    return load(conn, [operation_id], (REQUEST,)).get(operation_id, {}).get(REQUEST)
