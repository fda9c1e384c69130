"""Bytes one operation costs on disk, per table and per index, on SQLite and PostgreSQL.

    python bench/storage_bytes.py [--operations 500] [--reads 20] [--request-bytes 1000]
        [--postgres ADMIN_URL] [--smoke]

The real service and the simulated provider in this process (``tests.support.world``:
the service's routes, worker, webhook intake and completion handler, the sim's API and
its signed webhooks, on one manual clock), and a callback receiver on loopback that
verifies every delivery with the agent's own secret. Per backend (a SQLite WAL file;
with ``--postgres``, a throw-away database on that server) and per shape, a fresh
migrated database takes ``--operations`` operations, each with a ``--request-bytes``
request and a signed callback:

* ``callback``: the job has succeeded by the first status read; no webhook;
* ``hint``: the sim sends a signed ``job.succeeded`` webhook, which brings the one
  confirming read forward (the fallback read would come a minute later);
* ``reads``: no webhook, the job ends after ``--reads`` status reads (a history of
  that many observations).

When every operation is done and its callback delivered, the service stops and the
database is measured against itself before the first operation: on SQLite after a
checkpoint, per b-tree from the ``dbstat`` virtual table (the file's growth only, when
the sqlite3 module lacks it); on PostgreSQL after ``VACUUM ANALYZE``, per table
(``pg_total_relation_size`` less ``pg_indexes_size``: heap, TOAST and maps) and per
index (``pg_relation_size``). The floor is what the data itself is: the request, the
result document, the callback body and the webhook body, as bytes on the wire.

Prints bytes per operation per backend and shape: the total, the floor, their ratio,
and every table and index that grew. Asserts nothing about sizes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import secrets
import sqlite3
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    _ROOT = Path(__file__).resolve().parents[1]
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _ROOT / "bench"]
    sys.path[:0] = [str(_ROOT), str(_ROOT / "service")]

import sqlalchemy as sa
from bench.soak_infra import create_database, drop_database
from bench.support import SMOKE_HELP, smoke
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from tests.support.servers import serve_asgi
from tests.support.stack import CALLBACK_SECRET, agent_callback_secret
from tests.support.world import START, World, open_world

from reconciler.client import InvalidRequest, SignatureRejected, verify_callback
from reconciler.config import CallbackSettings
from reconciler.core.clock import ManualClock
from reconciler.demo.sim.lifecycle import result_document
from reconciler.storage import migrate
from reconciler.storage.database import Database
from reconciler.storage.tables import OPS

SHAPES = ("callback", "hint", "reads")
QUIET_SECONDS = 600.0  # after the last callback: pending webhook verdicts are judged


@dataclass
class Receiver:
    """The agent's callback endpoint: verifies each delivery, keeps its size."""

    clock: ManualClock
    secret: str = ""
    sizes: dict[str, int] = field(default_factory=dict)
    rejected: int = 0

    async def handle(self, request: Request) -> Response:
        body = await request.body()
        try:
            event = verify_callback(
                body, request.headers, self.secret, now=self.clock.now().timestamp()
            )
        except (SignatureRejected, InvalidRequest):  # counted: the run fails on any
            self.rejected += 1
            return Response(status_code=400)
        self.sizes[event.operation.id] = len(body)
        return Response(status_code=204)


@dataclass
class Measured:
    backend: str
    shape: str
    operations: int
    reads: float  # status reads per operation
    history: float  # history entries per operation
    floor: dict[str, float]  # bytes per operation of the data itself, by part
    total: float  # bytes per operation on disk
    compacted: float | None  # PostgreSQL: after VACUUM FULL (live rows only)
    objects: dict[tuple[str, str], float]  # (table|index, name) -> bytes per operation
    note: str = ""

    @property
    def floor_total(self) -> float:
        return sum(self.floor.values())

    @property
    def kept(self) -> float:
        """The floor less the callback body, which is sent and not stored (it carries the
        result, counted already)."""
        return self.floor_total - self.floor.get("callback", 0.0)

    @property
    def steady(self) -> float:
        """Bytes per operation under steady traffic: live rows on PostgreSQL, the file on
        SQLite (which reuses a freed cell in its page at once)."""
        return self.total if self.compacted is None else self.compacted


