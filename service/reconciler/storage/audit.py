"""Verify every operation's history chain against its row, and the retention log.

What retention pruned is gone from both sides (rows and their history), so the chains
that remain still verify; the log of prunes (``core.retention``) says what went, and is
checked as a chain of its own, against its head kept apart, and against the tombstones
its records left.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from itertools import groupby
from typing import Any

import sqlalchemy as sa

from reconciler.core.chain import ChainFault, verify_chain
from reconciler.core.retention import (
    RecordFault,
    RetentionSummary,
    check_head,
    check_tombstones,
    verify_records,
)
from reconciler.storage.database import Database
from reconciler.storage.fastsql import Sql
from reconciler.storage.retention import kept_tombstones, log_head, retention_log
from reconciler.storage.tables import HISTORY, OPS

_HEADS = Sql("chain-heads", OPS, "SELECT id, history_head, history_seq FROM operations")


@dataclass(frozen=True)
class AuditReport:
    operations: int
    entries: int
    fault: ChainFault | RecordFault | None
    retention: RetentionSummary | None = None

    @property
    def ok(self) -> bool:
        return self.fault is None


def _counted(rows: Iterator[Mapping[str, Any]], counter: list[int]) -> Iterator[Mapping[str, Any]]:
    for row in rows:
        counter[0] += 1
        yield row


def _rows(result: sa.CursorResult[Any]) -> Iterator[Mapping[str, Any]]:
    for row in result.mappings():
        yield dict(row)


def verify(db: Database, key: bytes | None) -> AuditReport:
    """The retention log, then all chains; stop at the first bad record or entry (ordered by
    operation id, then seq)."""
    with db.read() as conn:
        records = retention_log(conn)
        retention, record_fault = verify_records(records, key)
        if record_fault is None:
            record_fault = check_head(records, log_head(conn))
        if record_fault is None:
            record_fault = check_tombstones(records, kept_tombstones(conn, key))
    if record_fault is not None:
        return AuditReport(0, 0, record_fault, retention)
    report = _verify_chains(db, key)
    return AuditReport(report.operations, report.entries, report.fault, retention)


def _verify_chains(db: Database, key: bytes | None) -> AuditReport:
    with db.read() as conn:
        heads = {op_id: (head, seq) for op_id, head, seq in _HEADS.rows(conn)}
        # The one read through SQLAlchemy: a server-side cursor, so the history is streamed.
        result = conn.execution_options(stream_results=True, yield_per=2000).execute(
            sa.select(HISTORY).order_by(HISTORY.c.operation_id, HISTORY.c.seq, HISTORY.c.id)
        )
        seen: set[str] = set()
        counter = [0]
        for op_id, group in groupby(
            _counted(_rows(result), counter), key=lambda r: r["operation_id"]
        ):
            seen.add(op_id)
            if op_id not in heads:
                first = next(group)
                fault = ChainFault(
                    first["id"],
                    op_id,
                    first["seq"],
                    "belongs to no operation (operation row deleted)",
                )
                return AuditReport(len(heads), counter[0], fault)
            head, count = heads[op_id]
            chain_fault = verify_chain(op_id, group, head, count, key)
            if chain_fault is not None:
                return AuditReport(len(heads), counter[0], chain_fault)
        for op_id in sorted(heads):
            head, count = heads[op_id]
            if op_id not in seen and count != 0:
                fault = ChainFault(
                    None, op_id, None, f"the operation records {count} entries but none remain"
                )
                return AuditReport(len(heads), counter[0], fault)
    return AuditReport(len(heads), counter[0], None)
