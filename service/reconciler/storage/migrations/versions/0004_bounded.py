"""bounded by design: payloads beside the row, value fingerprints, quotas, per-agent secrets

* The request, metadata, confirming status answer and result move to
  ``operation_payloads`` (one row per part), so the operation row's many small
  writes no longer rewrite them; existing rows are carried over.
* Request fingerprints are recomputed from the stored request with RFC 8785
  number forms (``1`` and ``1.0`` are one request); what creation granted
  (deadline, status budget) is kept for idempotent retries, read back from each
  operation's first history entry.
* ``create_lookups`` counts idempotency-key lookups, so the create backoff grows
  with them; an index counts each agent's operations in flight.
* Tokens may expire, and carry the salt of their agent's own callback secret
  (existing tokens have none: their callbacks stay signed with the shared
  secret until ``reconciler tokens rotate-callback-secret`` gives them one).

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from alembic import op

from reconciler.core.canonical import request_fingerprint
from reconciler.storage.types import UTCDateTime

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

PARTS = ("request", "meta", "status_body", "result")
BATCH = 500

_payloads = sa.table(
    "operation_payloads",
    sa.column("operation_id", sa.String),
    sa.column("name", sa.String),
    sa.column("value", sa.JSON),
)


def _is_json_null(column: str) -> str:
    """SQL true when the column holds a JSON ``null`` (how SQLAlchemy stores Python None)."""
    if op.get_context().dialect.name == "postgresql":
        return f"CAST({column} AS TEXT) = 'null'"
    return f"{column} = 'null'"


def upgrade() -> None:
    op.create_table(
        "operation_payloads",
        sa.Column("operation_id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=20), nullable=False),
        sa.Column("value", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["operation_id"], ["operations.id"]),
        sa.PrimaryKeyConstraint("operation_id", "name"),
    )
    for part in PARTS:
        op.execute(
            f"INSERT INTO operation_payloads (operation_id, name, value) "
            f"SELECT id, '{part}', {part} FROM operations "
            f"WHERE {part} IS NOT NULL AND NOT ({_is_json_null(part)})"
        )
    with op.batch_alter_table("operations") as batch:
        for part in PARTS:
            batch.drop_column(part)
        batch.add_column(
            sa.Column("create_lookups", sa.Integer(), nullable=False, server_default="0")
        )
        batch.add_column(sa.Column("requested_deadline_seconds", sa.Float(), nullable=True))
        batch.add_column(sa.Column("requested_max_status_requests", sa.Integer(), nullable=True))
        batch.create_index("ix_operations_caller_state", ["caller", "state"])
    with op.batch_alter_table("api_tokens") as batch:
        batch.add_column(sa.Column("expires_at", UTCDateTime(), nullable=True))
        batch.add_column(sa.Column("callback_salt", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("previous_callback_salt", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("previous_callback_until", UTCDateTime(), nullable=True))
    _recompute()


def _granted(created_at: datetime, detail: Any) -> tuple[float | None, int | None]:
    """Deadline and budget as the first history entry recorded them at creation."""
    if not isinstance(detail, dict):
        return None, None
    deadline: float | None = None
    budget = detail.get("max_status_requests")
    try:
        at = datetime.fromisoformat(str(detail.get("deadline_at")))
        if at.tzinfo is None or created_at.tzinfo is None:
            at, created_at = at.replace(tzinfo=None), created_at.replace(tzinfo=None)
        deadline = round((at - created_at).total_seconds(), 6)
    except ValueError:
        deadline = None
    return deadline, budget if isinstance(budget, int) and not isinstance(budget, bool) else None


def _recompute() -> None:
    """Fingerprints by value, and the granted limits, for every stored operation."""
    conn = op.get_bind()
    ops = sa.table(
        "operations",
        sa.column("id", sa.String),
        sa.column("provider", sa.String),
        sa.column("created_at", UTCDateTime),
        sa.column("request_fingerprint", sa.String),
        sa.column("requested_deadline_seconds", sa.Float),
        sa.column("requested_max_status_requests", sa.Integer),
    )
    history = sa.table(
        "history",
        sa.column("operation_id", sa.String),
        sa.column("seq", sa.Integer),
        sa.column("detail", sa.JSON),
    )
    last = ""
    while True:
        rows = conn.execute(
            sa.select(
                ops.c.id, ops.c.provider, ops.c.created_at, _payloads.c.value, history.c.detail
            )
            .select_from(
                ops.outerjoin(
                    _payloads,
                    sa.and_(_payloads.c.operation_id == ops.c.id, _payloads.c.name == "request"),
                ).outerjoin(
                    history, sa.and_(history.c.operation_id == ops.c.id, history.c.seq == 1)
                )
            )
            .where(ops.c.id > last)
            .order_by(ops.c.id)
            .limit(BATCH)
        ).all()
        if not rows:
            return
        for op_id, provider, created_at, request, detail in rows:
            deadline, budget = _granted(created_at, detail)
            conn.execute(
                sa.update(ops)
                .where(ops.c.id == op_id)
                .values(
                    request_fingerprint=request_fingerprint(provider, request),
                    requested_deadline_seconds=deadline,
                    requested_max_status_requests=budget,
                )
            )
        last = rows[-1][0]


def downgrade() -> None:
    with op.batch_alter_table("api_tokens") as batch:
        batch.drop_column("previous_callback_until")
        batch.drop_column("previous_callback_salt")
        batch.drop_column("callback_salt")
        batch.drop_column("expires_at")
    with op.batch_alter_table("operations") as batch:
        batch.drop_index("ix_operations_caller_state")
        batch.drop_column("requested_max_status_requests")
        batch.drop_column("requested_deadline_seconds")
        batch.drop_column("create_lookups")
        batch.add_column(sa.Column("request", sa.JSON(), nullable=True))
        for part in PARTS[1:]:
            batch.add_column(sa.Column(part, sa.JSON(), nullable=True))
    for part in PARTS:
        op.execute(
            f"UPDATE operations SET {part} = (SELECT value FROM operation_payloads p "
            f"WHERE p.operation_id = operations.id AND p.name = '{part}')"
        )
    op.execute("UPDATE operations SET request = '{}' WHERE request IS NULL")
    with op.batch_alter_table("operations") as batch:
        batch.alter_column("request", existing_type=sa.JSON(), nullable=False)
    op.drop_table("operation_payloads")
