"""The processes of ``bench/throughput.py`` other than the driver: the service and the receiver.

    python bench/throughput_parts.py serve --root TREE --config PATH [--profile FILE]
        [--stages FILE]
    python bench/throughput_parts.py receiver --port N --secret whsec_...
    python bench/throughput_parts.py otlp --port N

``serve`` runs the service of the checkout ``TREE`` (its ``service/`` first on the path,
so a second checkout at another commit can be measured against this one in the same
run) exactly as ``reconciler serve --config PATH`` does. A checkout whose database
does not count its write transactions yet gets the count from outside (a wrapper
around ``Database.write``, one increment per transaction) as
``reconciler_write_transactions_total`` on ``/metrics``, so both are counted alike.
``--stages FILE`` records where each operation waits (``bench/stages.py``).

``receiver`` is the agent's callback receiver: it verifies every delivery with the
agent's own callback secret (``reconciler.client.verify_callback``), answers 204, and
reports on ``GET /stats`` how many distinct operations arrived and when the last did, and on
``GET /arrivals`` when each operation's first callback arrived (by the operation's id).

``otlp`` is an OTLP/HTTP trace receiver for a traced run: it decodes every export
(``opentelemetry-proto``), counts the spans and reports them on ``GET /stats``.

``completion_hook`` is the one (empty) completion hook of the happy path.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]


async def completion_hook(operation: dict[str, Any], idempotency_key: str) -> None:
    """The happy path's one hook: it does nothing."""


def _count_writes_from_outside() -> None:
    """Count write transactions in a checkout whose ``Database`` does not (yet) count them."""
    import itertools
    from collections.abc import Iterator
    from contextlib import contextmanager

    from prometheus_client.core import CounterMetricFamily

    from reconciler.metrics import Metrics
    from reconciler.storage.database import Database

    if hasattr(Metrics, "watch_writes"):
        return  # counted by the service itself
    counter = itertools.count()
    taken = [0]
    write = Database.write

    @contextmanager
    def counted(self: Any) -> Iterator[Any]:
        taken[0] = next(counter) + 1
        with write(self) as conn:
            yield conn

    Database.write = counted  # type: ignore[method-assign]

    class _Writes:
        def collect(self) -> Any:
            family = CounterMetricFamily(
                "reconciler_write_transactions", "Write transactions begun (counted outside)."
            )
            family.add_metric([], taken[0])
            yield family

    init = Metrics.__init__

    def with_writes(self: Any) -> None:
        init(self)
        self.registry.register(_Writes())

    Metrics.__init__ = with_writes  # type: ignore[method-assign]


def serve(root: Path, config: Path, profile: Path | None, stages: Path | None = None) -> int:
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() not in (HERE, HERE / "bench")]
    sys.path.insert(0, str(root / "service"))
    sys.path.append(str(HERE))  # for this module's hook, as bench.throughput_parts
    _count_writes_from_outside()
    if stages is not None:
        from bench.stages import install

        install(stages)
    from reconciler.app import serve as run
    from reconciler.config import load_settings

    settings = load_settings(str(config))
    if profile is None:
        return run(settings)
    import pyinstrument  # only with --profile

    profiler = pyinstrument.Profiler(interval=0.0005, async_mode="disabled")
    profiler.start()
    try:
        return run(settings)
    finally:
        profiler.stop()
        profile.write_text(profiler.output_text(unicode=False, show_all=False), "utf-8")


class Arrivals:
    """Verified deliveries by webhook id, with the time the last new one arrived."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ids: set[str] = set()
        self.deliveries = 0
        self.rejected = 0
        self.first_at: float | None = None
        self.last_at: float | None = None
        self.arrived: dict[str, float] = {}  # operation id -> its first callback's arrival

    def add(self, webhook_id: str, operation_id: str = "") -> None:
        now = time.time()
        with self.lock:
            self.deliveries += 1
            if webhook_id not in self.ids:
                self.ids.add(webhook_id)
                self.first_at = self.first_at or now
                self.last_at = now
                self.arrived.setdefault(operation_id or webhook_id, now)

    def stats(self) -> dict[str, Any]:
        with self.lock:
            return {
                "distinct": len(self.ids),
                "deliveries": self.deliveries,
                "rejected": self.rejected,
                "first_at": self.first_at,
                "last_at": self.last_at,
            }

    def reset(self) -> None:
        with self.lock:
            self.ids.clear()
            self.arrived.clear()
            self.deliveries = self.rejected = 0
            self.first_at = self.last_at = None


def receiver(port: int, secret: str, server: str) -> int:
    sys.path.insert(0, str(HERE / "service"))
    sys.path.insert(0, str(HERE))
    from bench.fast_http import Answer, Request, run, run_on_starlette, start_server

    from reconciler.client import verify_callback
    from reconciler.core.errors import ReconcilerError

    arrivals = Arrivals()

    def handle(request: Request) -> Answer:
        if request.method == "POST" and request.path == "/cb":
            try:
                event = verify_callback(request.body, request.headers, secret)
            except ReconcilerError:
                with arrivals.lock:
                    arrivals.rejected += 1
                return Answer(401)
            arrivals.add(event.webhook_id, event.operation.id)
            return Answer(204)
        if request.method == "GET" and request.path == "/stats":
            return Answer(200, json.dumps(arrivals.stats()).encode())
        if request.method == "GET" and request.path == "/arrivals":
            with arrivals.lock:
                return Answer(200, json.dumps(arrivals.arrived).encode())
        if request.method == "POST" and request.path == "/reset":
            arrivals.reset()
            return Answer(204)
        return Answer(404)

    if server == "starlette":
        run_on_starlette(handle, port)
        return 0

    async def main() -> None:
        async with await start_server(handle, "127.0.0.1", port) as listening:
            await listening.serve_forever()

    run(main)
    return 0


def otlp(port: int) -> int:
    sys.path.insert(0, str(HERE))
    from bench.fast_http import Answer, Request, run, start_server
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
        ExportTraceServiceResponse,
    )

    counted = {"spans": 0, "exports": 0}
    done = ExportTraceServiceResponse().SerializeToString()

    def handle(request: Request) -> Answer:
        if request.method == "POST" and request.path == "/v1/traces":
            message = ExportTraceServiceRequest()
            message.ParseFromString(request.body)
            counted["exports"] += 1
            counted["spans"] += sum(
                len(scope.spans) for rs in message.resource_spans for scope in rs.scope_spans
            )
            return Answer(200, done, "application/x-protobuf")
        if request.method == "GET" and request.path == "/stats":
            return Answer(200, json.dumps(counted).encode())
        return Answer(404)

    async def main() -> None:
        async with await start_server(handle, "127.0.0.1", port) as listening:
            await listening.serve_forever()

    run(main)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    srv = sub.add_parser("serve")
    srv.add_argument("--root", type=Path, required=True)
    srv.add_argument("--config", type=Path, required=True)
    srv.add_argument("--profile", type=Path, default=None)
    srv.add_argument("--stages", type=Path, default=None, help="bench/stages.py's records")
    rcv = sub.add_parser("receiver")
    rcv.add_argument("--port", type=int, required=True)
    rcv.add_argument("--secret", required=True)
    rcv.add_argument("--server", choices=("protocol", "starlette"), default="protocol")
    sink = sub.add_parser("otlp")
    sink.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    if args.command == "serve":
        return serve(args.root, args.config, args.profile, args.stages)
    if args.command == "otlp":
        return otlp(args.port)
    return receiver(args.port, args.secret, args.server)


if __name__ == "__main__":
    raise SystemExit(main())
