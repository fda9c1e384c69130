"""The one way statements reach the database: named SQL text run on the driver's cursor.

Tables are declared once, as SQLModel models (``storage.models``, which Alembic
reads). Each repository module names its statements per table at its top
(``Sql``: the text, the column each parameter belongs to, the columns it returns)
and runs them here, on the connection's own DB-API cursor inside its transaction
(psycopg prepares a statement text it has run a few times). SQLAlchemy's
per-statement work (building the statement, its cache key, an execution context)
costs more than SQLite's own work on a small row, which is why the statements are
text and not expressions.

Values are encoded and decoded by each column's own SQLAlchemy type for the
connection's dialect (``bind_processor``/``result_processor``, see ``Codec``), so
every reader sees the rows the ORM would have written: timestamps naive UTC (text
on SQLite) and read back aware UTC, JSON as text on SQLite and as a JSON parameter
on PostgreSQL, booleans as the driver stores them. A None is SQL NULL, JSON too.

Marks: ``?`` is one value; ``(?*)`` after ``IN`` is a list (SQLite: one mark per
value; PostgreSQL: ``= ANY`` of one array, so the text, and its prepared plan, does
not depend on the list's length). ``[[postgres|sqlite]]`` is text that differs
between the two (a row lock SQLite has no syntax for: ``[[FOR UPDATE|]]``).

Two paths stay with SQLAlchemy: migrations keep Alembic's operations (they change the
schema, not the rows), and the audit streams the whole history through a server-side
cursor (``stream_results``), which the driver cursor here does not offer.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import count, repeat
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from reconciler.storage.on_loop import WriterLocal

Encode = Callable[[Any], Any]
RowDecoder = Callable[[Sequence[Any]], Sequence[Any]]
AS_IS = ""  # a parameter or result that belongs to no column: passed and returned as it is

_LIST = "(?*)"
# A plain INSERT of one row's values: on PostgreSQL ``many`` sends its rows as one
# statement of many VALUES groups (one round trip and one execution, not one per row).
_ONE_ROW_INSERT = re.compile(r"^(INSERT INTO \w+ \([^)]*\) VALUES )(\([?, ]*\))$")
# At most this many rows to one such statement (PostgreSQL takes 65,535 values at most).
MANY_ROWS = 500
_PG_LIST = re.compile(r"\b([\w.]+) IN \(\?\*\)")
_EITHER = re.compile(r"\[\[(.*?)\|(.*?)\]\]")
_MARK = re.compile(r"\?")


def _skip_none(code: Encode) -> Encode:
    def encode(value: Any) -> Any:
        return None if value is None else code(value)

    return encode


def _remember_last(code: Encode) -> Encode:
    """``code`` that encodes the same object twice in a row once (a batch shares an instant)."""
    last: list[tuple[Any, Any]] = [(None, None)]

    def encode(value: Any) -> Any:
        if value is None:
            return None
        seen = last[0]  # one (value, encoded) pair: safe to share between threads
        if seen[0] is value:
            return seen[1]
        out = code(value)
        last[0] = (value, out)
        return out

    return encode


def _values(row: Sequence[Any]) -> Sequence[Any]:
    return row


def _is_time(column: sa.Column[Any]) -> bool:
    kind = column.type
    if isinstance(kind, sa.TypeDecorator):
        kind = kind.impl_instance
    try:
        return kind.python_type is datetime
    except NotImplementedError:
        return False


class Codec:
    """Each column's encoding (Python value to driver value) and decoding, for one dialect.

    Both come from the column's SQLAlchemy type: ``type.dialect_impl(dialect)``'s
    ``bind_processor`` and ``result_processor`` (given the driver's type code of the
    result column, as SQLAlchemy gives it), exactly what a Core statement applies.
    """

    def __init__(self, dialect: sa.Dialect) -> None:
        self.dialect = dialect
        self.sqlite = dialect.name == "sqlite"
        self._encoders: dict[sa.Column[Any], Encode | None] = {}
        self._decoders: dict[tuple[sa.Column[Any], Any], Encode | None] = {}

    def encoder(self, column: sa.Column[Any]) -> Encode | None:
        """How a value of ``column`` is handed to the driver (None: as it is)."""
        try:
            return self._encoders[column]
        except KeyError:
            pass
        bind = column.type.dialect_impl(self.dialect).bind_processor(self.dialect)
        code: Encode | None = None
        if bind is not None:
            # A batch stamps many rows with one instant (an immutable value): encode it once.
            code = _remember_last(bind) if _is_time(column) else _skip_none(bind)
        self._encoders[column] = code
        return code

    def decoder(self, column: sa.Column[Any], type_code: Any = None) -> Encode | None:
        """How a stored value of ``column`` becomes what the ORM returns (None: as it is).

        ``type_code``: the driver's code for the result column's type (``cursor.description``).
        """
        key = (column, type_code)
        try:
            return self._decoders[key]
        except KeyError:
            pass
        impl = column.type.dialect_impl(self.dialect)
        code = self._decoders[key] = impl.result_processor(self.dialect, type_code)
        return code

    def encode(self, column: sa.Column[Any], value: Any) -> Any:
        code = self.encoder(column)
        return value if code is None or value is None else code(value)

    def row_decoder(
        self, columns: Sequence[sa.Column[Any] | None], description: Sequence[Any] | None
    ) -> RowDecoder:
        """A function from a result row to its decoded values (``columns``: what each is)."""
        codes = [d[1] for d in description] if description else [None] * len(columns)
        special = [
            (i, code)
            for i, (c, type_code) in enumerate(zip(columns, codes, strict=False))
            if c is not None and (code := self.decoder(c, type_code)) is not None
        ]
        if not special:
            return _values

        def decode(row: Sequence[Any]) -> list[Any]:
            values = list(row)
            for i, code in special:
                value = values[i]
                if value is not None:
                    values[i] = code(value)
            return values

        return decode


def column_of(table: sa.Table | None, name: str) -> sa.Column[Any] | None:
    """``name`` of ``table``, or ``other_table.name``; None for ``AS_IS``."""
    if name == AS_IS:
        return None
    if table is None:
        raise ValueError(f"{name!r} names a column, but the statement has no table")
    if "." in name:
        other, _, column = name.partition(".")
        return table.metadata.tables[other].c[column]
    return table.c[name]


_codecs: dict[type[sa.Dialect], Codec] = {}


def codec_for(dialect: sa.Dialect) -> Codec:
    """The codec of this kind of dialect (the processors depend on the driver only)."""
    found = _codecs.get(type(dialect))
    if found is None:
        found = _codecs[type(dialect)] = Codec(dialect)
    return found


class _Prepared:
    """A statement's text and codes for one dialect."""

    __slots__ = (
        "codec",
        "decode",
        "encoders",
        "lists",
        "order",
        "parts",
        "results",
        "row_texts",
        "spread",
        "text",
        "texts",
        "values_group",
    )

    def __init__(self, sql: Sql, codec: Codec) -> None:
        self.codec = codec
        columns = [column_of(sql.table, p) for p in sql.params]
        self.encoders = tuple(codec.encoder(c) if c is not None else None for c in columns)
        self.results = [column_of(sql.table, r) for r in sql.returns]
        # Built at the first result, from the driver's types of its columns.
        self.decode: RowDecoder | None = None
        text = _EITHER.sub(r"\2" if codec.sqlite else r"\1", sql.text)
        self.lists = frozenset(i for i, is_list in enumerate(_marks(text)) if is_list)
        self.order = sorted(self.lists)
        self.texts: dict[tuple[int, ...], str] = {}  # SQLite: by the lists' lengths
        # SQLite: one mark per value, so the text depends on the lists' lengths.
        self.spread = codec.sqlite and bool(self.lists)
        self.parts = text.split(_LIST)
        one_row = None if codec.sqlite or self.lists else _ONE_ROW_INSERT.match(text)
        self.values_group = one_row.groups() if one_row is not None else None
        self.row_texts: dict[int, str] = {}  # PostgreSQL's many-row INSERT, by its rows
        if not codec.sqlite:
            text = _PG_LIST.sub(r"\1 = ANY(?)", text)
            if _LIST in text:
                raise ValueError(f"{sql.name}: a list mark must follow 'column IN'")
        self.text = _dialect_text(text, codec)

    def params(self, values: Sequence[Any]) -> list[Any]:
        if not self.lists:
            return [
                value if code is None or value is None else code(value)
                for code, value in zip(self.encoders, values, strict=True)
            ]
        out: list[Any] = []
        for i, (code, value) in enumerate(zip(self.encoders, values, strict=True)):
            if i in self.lists:
                items = list(value) if code is None else [code(v) for v in value]
                if self.spread:
                    out += items
                else:
                    out.append(items)
            else:
                out.append(value if code is None or value is None else code(value))
        return out

    def rows_text(self, n: int) -> str | None:
        """The statement for ``n`` rows at once (None: it has no such form)."""
        if self.values_group is None:
            return None
        found = self.row_texts.get(n)
        if found is None:
            head, group = self.values_group
            found = _dialect_text(head + ", ".join(repeat(group, n)), self.codec)
            if len(self.row_texts) < 64:
                self.row_texts[n] = found
        return found

    def decoder(self, cursor: Any) -> RowDecoder:
        found = self.decode
        if found is None:
            found = self.decode = self.codec.row_decoder(self.results, cursor.description)
        return found

    def text_for(self, values: Sequence[Any]) -> str:
        if not self.spread:
            return self.text
        lengths = tuple(len(values[i]) for i in self.order)
        found = self.texts.get(lengths)
        if found is None:
            parts = iter(self.parts)
            found = next(parts)
            for length in lengths:
                found += "(" + ", ".join(repeat("?", length)) + ")" + next(parts)
            if len(self.texts) < 64:  # the common lengths; others are built each time
                self.texts[lengths] = found
        return found


