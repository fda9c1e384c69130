"""Webhook endpoint throughput and latency against a bare Starlette route, same server settings.

    python bench/webhooks.py [--seconds 8] [--connections 16] [--rounds 2]

Both servers are uvicorn (uvloop + httptools, one process, no access log) on 127.0.0.1,
started one after the other and driven by ``wrk`` with pre-signed Standard Webhooks
deliveries (each with a new event id, for 1,000 operations that are being observed, so
every delivery is a verified, committed hint). Prints requests/s, p50/p99 and the ratio
reconciler/bare for each round. Needs ``wrk`` (Debian: ``apt-get install wrk``).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path[:0] = [
    str(Path(__file__).resolve().parents[1]),
    str(Path(__file__).resolve().parents[1] / "service"),
]

from bench.support import free_port, have_wrk, run_wrk, start, stop, wait_ready  # noqa: E402

SECRET = "whsec_" + base64.b64encode(b"bench-webhook-secret-0123456789a").decode()
OPERATIONS = 1000


def serve(mode: str, db_url: str, port: int) -> None:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    if mode == "bare":

        async def bare(request: Request) -> Response:
            return Response(status_code=204)

        app = Starlette(
            routes=[
                Route("/webhooks/sim", bare, methods=["POST"]),
                Route("/healthz", bare, methods=["GET"]),
            ]
        )
    else:
        from tests.support.stack import sim_provider_table

        from reconciler.app import create_app
        from reconciler.config import Settings
        from reconciler.runtime import Runtime

        empty = Path(tempfile.mkdtemp(prefix="bench-providers-"))
        settings = Settings(
            database_url=db_url,
            providers_dir=str(empty),
            providers={"sim": sim_provider_table("http://127.0.0.1:9")},
        )
        runtime = Runtime.build(settings, environ={"SIM_TOKEN": "x", "SIM_WEBHOOK_SECRETS": SECRET})
        app = create_app(runtime, background=False)
    from reconciler.api.server import tune_process

    tune_process()  # the service's own process settings, for both servers alike

    def run():
        return uvicorn.run(
            app,
            host="127.0.0.1",
            port=port,
            loop="uvloop",
            http="httptools",
            log_level="warning",
            access_log=False,
        )

    profile = os.environ.get("BENCH_PROFILE")
    if profile:
        import cProfile

        cProfile.runctx("run()", globals(), {"run": run}, profile)
    else:
        run()


def seed(db_url: str) -> None:
    from reconciler.core import ids
    from reconciler.core.canonical import request_fingerprint
    from reconciler.core.records import new_operation
    from reconciler.storage import migrate
    from reconciler.storage.database import Database
    from reconciler.storage.journal import Journal

    db = Database(db_url)
    migrate.upgrade(db)
    journal = Journal()
    now = datetime.now(UTC)
    with db.write() as conn:
        for i in range(OPERATIONS):
            op = new_operation(
                id=ids.operation_id(now),
                provider="sim",
                caller="bench",
                request={"i": i},
                request_fingerprint=request_fingerprint("sim", {"i": i}),
                idempotency_token=ids.idempotency_token(),
                trace_id=ids.trace_id(),
                state="observing",
                remote_job_id=f"job_{i}",
                created_at=now,
                updated_at=now,
                create_deadline_at=now,
                deadline_at=now + timedelta(hours=1),
                max_status_requests=12,
                max_transport_failures=3,
                next_poll_at=now + timedelta(hours=1),
            )
            journal.insert(conn, op, actor="bench", cause="seed", now=now)
    db.dispose()


def write_requests(path: Path, count: int) -> None:
    """Pre-signed deliveries, one per line (id, timestamp, signature, body; tab-separated),
    signed with the standardwebhooks package."""
    from standardwebhooks.webhooks import Webhook

    hook = Webhook(SECRET)
    when = datetime.now(UTC)
    ts = str(int(when.timestamp()))
    with path.open("w") as out:
        for i in range(count):
            event_id = f"evt_bench_{i:08d}"
            body = json.dumps(
                {
                    "type": "job.running",
                    "id": event_id,
                    "data": {"job_id": f"job_{i % OPERATIONS}", "state": "running"},
                }
            )
            out.write(f"{event_id}\t{ts}\t{hook.sign(event_id, when, body)}\t{body}\n")


SCRIPT = """
local reqs = {}
for line in io.lines("%s") do
  local id, ts, sig, body = line:match("^([^\t]*)\t([^\t]*)\t([^\t]*)\t(.*)$")
  reqs[#reqs + 1] = {id, ts, sig, body}
end
local n = #reqs
local i = 0
ok = 0
bad = 0
last_bad = 0
local threads = {}
setup = function(thread) table.insert(threads, thread) end
request = function()
  i = i + 1
  local r = reqs[((i - 1) %% n) + 1]
  return wrk.format("POST", "/webhooks/sim", {
    ["webhook-id"] = r[1], ["webhook-timestamp"] = r[2], ["webhook-signature"] = r[3],
    ["content-type"] = "application/json"}, r[4])
end
response = function(status, headers, body)
  if status == 200 then ok = ok + 1 else bad = bad + 1; last_bad = status end
end
done = function(summary, latency, requests)
  for _, thread in ipairs(threads) do
    io.write(string.format("answers ok %%d other %%d (last other status %%d)\\n",
      thread:get("ok"), thread:get("bad"), thread:get("last_bad")))
  end
end
"""


def count_events(db_url: str) -> int:
    import sqlalchemy as sa

    engine = sa.create_engine(db_url)
    with engine.connect() as conn:
        value = conn.execute(sa.text("SELECT count(*) FROM webhook_events")).scalar_one()
    engine.dispose()
    return int(value)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    srv = sub.add_parser("serve")
    srv.add_argument("--mode", choices=["bare", "reconciler"], required=True)
    srv.add_argument("--db", required=True)
    srv.add_argument("--port", type=int, required=True)
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if args.command == "serve":
        serve(args.mode, args.db, args.port)
        return 0
    if not have_wrk():
        print("wrk is needed (Debian: apt-get install wrk)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="bench-webhooks-"))
    requests_lua = work / "requests.tsv"
    script = work / "script.lua"
    expected_max = 20_000 * args.seconds
    write_requests(requests_lua, expected_max)
    script.write_text(SCRIPT % requests_lua)
    results: dict[str, list] = {"bare": [], "reconciler": []}
    print(
        f"wrk: 1 thread, {args.connections} connections, {args.seconds} s per run; "
        f"{OPERATIONS} operations observed; SQLite (WAL)"
    )
    for round_no in range(1, args.rounds + 1):
        for mode in ("bare", "reconciler"):
            db_url = f"sqlite:///{work / f'r{round_no}.db'}"
            if mode == "reconciler":
                seed(db_url)
            port = free_port()
            proc = start(
                ["bench/webhooks.py", "serve", "--mode", mode, "--db", db_url, "--port", str(port)]
            )
            try:
                wait_ready(f"http://127.0.0.1:{port}/healthz")
                time.sleep(0.5)
                result = run_wrk(
                    f"http://127.0.0.1:{port}",
                    script,
                    seconds=args.seconds,
                    connections=args.connections,
                )
            finally:
                stop(proc)
            results[mode].append(result)
            stored = f", stored {count_events(db_url)}" if mode == "reconciler" else ""
            print(
                f"round {round_no} {mode:<10} {result.requests_per_second:9.0f} req/s  "
                f"p50 {result.p50_ms:6.2f} ms  p99 {result.p99_ms:6.2f} ms  "
                f"{result.answers} errors {result.errors}{stored}"
            )
    ratios = [
        r.requests_per_second / b.requests_per_second
        for r, b in zip(results["reconciler"], results["bare"], strict=True)
    ]
    p99 = max(r.p99_ms for r in results["reconciler"])
    print(
        f"ratio reconciler/bare: median {statistics.median(ratios):.2f} "
        f"(rounds: {', '.join(f'{x:.2f}' for x in ratios)}); target >= 0.30"
    )
    print(f"reconciler p99: worst {p99:.2f} ms; target < 25 ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
