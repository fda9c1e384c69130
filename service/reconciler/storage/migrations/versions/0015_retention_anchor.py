"""retention anchor: the log's head kept apart, tombstones counted into the log

``audit verify`` did not see the newest retention records go (nothing outside the log
named its end), nor tombstones deleted or edited. The log's head (its last record's
number and hash) is now kept in a row of ``retention_head``, as an operation's row
keeps its history's head; each prune record counts the tombstones it left and carries a
digest of them (their ``record_seq`` names the record), and expiring tombstones appends
a record of what went (``expired_of``). Records and tombstones from before this
revision are not covered: their new columns stay NULL.

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("retention_log", sa.Column("tombstones", sa.Integer(), nullable=True))
    op.add_column(
        "retention_log", sa.Column("tombstones_digest", sa.String(length=64), nullable=True)
    )
    op.add_column("retention_log", sa.Column("expired_of", sa.Integer(), nullable=True))
    op.add_column("tombstones", sa.Column("record_seq", sa.Integer(), nullable=True))
    op.create_index("ix_tombstones_record", "tombstones", ["record_seq"])
    op.create_table(
        "retention_head",
        sa.Column("name", sa.String(length=40), primary_key=True),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("hash", sa.String(length=128), nullable=False),
    )
    op.execute(
        "INSERT INTO retention_head (name, seq, hash) SELECT 'retention', seq, hash "
        "FROM retention_log WHERE seq = (SELECT max(seq) FROM retention_log)"
    )


def downgrade() -> None:
    op.drop_table("retention_head")
    op.drop_index("ix_tombstones_record", table_name="tombstones")
    with op.batch_alter_table("tombstones") as batch:
        batch.drop_column("record_seq")
    with op.batch_alter_table("retention_log") as batch:
        batch.drop_column("expired_of")
        batch.drop_column("tombstones_digest")
        batch.drop_column("tombstones")