def _marks(text: str) -> list[bool]:
    """For each mark in order: whether it is a list mark."""
    return [m == _LIST for m in re.findall(r"\(\?\*\)|\?", text)]


def _dialect_text(text: str, codec: Codec) -> str:
    if codec.sqlite:
        return text
    # Numbered marks on a raw cursor: psycopg parses a ``%s`` text for its marks on every
    # run once it is longer than 4 KiB or has more than 50 values (about 0.3 ms for a
    # write with its history and parts, three of them an operation).
    numbers = count(1)
    return _MARK.sub(lambda _: f"${next(numbers)}", text)


class Sql:
    """One named statement on one table: the text and what its values and results are.

    ``table`` None: a statement on no table (a lock, a notification), its values as they are.
    ``params``: the column each mark's value belongs to, in order (its type encodes the
    value; ``AS_IS`` for none, e.g. a LIMIT); ``table.column`` names another table's.
    ``returns``: the same for the columns the statement returns, which decode them.
    """

    __slots__ = ("_prepared", "name", "params", "returns", "table", "text")

    def __init__(
        self,
        name: str,
        table: sa.Table | None,
        text: str,
        params: Sequence[str] = (),
        returns: Sequence[str] = (),
    ) -> None:
        self.name, self.table, self.text = name, table, " ".join(text.split())
        self.params, self.returns = tuple(params), tuple(returns)
        for text in (_EITHER.sub(r"\1", self.text), _EITHER.sub(r"\2", self.text)):
            if len(_marks(text)) != len(self.params):
                raise ValueError(f"{name}: {len(_marks(text))} marks, {len(self.params)} params")
        self._prepared: dict[Codec, _Prepared] = {}

    def __repr__(self) -> str:
        return f"Sql({self.name!r})"

    def _for(self, conn: Connection) -> _Prepared:
        codec = codec_for(conn.dialect)
        found = self._prepared.get(codec)
        if found is None:
            found = self._prepared[codec] = _Prepared(self, codec)
        return found

    def run(self, conn: Connection, *values: Any) -> Any:
        """Execute with ``values`` (one per mark); returns the driver's cursor."""
        prepared = self._for(conn)
        return run(conn, prepared.text_for(values), prepared.params(values))

    def many(self, conn: Connection, rows: Sequence[Sequence[Any]]) -> int | None:
        """Execute once per row of values (``executemany``; a plain INSERT on PostgreSQL: one
        statement of many rows); the rows changed, if known."""
        if not rows:
            return 0
        prepared = self._for(conn)
        if prepared.lists:
            raise ValueError(f"{self.name}: a list mark cannot run for many rows")
        params = [prepared.params(row) for row in rows]
        if len(params) == 1:
            return int(run(conn, prepared.text, params[0]).rowcount)
        if prepared.values_group is not None:
            changed = 0
            for start in range(0, len(params), MANY_ROWS):
                chunk = params[start : start + MANY_ROWS]
                text = prepared.rows_text(len(chunk))
                flat = [value for row in chunk for value in row]
                changed += int(run(conn, str(text), flat).rowcount)
            return changed
        cursor = run(conn, prepared.text, params, many=True)
        return cursor.rowcount if conn.dialect.supports_sane_multi_rowcount else None

    def rows(self, conn: Connection, *values: Any) -> list[Sequence[Any]]:
        """Every row the statement returns, decoded."""
        prepared = self._for(conn)
        cursor = run(conn, prepared.text_for(values), prepared.params(values))
        decode = prepared.decoder(cursor)
        return [decode(row) for row in cursor.fetchall()]

    def first(self, conn: Connection, *values: Any) -> Sequence[Any] | None:
        """The first row returned, decoded (None: none)."""
        prepared = self._for(conn)
        cursor = run(conn, prepared.text_for(values), prepared.params(values))
        row = cursor.fetchone()
        return None if row is None else prepared.decoder(cursor)(row)

    def value(self, conn: Connection, *values: Any) -> Any:
        """The first column of the first row (None: no row)."""
        row = self.first(conn, *values)
        return None if row is None else row[0]


