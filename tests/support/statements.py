"""Every statement that reaches the database through ``storage.fastsql``, as it is run."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from reconciler.storage import fastsql

Ran = tuple[str, Any]


@contextmanager
def recording(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Ran]]:
    """Every statement run through ``storage.fastsql`` meanwhile (text and parameters)."""
    ran: list[Ran] = []
    lock = threading.Lock()
    real = fastsql.run

    def record(conn: Any, sql: str, params: Any = (), *, many: bool = False) -> Any:
        with lock:
            ran.append((sql, params[0] if many else params))
        return real(conn, sql, params, many=many)

    with monkeypatch.context() as patched:
        patched.setattr(fastsql, "run", record)
        yield ran
