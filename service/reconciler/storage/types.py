"""Column types shared by the models and the migrations (migrations import only this)."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.types import TypeDecorator

from reconciler.core.clock import utc


class UTCDateTime(TypeDecorator[datetime]):
    """Stores naive UTC, returns aware UTC: identical behaviour on SQLite and PostgreSQL."""

    impl = sa.DateTime(timezone=False)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        return utc(value).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        return utc(value)