# --- sizes -------------------------------------------------------------------------------


def sqlite_sizes(url: str) -> tuple[int, dict[tuple[str, str], int], str]:
    """(file bytes, bytes by b-tree, a note) after a checkpoint that empties the WAL."""
    path = sa.make_url(url).database
    assert path is not None
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        size = conn.execute("PRAGMA page_size").fetchone()[0]
        kinds = dict(conn.execute("SELECT name, type FROM sqlite_master").fetchall())
        try:
            rows = conn.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name").fetchall()
        except sqlite3.OperationalError:
            return pages * size, {}, "no dbstat in this sqlite3: file growth only"
    finally:
        conn.close()
    objects = {(kinds.get(name, "table"), name): int(n) for name, n in rows}
    return pages * size, objects, ""


# A table is its heap and its TOAST (heap and index), main forks only; the free space and
# visibility maps (a few pages per table however many rows) are counted apart.
PG_OBJECTS = """
SELECT 'table', c.relname,
       pg_relation_size(c.oid) + coalesce(pg_relation_size(c.reltoastrelid), 0)
       + coalesce((SELECT sum(pg_relation_size(x.indexrelid)) FROM pg_index x
                   WHERE x.indrelid = c.reltoastrelid), 0)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND c.relkind = 'r'
UNION ALL
SELECT 'index', i.relname, pg_relation_size(i.oid)
FROM pg_class i JOIN pg_namespace n ON n.oid = i.relnamespace
WHERE n.nspname = 'public' AND i.relkind = 'i'
UNION ALL
SELECT 'maps', 'fsm and vm, all tables',
       sum(pg_total_relation_size(c.oid) - pg_indexes_size(c.oid) - pg_relation_size(c.oid)
           - coalesce(pg_relation_size(c.reltoastrelid), 0)
           - coalesce((SELECT sum(pg_relation_size(x.indexrelid)) FROM pg_index x
                       WHERE x.indrelid = c.reltoastrelid), 0))
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND c.relkind = 'r'
"""
MAPS = ("maps", "fsm and vm, all tables")


def postgres_sizes(url: str, full: bool = False) -> tuple[int, dict[tuple[str, str], int], str]:
    """(tables' and indexes' bytes, bytes by table and index) after ``VACUUM ANALYZE``
    (``full``: ``VACUUM FULL``, which rewrites each table and index with its live rows
    only); the sum is ``pg_total_relation_size`` over the tables less their maps."""
    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("VACUUM FULL ANALYZE" if full else "VACUUM ANALYZE")
            rows = conn.exec_driver_sql(PG_OBJECTS).all()
    finally:
        engine.dispose()
    objects = {(kind, name): int(n) for kind, name, n in rows}
    return sum(n for o, n in objects.items() if o != MAPS), objects, ""


def sizes(backend: str, url: str) -> tuple[int, dict[tuple[str, str], int], str]:
    return sqlite_sizes(url) if backend == "sqlite" else postgres_sizes(url)


# --- the run -----------------------------------------------------------------------------


def request_of(shape: str, index: int, args: argparse.Namespace) -> dict[str, Any]:
    """The create request: the sim's knobs and ``--request-bytes`` of the caller's data."""
    knobs: dict[str, Any] = {"scenario": "success", "webhook_on_running": False}
    if shape == "callback":
        knobs.update(duration=0.5, webhooks="never")
    elif shape == "hint":
        knobs.update(duration=5.0, webhooks="normal")
    else:
        knobs.update(duration=args.reads - 0.5, webhooks="never")
    base = len(json.dumps({**knobs, "i": index, "input": ""}))
    # Hex text: incompressible enough that neither backend shrinks it below its size.
    knobs["input"] = secrets.token_hex(max(0, args.request_bytes - base) // 2 + 1)[
        : max(0, args.request_bytes - base)
    ]
    knobs["i"] = index
    return knobs


def polling_of(shape: str, args: argparse.Namespace) -> dict[str, Any]:
    """A read a second (no jitter); with a hint, the fallback read a minute out."""
    delay = 60.0 if shape == "hint" else 1.0
    return {
        "base_delay_seconds": delay,
        "max_delay_seconds": delay,
        "jitter_floor": 1.0,
        "deadline_seconds": max(600.0, 10.0 * args.reads),
        "max_status_requests": 2 * args.reads + 10,
    }


