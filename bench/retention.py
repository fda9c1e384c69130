"""The retention sweep's speed: finished operations pruned per second, against bare deletes.

    python bench/retention.py [--operations 20000] [--entries 10] [--batch 100]
        [--rounds 3] [--postgres ADMIN_URL] [--smoke]

Per backend and round, a fresh database (SQLite WAL file; PostgreSQL: a throw-away
database cloned from a migrated template) is seeded with ``--operations`` operations
that ended 40 days ago, each as the service leaves one: ``--entries`` history entries,
its request and result payloads, one finished completion step, one webhook event and
one verdict. Then, timed:

* **ours**: ``storage.pruner.Pruner.run``, what the sweep and ``reconciler db prune`` run:
  the lease, then batches of ``--batch`` operations, each picking finished rows through
  the index, deleting every row they own, leaving tombstones and a chained, hashed
  retention record, one transaction each.
* **bare** (the ceiling): the same rows deleted by operation id in batches of the same
  size and order, the ids known beforehand: no pick, no lease, no tombstones, no record.
  It does strictly less than ours, so ours ÷ bare ≤ 1 measures what the guarantees cost.

Printed per round: operations/s and rows/s of each, and the ratio; then the medians.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# Run as a script, bench/ comes first on sys.path; its modules are imported as bench.*:
# leave only the repository's roots.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
for _path in (str(ROOT / "service"), str(ROOT)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from bench.support import SMOKE_HELP, fresh_database, smoke  # noqa: E402

BACKLOG_CALLER = "backlog"  # whose the seeded operations are (bench/lag.py counts the rest)
CHILDREN = ("history", "operation_payloads", "completion_steps", "webhook_verdicts")


def seed(db_url: str, count: int, entries: int, done_at: datetime) -> list[tuple[str, str]]:
    """``count`` finished operations with their rows, in chunks; their ids and job ids,
    oldest first."""
    import sqlalchemy as sa

    from reconciler.core import ids
    from reconciler.storage.database import Database
    from reconciler.storage.tables import EVENTS, HISTORY, OPS, PAYLOAD_TABLE, STEPS, VERDICTS

    result = {"rows": [{"n": i, "value": f"item-{i}"} for i in range(8)], "total": 8}
    db = Database(db_url)
    made: list[tuple[str, str]] = []
    try:
        for start in range(0, count, 2000):
            rows: dict[str, list[dict[str, Any]]] = {
                t: [] for t in ("ops", "history", "payloads", "steps", "events", "verdicts")
            }
            for index in range(start, min(count, start + 2000)):
                at = done_at + timedelta(milliseconds=index)
                op_id = ids.operation_id(at)
                job = f"backlog_{index:08d}"
                made.append((op_id, job))
                op: dict[str, Any] = {c.name: None for c in OPS.c}
                op.update(
                    id=op_id,
                    provider="sim",
                    caller=BACKLOG_CALLER,
                    request_fingerprint="f" * 64,
                    idempotency_key=f"backlog-{index}",
                    idempotency_token=ids.idempotency_token(),
                    trace_id=ids.trace_id(),
                    state="succeeded",
                    remote_job_id=job,
                    remote_state="succeeded",
                    created_at=at,
                    updated_at=at,
                    accepted_at=at,
                    create_deadline_at=at,
                    deadline_at=at,
                    done_at=at,
                    create_attempts=1,
                    max_status_requests=12,
                    status_requests_used=entries,
                    max_transport_failures=3,
                    transport_failures_used=0,
                    rate_limited_count=0,
                    poll_attempt=0,
                    result_attempts=1,
                    completion_round=1,
                    completion_pending=False,
                    escalation_open=False,
                    create_lookups=0,
                    step_failures=0,
                    version=entries + 2,
                    history_seq=entries,
                    history_head="h" * 64,
                )
                rows["ops"].append(op)
                for seq in range(1, entries + 1):
                    rows["history"].append(
                        {
                            "operation_id": op_id,
                            "seq": seq,
                            "at": at,
                            "kind": "observation",
                            "actor": "worker",
                            "from_state": None,
                            "to_state": None,
                            "cause": "status_read",
                            "delay_source": "local_backoff",
                            "detail": {"http_status": 200, "remote_state": "running"},
                            "prev_hash": "p" * 64,
                            "hash": "h" * 64,
                        }
                    )
                rows["payloads"] += [
                    {"operation_id": op_id, "name": "request", "value": {"report": index}},
                    {"operation_id": op_id, "name": "result", "value": result},
                ]
                rows["steps"].append(
                    {
                        "operation_id": op_id,
                        "round": 1,
                        "step": "callback",
                        "status": "done",
                        "idempotency_key": f"{op_id}:1:callback",
                        "attempts": 1,
                        "started_at": at,
                        "finished_at": at,
                    }
                )
                rows["events"].append(
                    {
                        "provider": "sim",
                        "event_id": f"evt_{index:08d}",
                        "received_at": at,
                        "remote_job_id": job,
                        "operation_id": op_id,
                        "body_sha256": "0" * 64,
                        "body": '{"type": "job.succeeded"}',
                        "duplicates": 0,
                        "conflicts": 0,
                        "ignored": False,
                    }
                )
                rows["verdicts"].append(
                    {
                        "operation_id": op_id,
                        "provider": "sim",
                        "remote_job_id": job,
                        "verdict": "webhook_first",
                        "asked_at": at,
                        "seen_at": at,
                        "hinted_at": at,
                        "judged_at": at,
                    }
                )
            with db.write() as conn:
                conn.execute(sa.insert(OPS), rows["ops"])
                conn.execute(sa.insert(HISTORY), rows["history"])
                conn.execute(sa.insert(PAYLOAD_TABLE), rows["payloads"])
                conn.execute(sa.insert(STEPS), rows["steps"])
                conn.execute(sa.insert(EVENTS), rows["events"])
                conn.execute(sa.insert(VERDICTS), rows["verdicts"])
        if not db.sqlite:
            with db.engine.connect() as conn:
                conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("ANALYZE")
    finally:
        db.dispose()
    return made


def rows_per_operation(entries: int) -> int:
    # The row, its history, two payloads, a step, an event, a verdict.
    return 1 + entries + 2 + 1 + 1 + 1


def time_ours(db_url: str, batch: int) -> tuple[float, int]:
    from reconciler.core.retention import RetentionPolicy, cutoffs
    from reconciler.storage.database import Database
    from reconciler.storage.pruner import Pruner

    db = Database(db_url)
    try:
        now = datetime.now(UTC)
        pruner = Pruner(db, lambda: datetime.now(UTC), "bench", b"k" * 32, batch_size=batch)
        started = time.perf_counter()
        removed = pruner.run(cutoffs(RetentionPolicy.of_days(30, 0, 0), now))
        return time.perf_counter() - started, removed.operations
    finally:
        db.dispose()


def time_bare(db_url: str, made: list[tuple[str, str]], batch: int) -> float:
    """The ceiling: delete each batch's rows by id (events by their job's index), nothing
    else."""
    from reconciler.storage.database import Database
    from reconciler.storage.fastsql import run

    db = Database(db_url)
    mark = "?" if db.sqlite else "%s"
    try:
        started = time.perf_counter()
        for start in range(0, len(made), batch):
            chunk = [op_id for op_id, _ in made[start : start + batch]]
            jobs = [job for _, job in made[start : start + batch]]
            marks = ", ".join([mark] * len(chunk))
            with db.write() as conn:
                for table in CHILDREN:
                    run(conn, f"DELETE FROM {table} WHERE operation_id IN ({marks})", chunk)
                run(
                    conn,
                    f"DELETE FROM webhook_events WHERE provider = 'sim' "
                    f"AND remote_job_id IN ({marks})",
                    jobs,
                )
                run(conn, f"DELETE FROM operations WHERE id IN ({marks})", chunk)
        return time.perf_counter() - started
    finally:
        db.dispose()


def run_round(backend: str, args: argparse.Namespace, work: Path) -> tuple[float, float]:
    done_at = datetime.now(UTC) - timedelta(days=40)
    with fresh_database(backend, work, args.postgres, "retention.db") as url:
        seed(url, args.operations, args.entries, done_at)
        ours, pruned = time_ours(url, args.batch)
        assert pruned == args.operations, (pruned, args.operations)
    with fresh_database(backend, work, args.postgres, "retention.db") as url:
        made = seed(url, args.operations, args.entries, done_at)
        bare = time_bare(url, made, args.batch)
    return args.operations / ours, args.operations / bare


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--operations", type=int, default=20_000)
    parser.add_argument("--entries", type=int, default=10, help="history entries per operation")
    parser.add_argument("--batch", type=int, default=100, help="operations per transaction")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--postgres", metavar="ADMIN_URL", default=None)
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args()
    smoke(args, operations=300, rounds=1, batch=50, postgres=None)
    rows = rows_per_operation(args.entries)
    print(
        f"{args.operations} finished operations of {rows} rows each (history of "
        f"{args.entries}), batches of {args.batch}; bare = the same deletes by id only"
    )
    for backend in ["sqlite"] + (["postgresql"] if args.postgres else []):
        ours_rates, bare_rates = [], []
        for number in range(1, args.rounds + 1):
            work = Path(tempfile.mkdtemp(prefix="bench-retention-"))
            try:
                ours, bare = run_round(backend, args, work)
            finally:
                shutil.rmtree(work, ignore_errors=True)
            ours_rates.append(ours)
            bare_rates.append(bare)
            print(
                f"  round {number} {backend:<10} ours {ours:8.0f} ops/s ({ours * rows:9.0f} "
                f"rows/s)   bare {bare:8.0f} ops/s ({bare * rows:9.0f} rows/s)   "
                f"ours/bare {ours / bare:.2f}"
            )
        ours_m, bare_m = statistics.median(ours_rates), statistics.median(bare_rates)
        print(
            f"  {backend}: medians over rounds: ours {ours_m:.0f} ops/s "
            f"({ours_m * rows:.0f} rows/s), bare {bare_m:.0f} ops/s, ours/bare "
            f"{ours_m / bare_m:.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