@dataclass(frozen=True)
class Bound:
    """A statement with its values, to run now or inside another's (``Journal.write``'s
    ``also``: on PostgreSQL a CTE of its statement, one round trip for both)."""

    sql: Sql
    values: tuple[Any, ...]

    def run(self, conn: Connection) -> Any:
        return self.sql.run(conn, *self.values)


def qualified(sql: Sql, param: str, table: sa.Table | None) -> str:
    """``param`` of ``sql`` as a statement on ``table`` names it (``other_table.column``),
    for ``sql`` run inside that statement."""
    if param == AS_IS or "." in param or sql.table is None or sql.table is table:
        return param
    return f"{sql.table.name}.{param}"


_raw_cursor: Any = None  # psycopg's RawCursor, imported at the first PostgreSQL statement


def _cursor(conn: Connection, dbapi_conn: Any) -> Any:
    global _raw_cursor
    if conn.dialect.name == "sqlite":
        return dbapi_conn.cursor()
    if _raw_cursor is None:
        from psycopg import RawCursor  # PostgreSQL's driver is an optional dependency

        _raw_cursor = RawCursor
    return _raw_cursor(dbapi_conn.driver_connection)


def run(conn: Connection, sql: str, params: Any = (), *, many: bool = False) -> Any:
    """Run ``sql`` on the connection's own driver cursor, inside its transaction.

    ``exec_driver_sql`` still builds an execution context per statement (about 20 µs,
    more than SQLite takes for a small write). Driver errors are raised as SQLAlchemy
    ``DBAPIError``s, a lost connection invalidated, exactly as SQLAlchemy would, so
    ``translate_errors`` treats both paths alike. Parameters never go into the error.
    Inside ``storage.pipelined`` the statement is queued, and ``run`` returns once its
    result is back (``sent``).
    """
    dbapi_conn = conn.connection
    cursor = _cursor(conn, dbapi_conn)
    try:
        if many:
            cursor.executemany(sql, params)
        else:
            cursor.execute(sql, params)
        wait_sent()
    except conn.dialect.loaded_dbapi.Error as exc:
        raise driver_error(conn, sql, params, exc, cursor) from exc
    return cursor


# What a statement run by this writer waits for once sent (``wait``): None, its result is
# in; else ``wait()`` returns once it is (``storage.pipelined``, which queues statements).
sent = WriterLocal(wait=None)


def wait_sent() -> None:
    """Return once the statement just sent on this thread has its result (``sent``)."""
    wait = sent.wait
    if wait is not None:
        wait()


def driver_error(
    conn: Connection, sql: str, params: Any, exc: Any, cursor: Any = None
) -> BaseException:
    """The driver's ``exc`` as SQLAlchemy raises it: a ``DBAPIError`` of its family, the
    connection invalidated when it is lost, the parameters left out of the message."""
    dbapi_conn = conn.connection
    lost = conn.dialect.is_disconnect(exc, dbapi_conn, cursor)
    if lost:
        conn.invalidate(exc)
    error: BaseException = sa.exc.DBAPIError.instance(
        sql,
        params,
        exc,
        conn.dialect.loaded_dbapi.Error,
        hide_parameters=True,
        connection_invalidated=lost,
        dialect=conn.dialect,
    )
    return error
