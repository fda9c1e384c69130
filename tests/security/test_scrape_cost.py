"""A ``/metrics`` scrape reads what is in flight, not the stored history.

Each scrape counted the whole operations table by state, on every replica: from 0 to a
million stored rows, 1.8 to 211 ms a scrape on PostgreSQL, 1.5 to 144 ms on SQLite.
Now a scrape counts the states in flight (an index range as long as what is in flight);
the ended ones are recounted apart from scrapes, at most every ten minutes, the first
scrape counting them itself. ``bench/scrape_cost.py`` measures a scrape at both sizes.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from reconciler.config import Settings
from reconciler.core.states import END_STATES
from reconciler.runtime import Runtime
from reconciler.storage.journal import Journal
from tests.support.factories import insert_operation, seed_finished
from tests.support.statements import recording

pytestmark = pytest.mark.both_backends

LONG_AGO = datetime(2025, 1, 1, tzinfo=UTC)
ENDED = {state.value for state in END_STATES}


@pytest.fixture
def runtime(db_url: str) -> Iterator[Runtime]:
    rt = Runtime.build(Settings(database_url=db_url), rng=random.Random(7), environ={})
    try:
        yield rt
    finally:
        rt.db.dispose()


def _stored(rt: Runtime) -> dict[str, float]:
    text = rt.metrics.render().decode()
    found = re.findall(r'reconciler_stored_operations\{state="(\w+)"\} ([0-9.]+)', text)
    return {state: float(value) for state, value in found if float(value)}


def test_a_scrape_counts_what_is_in_flight_and_not_the_ended_rows(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = Journal()
    seed_finished(runtime.db, journal, 30, LONG_AGO)
    insert_operation(runtime.db, journal, LONG_AGO)
    assert _stored(runtime) == {"succeeded": 30.0, "create_pending": 1.0}

    seed_finished(runtime.db, journal, 30, LONG_AGO)
    insert_operation(runtime.db, journal, LONG_AGO)
    with recording(monkeypatch) as ran:
        counts = _stored(runtime)
    # In flight as of now; ended as first counted (recounted apart, later).
    assert counts == {"succeeded": 30.0, "create_pending": 2.0}
    reads = [(sql, params) for sql, params in ran if "FROM operations" in sql]
    assert reads, "the scrape counted nothing in flight"
    for sql, params in reads:
        assert "WHERE state" in sql, sql  # IN (...) on SQLite, = ANY(...) on PostgreSQL
        values = {str(v) for p in params for v in (p if isinstance(p, list) else [p])}
        assert not ENDED & values, f"a scrape read ended rows: {params}"
