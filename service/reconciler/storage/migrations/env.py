"""Alembic environment: runs on the connection handed in by ``reconciler.storage.migrate``."""

from __future__ import annotations

from alembic import context

from reconciler.storage.models import TABLES

config = context.config
connection = config.attributes.get("connection")
if connection is None:  # pragma: no cover - only via the alembic CLI
    import sqlalchemy as sa

    connection = sa.create_engine(config.get_main_option("sqlalchemy.url") or "").connect()

context.configure(
    connection=connection,
    target_metadata=TABLES,
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
