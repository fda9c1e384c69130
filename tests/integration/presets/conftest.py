"""The preset contract tests run on a SQLite file: they prove API shapes, not the database."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.databases import sqlite_url


@pytest.fixture
def sqlite_db(tmp_path: Path) -> Iterator[str]:
    with sqlite_url(tmp_path) as url:
        yield url


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
