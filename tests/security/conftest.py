"""Fixtures for the attack matrix: the whole system on loopback, quick to escalate."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.stack import QUICK_POLLING, Stack, running_stack


@pytest.fixture
def stack(tmp_path: Path, db_url: str) -> Iterator[Stack]:
    provider = {"polling": QUICK_POLLING, "status": {"not_found_grace_seconds": 0.3}}
    with running_stack(tmp_path, db_url, provider=provider) as s:
        yield s
