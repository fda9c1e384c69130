"""escalation_open: whether the operation's escalation still awaits its decision

An end state that an open escalation may reopen (result_timed_out,
cancellation_unconfirmed) is not done until the decision is recorded. The flag
is written with the escalation and with the decision, so the list's ``done``
filter is a condition on the row and a long-poll can tell from the record it
holds. Existing rows take it from their escalation.

Revision ID: 0011
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("operations") as batch:
        batch.add_column(
            sa.Column("escalation_open", sa.Boolean(), nullable=False, server_default=sa.false())
        )
    op.execute(
        "UPDATE operations SET escalation_open = TRUE WHERE escalation_id IN "
        "(SELECT id FROM escalations WHERE decided_at IS NULL)"
    )


def downgrade() -> None:
    with op.batch_alter_table("operations") as batch:
        batch.drop_column("escalation_open")