def unfinished(world: World) -> int:
    with world.runtime.db.read() as conn:
        left = conn.execute(
            sa.select(sa.func.count()).where(
                sa.or_(OPS.c.done_at.is_(None), OPS.c.completion_pending.is_(True))
            )
        ).scalar_one()
    return int(left)


def counts(url: str) -> tuple[float, float, float, float]:
    """(operations, status reads and history entries per operation, webhook body bytes)."""
    db = Database(url)
    try:
        with db.read() as conn:
            ops = conn.exec_driver_sql("SELECT count(*) FROM operations").scalar_one()
            reads = conn.exec_driver_sql(
                "SELECT count(*) FROM history WHERE cause = 'status_read'"
            ).scalar_one()
            entries = conn.exec_driver_sql("SELECT count(*) FROM history").scalar_one()
            hooks = conn.exec_driver_sql(
                "SELECT coalesce(sum(body_size), 0) FROM webhook_events"
            ).scalar_one()
    finally:
        db.dispose()
    return float(ops), float(reads) / max(1, ops), float(entries) / max(1, ops), float(hooks)


async def drive(
    directory: Path, url: str, shape: str, args: argparse.Namespace, receiver: Receiver
) -> dict[str, float]:
    """Run the shape's operations to the end; the floor's parts in bytes (all operations)."""
    world = await open_world(
        directory,
        url,
        polling=polling_of(shape, args),
        callbacks=CallbackSettings(
            allow_hosts=("127.0.0.1",), concurrency=64, per_host_concurrency=32
        ),
        environ={"RECONCILER_CALLBACK_SECRET": CALLBACK_SECRET},
        clock=receiver.clock,
    )
    floor = {"request": 0.0, "result": 0.0}
    try:
        receiver.secret = agent_callback_secret(world.runtime)
        for i in range(args.operations):
            request = request_of(shape, i, args)
            floor["request"] += len(json.dumps(request, separators=(",", ":")))
            answer = await world.submit(request, callback_url=args.callback_url)
            assert answer.status_code == 202, answer.text
        # A second at a time: a moment's settling starts a bounded number of deliveries,
        # so some can be left due at a moment already past (``next_moment`` looks ahead).
        limit = int(10 * args.reads + 600)
        for _ in range(limit):
            if unfinished(world) == 0:
                break
            await world.advance(1.0)
        else:
            raise RuntimeError(f"{unfinished(world)} operations unfinished after {limit} s")
        await world.advance(QUIET_SECONDS)
        for job in world.sim.jobs.values():
            floor["result"] += len(result_document(job))
    finally:
        await world.close()
    return floor


def measure(backend: str, url: str, shape: str, args: argparse.Namespace) -> Measured:
    db = Database(url)
    try:
        migrate.upgrade(db)
    finally:
        db.dispose()
    total0, before, note = sizes(backend, url)
    receiver = Receiver(ManualClock(START))
    app = Starlette(routes=[Route("/cb", receiver.handle, methods=["POST"])])
    with ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        base = stack.enter_context(serve_asgi(app))
        args.callback_url = f"{base}/cb"
        floor = asyncio.run(drive(Path(tmp), url, shape, args, receiver))
    if receiver.rejected or len(receiver.sizes) != args.operations:
        raise RuntimeError(
            f"{backend}/{shape}: {len(receiver.sizes)} callbacks verified of "
            f"{args.operations}, {receiver.rejected} rejected"
        )
    floor["callback"] = float(sum(receiver.sizes.values()))
    total1, after, _ = sizes(backend, url)
    compacted = None
    if backend == "postgres":
        # The burst leaves dead row versions behind (every step updates the operation's
        # row): VACUUM frees them for reuse but keeps the pages. What live rows take is
        # what steady traffic, whose updates reuse that space, costs per operation.
        total2, after, _ = postgres_sizes(url, full=True)
        after.pop(MAPS, None)  # a table rewrite drops them until the next VACUUM
        before.pop(MAPS, None)
        compacted = (total2 - total0) / float(args.operations)
    ops, reads, entries, webhook_bytes = counts(url)
    if webhook_bytes:
        floor["webhook"] = webhook_bytes
    k = float(args.operations)
    grown = {
        name: (after.get(name, 0) - before.get(name, 0)) / k
        for name in after.keys() | before.keys()
        if after.get(name, 0) != before.get(name, 0)
    }
    return Measured(
        backend,
        shape,
        int(ops),
        reads,
        entries,
        {part: n / k for part, n in floor.items()},
        (total1 - total0) / k,
        compacted,
        grown,
        note,
    )


