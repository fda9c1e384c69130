"""Plain DB-API statements for the hot paths, encoded and decoded exactly like SQLAlchemy.

SQLAlchemy's per-statement work (building the statement, its cache key, the
parameter and result processing) costs more than SQLite's own work on a small
row; on the webhook batch and on every step of an operation's lifecycle that
dominates. The statements on those paths are therefore written as SQL text
(built once per shape and kept) and run on the driver's own cursor, and their
values are encoded exactly as the ORM types would store them (so every other
reader sees the same rows): timestamps as naive UTC (a text column on SQLite),
JSON as text on SQLite and as a JSON parameter on PostgreSQL, booleans as the
driver stores them. Rows read this way are decoded back the same way
(``Raw.row_decoder``): aware UTC timestamps, parsed JSON, booleans.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from functools import lru_cache
from operator import itemgetter
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from reconciler.storage.types import UTCDateTime

RowEncoder = Callable[[Mapping[str, Any]], tuple[Any, ...]]


def _same(value: Any) -> Any:
    return value


def _kind(column: sa.Column[Any]) -> str:
    if isinstance(column.type, UTCDateTime):
        return "time"
    if isinstance(column.type, sa.JSON):
        return "json"
    if isinstance(column.type, sa.Boolean):
        return "bool"
    return "plain"


def _read_json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str | bytes) else value


class Raw:
    """Statement text and value encoding for one dialect."""

    def __init__(self, dialect: str) -> None:
        self.sqlite = dialect == "sqlite"
        self.mark = "?" if self.sqlite else "%s"
        self._encoders: dict[tuple[str, tuple[str, ...]], tuple[Callable[[Any], Any], ...]] = {}
        self._rows: dict[tuple[str, tuple[str, ...]], RowEncoder] = {}
        self._decoders: dict[tuple[str, tuple[str, ...]], Callable[[Sequence[Any]], list[Any]]] = {}
        # Statement texts by name and shape, built once (see ``statement``).
        self._statements: dict[Any, str] = {}
        self._last_time: tuple[datetime | None, Any] = (None, None)

    def time(self, value: datetime | None) -> Any:
        if value is None:
            return None
        # A batch stamps many rows with the same instant: encode it once.
        last = self._last_time
        if last[0] is value:
            return last[1]
        plain = value
        if plain.tzinfo is not None:
            if plain.utcoffset():
                plain = plain.astimezone(UTC)
            plain = plain.replace(tzinfo=None)
        # SQLAlchemy's SQLite DATETIME text: always six fractional digits.
        out = plain.isoformat(" ", "microseconds") if self.sqlite else plain
        self._last_time = (value, out)  # one assignment: safe to share between threads
        return out

    def read_time(self, value: Any) -> datetime | None:
        """A timestamp as stored (text on SQLite, naive UTC) back to an aware UTC datetime."""
        if value is None:
            return None
        if isinstance(value, str):
            value = datetime.fromisoformat(value)
        return value.replace(tzinfo=UTC)  # type: ignore[no-any-return]

    def json(self, value: Any) -> Any:
        if value is None:
            return None
        if self.sqlite:
            return json.dumps(value)
        from psycopg.types.json import Json

        return Json(value)

    def decoder(self, column: sa.Column[Any]) -> Callable[[Any], Any] | None:
        """How a stored value of ``column`` becomes what the ORM would return (None: as it is)."""
        kind = _kind(column)
        if kind == "time":
            return self.read_time
        if kind == "json" and self.sqlite:
            # SQLite keeps JSON as text; psycopg returns it parsed already.
            return _read_json
        if kind == "bool" and self.sqlite:
            return bool
        return None

    def row_decoder(
        self, table: sa.Table, columns: Sequence[str]
    ) -> Callable[[Sequence[Any]], list[Any]]:
        """A function from a stored row (``columns`` order) to its decoded values."""
        key = (f"decode:{table.name}", tuple(columns))
        found = self._decoders.get(key)
        if found is None:
            special = [
                (i, code)
                for i, c in enumerate(columns)
                if (code := self.decoder(table.c[c])) is not None
            ]

            def decode(row: Sequence[Any]) -> list[Any]:
                values = list(row)
                for i, code in special:
                    value = values[i]
                    if value is not None:
                        values[i] = code(value)
                return values

            found = self._decoders[key] = decode
        return found

    def in_list(self, column: str, values: Sequence[Any]) -> tuple[str, list[Any]]:
        """``column IN (...)`` and its parameters (PostgreSQL: one array, one statement text)."""
        if self.sqlite:
            return f"{column} IN ({self.placeholders(len(values))})", list(values)
        return f"{column} = ANY({self.mark})", [list(values)]

    def encode(self, column: sa.Column[Any], value: Any) -> Any:
        return self.encoder(column)(value)

    def encoder(self, column: sa.Column[Any]) -> Callable[[Any], Any]:
        """The function that encodes values of ``column`` (look it up once, use it often)."""
        kind = _kind(column)
        if kind == "time":
            return self.time
        if kind == "json":
            return self.json
        return _same

    def encoders(self, table: sa.Table, columns: Sequence[str]) -> tuple[Callable[[Any], Any], ...]:
        key = (table.name, tuple(columns))
        found = self._encoders.get(key)
        if found is None:
            found = self._encoders[key] = tuple(self.encoder(table.c[c]) for c in columns)
        return found

    def row_encoder(self, table: sa.Table, columns: Sequence[str]) -> RowEncoder:
        """A function from a row mapping to its encoded values in ``columns`` order."""
        key = (table.name, tuple(columns))
        found = self._rows.get(key)
        if found is None:
            getter = itemgetter(*columns)
            # itemgetter of one key returns the value itself, not a 1-tuple.
            pick = getter if len(columns) > 1 else lambda row: (getter(row),)
            special = [
                (i, code)
                for i, code in enumerate(self.encoders(table, columns))
                if code is not _same
            ]

            def encode(row: Mapping[str, Any]) -> tuple[Any, ...]:
                values = list(pick(row))
                for i, code in special:
                    values[i] = code(values[i])
                return tuple(values)

            found = self._rows[key] = encode
        return found

    def placeholders(self, count: int) -> str:
        return ", ".join([self.mark] * count)

    def statement(self, key: Any, build: Callable[[Raw], str]) -> str:
        """The SQL text for ``key``, built by ``build`` the first time only."""
        found = self._statements.get(key)
        if found is None:
            found = self._statements[key] = build(self)
        return found


@lru_cache(maxsize=4)
def raw_for(dialect: str) -> Raw:
    return Raw(dialect)


def run(conn: Connection, sql: str, params: Any = (), *, many: bool = False) -> Any:
    """Run ``sql`` on the connection's own driver cursor, inside its transaction.

    ``exec_driver_sql`` still builds an execution context per statement (about 20 µs,
    more than SQLite takes for a small write). Driver errors are raised as SQLAlchemy
    ``DBAPIError``s, a lost connection invalidated, exactly as SQLAlchemy would, so
    ``translate_errors`` treats both paths alike. Parameters never go into the error.
    """
    dbapi_conn = conn.connection
    cursor = dbapi_conn.cursor()
    try:
        if many:
            cursor.executemany(sql, params)
        else:
            cursor.execute(sql, params)
    except conn.dialect.loaded_dbapi.Error as exc:
        lost = conn.dialect.is_disconnect(exc, dbapi_conn, cursor)
        if lost:
            conn.invalidate(exc)
        raise sa.exc.DBAPIError.instance(
            sql,
            params,
            exc,
            conn.dialect.loaded_dbapi.Error,
            hide_parameters=True,
            connection_invalidated=lost,
            dialect=conn.dialect,
        ) from exc
    return cursor


def insert_many(
    conn: Connection, table: sa.Table, columns: Sequence[str], rows: Sequence[Sequence[Any]]
) -> None:
    """``INSERT`` rows of already encoded values with one ``executemany``."""
    if not rows:
        return
    raw = raw_for(conn.dialect.name)
    sql = raw.statement(
        ("insert", table.name, tuple(columns)),
        lambda r: (
            f"INSERT INTO {table.name} ({', '.join(columns)}) "
            f"VALUES ({r.placeholders(len(columns))})"
        ),
    )
    if len(rows) == 1:
        run(conn, sql, rows[0])
    else:
        run(conn, sql, list(rows), many=True)


def insert_new(
    conn: Connection,
    table: sa.Table,
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    unique: Sequence[str],
    returning: Sequence[str],
) -> list[tuple[Any, ...]]:
    """Insert rows that do not collide on ``unique``; returns the inserted rows' ``returning``.

    One multi-row statement (so it can return rows on both backends); the unique
    constraint, not a prior read, decides what is new, so concurrent writers cannot
    both believe they inserted the same row.
    """
    if not rows:
        return []
    raw = raw_for(conn.dialect.name)
    one = f"({raw.placeholders(len(columns))})"
    sql = (
        f"INSERT INTO {table.name} ({', '.join(columns)}) VALUES "
        f"{', '.join([one] * len(rows))} "
        f"ON CONFLICT ({', '.join(unique)}) DO NOTHING RETURNING {', '.join(returning)}"
    )
    params = [value for row in rows for value in row]
    return [tuple(r) for r in run(conn, sql, tuple(params)).fetchall()]


def update_many(
    conn: Connection,
    table: sa.Table,
    set_columns: Sequence[str],
    where_columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
) -> int | None:
    """``UPDATE ... SET a = ?, ... WHERE k = ? AND ...`` for each row (set values first).

    Returns the number of rows changed, or None when the driver cannot tell for a batch.
    """
    if not rows:
        return 0
    raw = raw_for(conn.dialect.name)
    sets = ", ".join(f"{c} = {raw.mark}" for c in set_columns)
    where = " AND ".join(f"{c} = {raw.mark}" for c in where_columns)
    cursor = run(conn, f"UPDATE {table.name} SET {sets} WHERE {where}", list(rows), many=True)
    return cursor.rowcount if conn.dialect.supports_sane_multi_rowcount else None


def select_where_in(
    conn: Connection,
    table: sa.Table,
    columns: Sequence[str],
    equals: tuple[str, Any],
    column: str,
    values: Sequence[Any],
    *,
    lock: bool = False,
) -> list[tuple[Any, ...]]:
    """``SELECT columns WHERE equals AND column IN values`` with timestamps decoded."""
    if not values:
        return []
    raw = raw_for(conn.dialect.name)
    sql = (
        f"SELECT {', '.join(columns)} FROM {table.name} WHERE {equals[0]} = {raw.mark} "
        f"AND {column} IN ({raw.placeholders(len(values))})" + (" FOR UPDATE" if lock else "")
    )
    times = [i for i, c in enumerate(columns) if _kind(table.c[c]) == "time"]
    out = []
    for row in run(conn, sql, (equals[1], *values)).fetchall():
        values_out = list(row)
        for i in times:
            values_out[i] = raw.read_time(values_out[i])
        out.append(tuple(values_out))
    return out
