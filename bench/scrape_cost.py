"""What one ``/metrics`` scrape costs at 0 and at ``--rows`` stored finished operations.

    python bench/scrape_cost.py [--rows 1000000] [--scrapes 20] [--smoke]

On SQLite (a file here) and, with ``RECONCILER_TEST_POSTGRES_URL`` set, on PostgreSQL (a
database of its own): the rows are copies of one finished operation made by the
database itself (a recursive count), then ANALYZE; a runtime renders ``/metrics`` once
(the first scrape counts the ended states itself), then ``--scrapes`` times, and the
median of those is printed beside the whole-table count every scrape used to run.
Asserts nothing about time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

if __package__ in (None, ""):
    _ROOT = Path(__file__).resolve().parents[1]
    sys.path[:0] = [str(_ROOT), str(_ROOT / "service")]

import sqlalchemy as sa
from bench.support import SMOKE_HELP, smoke
from tests.support.databases import PostgresFactory, postgres_admin_url
from tests.support.factories import insert_operation, seed_finished
from tests.support.process import upgrade

from reconciler.config import Settings
from reconciler.runtime import Runtime
from reconciler.storage import operations as store
from reconciler.storage.journal import Journal
from reconciler.storage.tables import OPS

LONG_AGO = datetime(2025, 1, 1, tzinfo=UTC)
UNIQUE_COLUMNS = ("id", "idempotency_token")


def _fill(url: str, rows: int) -> None:
    """``rows`` finished operations (copies of one, new ids) and one in flight."""
    rt = Runtime.build(Settings(database_url=url), environ={})
    try:
        [seed] = seed_finished(rt.db, Journal(), 1, LONG_AGO)
        insert_operation(rt.db, Journal(), LONG_AGO)
        columns = [c.name for c in OPS.c]
        picked = ", ".join(
            f"{c} || '-' || CAST(n AS TEXT)" if c in UNIQUE_COLUMNS else c for c in columns
        )
        with rt.db.write() as conn:
            conn.execute(
                sa.text(
                    "WITH RECURSIVE k(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM k "
                    f"WHERE n < :rows) INSERT INTO operations ({', '.join(columns)}) "
                    f"SELECT {picked} FROM operations, k WHERE operations.id = :seed"
                ),
                {"rows": rows - 1, "seed": seed},
            )
        with rt.db.write() as conn:
            conn.execute(sa.text("ANALYZE"))
    finally:
        rt.db.dispose()


def _median_ms(run: Callable[[], object], times: int) -> float:
    took = []
    for _ in range(times):
        began = time.perf_counter()
        run()
        took.append(time.perf_counter() - began)
    return statistics.median(took) * 1000


def measure(name: str, url: str, rows: int, scrapes: int) -> None:
    if rows:
        _fill(url, rows)
    rt = Runtime.build(Settings(database_url=url), environ={})
    try:
        rt.metrics.render()  # the first scrape counts the ended states itself

        def whole() -> None:
            with rt.db.read() as conn:
                store.count_by_state(conn)

        scrape = _median_ms(rt.metrics.render, scrapes)
        before = _median_ms(whole, max(3, scrapes // 4))
        print(
            f"{name}: {rows} stored rows: a scrape {scrape:.2f} ms (median of {scrapes}); "
            f"the whole-table count each scrape ran before {before:.1f} ms"
        )
    finally:
        rt.db.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--scrapes", type=int, default=20)
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args()
    smoke(args, rows=2_000, scrapes=3)
    admin = postgres_admin_url()
    with tempfile.TemporaryDirectory() as tmp:
        for rows in (0, args.rows):
            url = f"sqlite:///{Path(tmp) / f'scrape-{rows}.db'}"
            upgrade(url)
            measure("sqlite", url, rows, args.scrapes)
            if admin is not None:
                factory = PostgresFactory(admin)
                pg = factory.empty()
                try:
                    upgrade(pg)
                    measure("postgres", pg, rows, args.scrapes)
                finally:
                    factory.drop(pg)
                    factory.close()
    print("scrape cost done")


if __name__ == "__main__":
    main()