@contextmanager
def database(backend: str, directory: Path, admin: str | None) -> Iterator[str]:
    if backend == "sqlite":
        yield f"sqlite:///{directory / 'bytes.db'}"
        return
    assert admin is not None
    url = create_database(admin, prefix="bytes")
    try:
        yield url
    finally:
        drop_database(admin, url)


# --- report ------------------------------------------------------------------------------


def report(results: list[Measured], top: int) -> None:
    for backend in dict.fromkeys(r.backend for r in results):
        rows = [r for r in results if r.backend == backend]
        names = [
            f"{r.shape}" + (f" ({r.reads:.0f} reads)" if r.shape == "reads" else "") for r in rows
        ]
        width = max(14, *(len(n) + 2 for n in names))
        print(f"\n{backend}: bytes per operation ({rows[0].operations} operations per shape)")
        print(f"  {'':44}" + "".join(f"{n:>{width}}" for n in names))

        def line(label: str, values: list[str], width: int = width) -> None:
            print(f"  {label:44}" + "".join(f"{v:>{width}}" for v in values))

        line("on disk", [f"{r.total:,.0f}" for r in rows])
        if any(r.compacted is not None for r in rows):
            line("  live rows only (VACUUM FULL)", [f"{r.compacted or 0:,.0f}" for r in rows])
            print("  (tables and indexes below: live rows only)")
        line("floor: the data itself", [f"{r.floor_total:,.0f}" for r in rows])
        for part in dict.fromkeys(p for r in rows for p in r.floor):
            line(f"  {part}", [f"{r.floor.get(part, 0.0):,.0f}" for r in rows])
        line("ratio steady / floor", [f"{r.steady / max(1.0, r.floor_total):.1f}" for r in rows])
        line(
            "ratio steady / kept (floor - callback)",
            [f"{r.steady / max(1.0, r.kept):.1f}" for r in rows],
        )
        line("status reads, history entries", [f"{r.reads:.1f}, {r.history:.1f}" for r in rows])
        objects = {name for r in rows for name in r.objects}
        ranked = sorted(objects, key=lambda o: -max(r.objects.get(o, 0.0) for r in rows))
        for kind, name in ranked[:top]:
            line(f"{kind} {name}", [f"{r.objects.get((kind, name), 0.0):,.0f}" for r in rows])
        for r in rows:
            if r.note:
                print(f"  {r.shape}: {r.note}")
    ratios = ", ".join(
        f"{r.backend}/{r.shape} {r.steady / max(1.0, r.floor_total):.1f}" for r in results
    )
    print(f"\nratio stored/payload: {ratios}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--operations", type=int, default=500, help="per shape")
    parser.add_argument("--reads", type=int, default=20, help="status reads of the reads shape")
    parser.add_argument("--request-bytes", type=int, default=1000)
    parser.add_argument("--postgres", metavar="ADMIN_URL", help="also on PostgreSQL")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--top", type=int, default=14, help="tables and indexes listed")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args(argv)
    smoke(args, operations=4, reads=3)
    # The trust keeper's judgements of the webhook-less shapes are not this bench's news.
    logging.getLogger("reconciler").setLevel(logging.ERROR)
    backends = ["sqlite"] + (["postgres"] if args.postgres else [])
    results = []
    for backend in backends:
        for shape in args.shapes.split(","):
            with (
                tempfile.TemporaryDirectory() as tmp,
                database(backend, Path(tmp), args.postgres) as url,
            ):
                results.append(measure(backend, url, shape, args))
            print(f"{backend}/{shape}: {results[-1].total:,.0f} B per operation", flush=True)
    report(results, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
