"""Retries of finished operations' keys on two replicas while a prune removes them.

    python bench/prune_race.py [--retries 10000] [--operations 4000] [--threads 4] [--smoke]

On PostgreSQL (``RECONCILER_TEST_POSTGRES_URL``, a database of its own; SQLite with
``--sqlite``): ``--operations`` finished operations with keys, a pruner taking batches
of 5 oldest first, and ``--threads`` retry threads split over two ``Database`` objects
(two replicas' pools) re-sending the keys the prune is about to reach, until
``--retries`` answers. Counts the answers: the operation back (200), ``410``, ``409``,
and new jobs (202), which must be none: the guarantee is ``410``, nothing started.
Asserts nothing about time.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import threading
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

if __package__ in (None, ""):
    _ROOT = Path(__file__).resolve().parents[1]
    sys.path[:0] = [str(_ROOT), str(_ROOT / "service")]

from bench.support import SMOKE_HELP, smoke
from tests.support.databases import PostgresFactory, postgres_admin_url
from tests.support.factories import new_operation
from tests.support.process import upgrade

from reconciler.commands.create import create_operation
from reconciler.core.errors import Conflict, Gone
from reconciler.core.limits import ProviderLimits
from reconciler.core.principal import Principal
from reconciler.core.retention import RetentionPolicy, cutoffs
from reconciler.core.states import State
from reconciler.core.vocabulary import Scope
from reconciler.storage.database import Database
from reconciler.storage.journal import Journal
from reconciler.storage.pruner import Pruner
from reconciler.wire import CreateOperation, validated

AGENT = Principal("agent-1", Scope.AGENT)
LONG_AGO = datetime(2025, 1, 1, tzinfo=UTC)
LIMITS = ProviderLimits(
    deadline_seconds=2400, max_status_requests=12, max_transport_failures=3,
    create_deadline_seconds=120,
)  # fmt: skip
AHEAD = 8  # retries aim at the next keys the prune will reach


def seed(db: Database, count: int) -> None:
    journal = Journal()
    for start in range(0, count, 500):
        with db.write() as conn:
            for i in range(start, min(count, start + 500)):
                op = new_operation(
                    LONG_AGO,
                    state=State.SUCCEEDED.value,
                    done_at=LONG_AGO + timedelta(microseconds=i),
                    remote_job_id=f"job-{i}",
                    next_poll_at=None,
                    idempotency_key=f"key-{i}",
                    requested_deadline_seconds=2400,
                    requested_max_status_requests=12,
                )
                journal.insert(conn, op, actor="bench", cause="bench:seed", now=LONG_AGO)


def race(url: str, args: argparse.Namespace) -> Counter[str]:
    seed(Database(url), args.operations)
    replicas = [Database(url), Database(url)]
    pruning = Database(url)
    frontier = [0]
    answers: Counter[str] = Counter()
    lock = threading.Lock()
    done = threading.Event()

    def prune() -> None:
        pruner = Pruner(pruning, lambda: datetime.now(UTC), "bench", None, batch_size=5)
        limits = cutoffs(RetentionPolicy.of_days(30, 0, 0), datetime.now(UTC))
        [step] = pruner.steps(limits, [])
        while not done.is_set() and (batch := pruner.batch(step)).removed:
            frontier[0] += batch.operations

    def retry(index: int) -> None:
        rng = random.Random(index)
        db = replicas[index % 2]
        while not done.is_set():
            key = f"key-{min(args.operations - 1, frontier[0] + rng.randrange(AHEAD))}"
            req = validated(
                CreateOperation,
                {"provider": "sim", "request": {"report": "q3"}, "idempotency_key": key},
            )
            try:
                with db.write() as conn:
                    _, created = create_operation(
                        conn, Journal(), AGENT, req, LIMITS, datetime.now(UTC)
                    )
                outcome = "202 new job" if created else "200 the operation back"
            except Gone:
                outcome = "410"
            except Conflict:
                outcome = "409"
            with lock:
                answers[outcome] += 1
                if sum(answers.values()) >= args.retries:
                    done.set()

    pruner = threading.Thread(target=prune)
    threads = [threading.Thread(target=retry, args=(i,)) for i in range(args.threads)]
    pruner.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done.set()
    pruner.join()
    for db in (*replicas, pruning):
        db.dispose()
    answers["pruned"] = frontier[0]
    return answers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--retries", type=int, default=10_000)
    parser.add_argument("--operations", type=int, default=4_000)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--sqlite", action="store_true")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args()
    smoke(args, retries=200, operations=100, threads=2)
    admin = postgres_admin_url()
    with tempfile.TemporaryDirectory() as tmp:
        if args.sqlite or admin is None:
            url = f"sqlite:///{Path(tmp) / 'race.db'}"
            upgrade(url)
            print(f"sqlite: {dict(race(url, args))}")
        else:
            factory = PostgresFactory(admin)
            url = factory.empty()
            try:
                upgrade(url)
                print(f"postgres: {dict(race(url, args))}")
            finally:
                factory.drop(url)
                factory.close()
    print("prune race done")


if __name__ == "__main__":
    main()
