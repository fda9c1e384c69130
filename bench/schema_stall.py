"""``/healthz`` while agents send the costliest requests a provider's request_schema allows.

    python bench/schema_stall.py [--agents 20] [--seconds 10] [--only unique,pattern,batch]
                                 [--items 20000] [--smoke]

For each schema (and ``quiet``: no agent, for reference), the service runs as its own
process (SQLite, one provider whose request_schema is the schema), ``--agents`` threads
send its worst request over and over
for ``--seconds``, and one more thread reads ``/healthz`` every 20 ms. Prints the
``/healthz`` latencies (p50, p99, max) and the creates' answers. The schemas:

* ``unique``: ``uniqueItems`` over ``--items`` distinct objects and a copy of the first
  (the red team's 20,000: 269 KB, which froze the service for minutes);
* ``pattern``: ``pattern = "^(a+)+$"`` against ``"a" * 28 + "!"`` (72 bytes, 11 s each),
  and against a string of 1 MB;
* ``batch``: the anthropic_batches preset's schema and a batch of 1 MiB (8,000 items,
  the last without its params), the costliest request a preset allows.

Asserts nothing about time: the target (p99 at most 50 ms) is read off the figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
import tomllib
from collections import Counter
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    _ROOT = Path(__file__).resolve().parents[1]
    sys.path[:0] = [str(_ROOT), str(_ROOT / "service")]

import httpx
from bench.support import SMOKE_HELP, free_port, smoke
from tests.support.process import make_tokens, service_process, toml_value, upgrade

PRESETS = Path(__file__).resolve().parents[1] / "service" / "reconciler" / "providers" / "presets"
UNIQUE = {"type": "object", "properties": {"u": {"type": "array", "uniqueItems": True}}}
NESTED = {"type": "object", "properties": {"u": {"type": "string", "pattern": "^(a+)+$"}}}


def _batch_schema() -> dict[str, Any]:
    with (PRESETS / "anthropic_batches.toml").open("rb") as handle:
        schema: dict[str, Any] = tomllib.load(handle)["request_schema"]
    return schema


def _batch(size: int) -> dict[str, Any]:
    """A batch of about ``size`` bytes whose last item lacks its params: the whole batch
    is checked, nothing is stored."""
    item = {"params": {"model": "m", "max_tokens": 5, "messages": [{"role": "user"}]}}
    count = size // 125
    items: list[Any] = [{**item, "custom_id": f"id-{i}"} for i in range(count)]
    items.append({"custom_id": "last"})
    return {"requests": items}


def cases(items: int, long_pattern: int) -> dict[str, tuple[dict[str, Any], list[Any]]]:
    """Each schema with the requests its agents send (in turn); ``quiet``: none sent."""
    return {
        "quiet": (NESTED, []),
        # The last item repeats the first: the whole array is checked, nothing is stored.
        "unique": (
            UNIQUE,
            [{"u": [{"id": i % items, "v": [i % items]} for i in range(items + 1)]}],
        ),
        "pattern": (NESTED, [{"u": "a" * 28 + "!"}, {"u": "a" * long_pattern + "!"}]),
        "batch": (_batch_schema(), [_batch(1_000_000)]),
    }


def _provider(directory: Path, schema: dict[str, Any]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    lines = [
        "[providers.hostile]",
        'base_url = "http://127.0.0.1:9"',
        'create = { path = "/v1/jobs", job_id = "/job_id", idempotency_header = "Idem" }',
        'status = { path = "/v1/jobs/{job_id}", state = "/state" }',
        'states = { pending = ["running"], success = ["done"] }',
        f"request_schema = {toml_value(schema)}",
    ]
    (directory / "hostile.toml").write_text("\n".join(lines) + "\n", "utf-8")


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def run(name: str, schema: dict[str, Any], requests: list[Any], args: Any, work: Path) -> None:
    db_url = f"sqlite:///{work / f'{name}.db'}"
    upgrade(db_url)
    agent, _ = make_tokens(db_url)
    _provider(work / f"providers-{name}", schema)
    port = free_port()
    config = work / f"{name}.toml"
    config.write_text(
        f"database_url = {json.dumps(db_url)}\n"
        f"providers_dir = {json.dumps(str(work / f'providers-{name}'))}\n"
        f'log_level = "WARNING"\n[server]\nhost = "127.0.0.1"\nport = {port}\n',
        "utf-8",
    )
    bodies = [json.dumps({"provider": "hostile", "request": r}).encode("utf-8") for r in requests]
    answers: Counter[str] = Counter()
    create_seconds: list[float] = []
    health: list[float] = []
    with service_process(config, port) as service:
        stop = time.monotonic() + args.seconds
        headers = {"Authorization": f"Bearer {agent}", "Content-Type": "application/json"}

        def send(index: int) -> None:
            with httpx.Client(base_url=service.url, timeout=600) as client:
                turn = index
                while time.monotonic() < stop:
                    began = time.monotonic()
                    body = bodies[turn % len(bodies)]
                    turn += 1
                    try:
                        status = str(
                            client.post("/v1/operations", content=body, headers=headers).status_code
                        )
                    except httpx.HTTPError as exc:
                        status = type(exc).__name__
                    answers[status] += 1
                    create_seconds.append(time.monotonic() - began)

        def probe() -> None:
            with httpx.Client(base_url=service.url, timeout=600) as client:
                while time.monotonic() < stop:
                    began = time.monotonic()
                    client.get("/healthz")
                    health.append(time.monotonic() - began)
                    time.sleep(0.02)

        agents = args.agents if bodies else 0
        threads = [threading.Thread(target=send, args=(i,)) for i in range(agents)]
        threads.append(threading.Thread(target=probe))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    sizes = ", ".join(f"{len(b) / 1000:.0f} KB" for b in bodies)
    print(
        f"{name}: bodies {sizes}; /healthz n={len(health)} "
        f"p50 {statistics.median(health) * 1000:.1f} ms, "
        f"p99 {percentile(health, 0.99) * 1000:.1f} ms, max {max(health) * 1000:.1f} ms; "
        f"creates {dict(answers)}, longest {max(create_seconds, default=0):.2f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--agents", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--items", type=int, default=20_000)
    parser.add_argument("--only", default="quiet,unique,pattern,batch")
    parser.add_argument("--long-pattern", type=int, default=1_000_000)
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args()
    smoke(args, agents=2, seconds=0.5, items=200, only="unique")
    with tempfile.TemporaryDirectory() as tmp:
        for name, (schema, requests) in cases(args.items, args.long_pattern).items():
            if name in args.only.split(","):
                run(name, schema, requests, args, Path(tmp))
    print("schema stall done")


if __name__ == "__main__":
    main()
