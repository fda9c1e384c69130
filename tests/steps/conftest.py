"""Step tests run on anyio's asyncio backend, each on a real database (``db_url``)."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
