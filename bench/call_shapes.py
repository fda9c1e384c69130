"""Every call's shape from a file: what a body on every call costs.

Two measurements, in one run:

1. **Calls per operation, both ways.** One job API (``fixtures/runs_api.py``, on uvicorn
   in this process) serves the same runs two ways: every call a POST naming its run in
   the body (``fixtures/providers/runs.toml``), and GET-shaped paths like the simulated
   provider's (``runs_rest.toml``). The service (a real ``reconciler serve`` process on
   SQLite) runs the same operations through both files: a plain job, a job whose create
   answer is lost (settled by the lookup), and a job cancelled after it started. Printed:
   the provider calls an operation took each way, and their ratio (1.00: a body costs no
   call).
2. **Building a call.** The request builder (``providers/call_request.py``) for each call
   of ``runs.toml``, against the floor: ``httpx.Request`` built from the same method, URL,
   headers and body already in hand (no template filled, no body written). Printed: µs of
   CPU a call each, their ratio, and the request's bytes.

    python bench/call_shapes.py [--operations N] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import tomllib
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path[:0] = [
    str(Path(__file__).resolve().parents[1]),
    str(Path(__file__).resolve().parents[1] / "service"),
]

import httpx  # noqa: E402
from bench.support import ROOT, SMOKE_HELP, free_port, reconciler_serving, smoke  # noqa: E402
from fixtures.runs_api import TOKEN, RunsApi  # noqa: E402
from tests.support import loopback  # noqa: E402
from tests.support.servers import serve_asgi  # noqa: E402

from reconciler.providers.adapter import Subject  # noqa: E402
from reconciler.providers.call_request import build_request  # noqa: E402
from reconciler.providers.http_adapter import HttpAdapter  # noqa: E402
from reconciler.providers.loader import parse_provider  # noqa: E402
from reconciler.providers.toml_text import dumps  # noqa: E402

FILES = {"body": "runs", "rest": "runs_rest"}
FLAVOURS = ("plain", "lost_create", "cancelled")
# The API's routes each way; what the other file never calls stays 0.
BODY_ROUTES = ("submit", "list", "get", "set_state", "output")
REST_ROUTES = ("submit", "rest_list", "rest_get", "rest_cancel", "rest_output")


def runs_tables(url: str, names: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """The fixtures' provider tables, pointed at ``url`` and polling fast."""
    tables = {}
    for name in names:
        with (ROOT / "fixtures" / "providers" / f"{name}.toml").open("rb") as fh:
            table = tomllib.load(fh)["providers"][name]
        table["base_url"] = url
        table["polling"].update(base_delay_seconds=0.05, max_delay_seconds=0.2)
        tables[name] = table
    return tables


@contextmanager
def service(
    work: Path, tables: dict[str, dict[str, Any]], env_extra: dict[str, str] | None = None
) -> Iterator[tuple[str, str]]:
    """``reconciler serve`` on SQLite with these provider tables; yields (its URL, an agent
    token)."""
    port = free_port()
    files = work / "providers"
    files.mkdir(parents=True, exist_ok=True)
    for name, table in tables.items():
        (files / f"{name}.toml").write_text(dumps({"providers": {name: table}}))
    config = work / "reconciler.toml"
    config.write_text(
        f'database_url = "sqlite:///{work / "reconciler.db"}"\n'
        f'providers_dir = "{files}"\n'
        f"[server]\nport = {port}\n[scheduler]\ntick_seconds = 0.05\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECONCILER_")}
    env.update(RUNS_TOKEN=TOKEN, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'service'}")
    env.update(env_extra or {})
    with reconciler_serving(config, port, env, work / "service.log") as (url, token, _):
        yield url, token


def run_one(url: str, token: str, provider: str, flavour: str, n: int) -> str:
    """Start one operation of ``flavour`` and wait for its end; returns its state."""
    headers = {"Authorization": f"Bearer {token}"}
    request: dict[str, Any] = {"task": f"bench-{n}"}
    if flavour == "lost_create":
        request["lose_answer"] = True
    made = loopback.post(
        f"{url}/v1/operations",
        json={"provider": provider, "request": request},
        headers=headers,
        timeout=30,
    )
    made.raise_for_status()
    op_id = made.json()["id"]
    if flavour == "cancelled":
        while (
            loopback.get(f"{url}/v1/operations/{op_id}", headers=headers).json()["remote_job_id"]
            is None
        ):
            time.sleep(0.01)
        loopback.post(f"{url}/v1/operations/{op_id}/cancel", headers=headers).raise_for_status()
    done = loopback.get(
        f"{url}/v1/operations/{op_id}/wait?timeout_seconds=30", headers=headers, timeout=40
    ).json()
    return str(done["state"])


def calls_per_operation(operations: int, work: Path) -> dict[str, dict[str, float]]:
    """Per flavour, the API calls an operation took through each file."""
    api = RunsApi(finish_after_gets=2)
    figures: dict[str, dict[str, float]] = {}
    with (
        serve_asgi(api.app(), lifespan="off") as api_url,
        service(work, runs_tables(api_url, tuple(FILES.values()))) as (url, token),
    ):
        for flavour in FLAVOURS:
            figures[flavour] = {}
            for shape, provider in FILES.items():
                before = Counter(api.calls)
                states = Counter(
                    run_one(url, token, provider, flavour, n) for n in range(operations)
                )
                routes = BODY_ROUTES if shape == "body" else REST_ROUTES
                spent = sum(api.calls[r] - before[r] for r in routes)
                figures[flavour][shape] = spent / operations
                print(f"  {flavour:<12} {shape:<5} ends {dict(states)}", flush=True)
    return figures


def _cpu_us(fn: Callable[[], Any], rounds: int) -> float:
    for _ in range(min(rounds, 200)):
        fn()
    started = time.process_time()
    for _ in range(rounds):
        fn()
    return (time.process_time() - started) / rounds * 1e6


def build_costs(rounds: int) -> list[tuple[str, float, float, int]]:
    """(call, ours µs, floor µs, request bytes) for each call of runs.toml."""
    with (ROOT / "fixtures" / "providers" / "runs.toml").open("rb") as fh:
        table = tomllib.load(fh)["providers"]["runs"]
    spec = parse_provider("runs", table, "runs.toml")
    adapter = HttpAdapter(spec, {"RUNS_TOKEN": TOKEN})
    values = adapter.values(Subject("op_01jbench", "idem_" + "a" * 32, "tr_" + "b" * 32, "r-1"))
    request = {"task": "export", "params": {"rows": 1000, "format": "csv"}}
    calls = (
        ("create", spec.create, spec.create.path, request),
        ("lookup", spec.lookup, spec.lookup.path if spec.lookup else "", None),
        ("status", spec.status, spec.status.path, None),
        ("cancel", spec.cancel, spec.cancel.path if spec.cancel else "", None),
        ("result", spec.result, spec.result.path if spec.result else "", None),
    )
    typed = any(name.lower() == "content-type" for name, _ in spec.headers)
    rows = []
    for name, call, path, body in calls:
        assert call is not None and path is not None

        def ours(call: Any = call, path: str = path, body: Any = body) -> Any:
            built = build_request(call, path, values, request=body, typed=typed)
            return httpx.Request(
                built.method,
                spec.base_url + built.path,
                headers=built.headers,
                content=built.content,
            )

        sample = ours()
        method, url, content = sample.method, str(sample.url), sample.content
        headers = list(sample.headers.raw)

        def floor(
            method: str = method, url: str = url, headers: Any = headers, content: bytes = content
        ) -> Any:
            return httpx.Request(method, url, headers=headers, content=content)

        size = len(method) + len(url) + sum(len(k) + len(v) + 4 for k, v in headers) + len(content)
        rows.append((name, _cpu_us(ours, rounds), _cpu_us(floor, rounds), size))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--operations", type=int, default=50, help="per flavour and file")
    parser.add_argument("--rounds", type=int, default=20_000, help="builds timed per call")
    parser.add_argument("--work", default="/tmp/bench-call-shapes")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args()
    smoke(args, operations=2, rounds=500)
    work = Path(args.work)
    subprocess.run(["rm", "-rf", str(work)], check=True)
    work.mkdir(parents=True)

    print("building a call (CPU per call; floor: httpx.Request from the finished parts)")
    print(f"  {'call':<7} {'ours µs':>8} {'floor µs':>9} {'ratio':>6} {'bytes':>6}")
    for name, ours, floor, size in build_costs(args.rounds):
        print(f"  {name:<7} {ours:8.1f} {floor:9.1f} {ours / floor:6.2f} {size:6d}")

    print(f"calls per operation, {args.operations} operations per flavour and file")
    figures = calls_per_operation(args.operations, work)
    print(f"  {'flavour':<12} {'body':>6} {'rest':>6} {'ratio body/rest':>16}")
    for flavour, by_shape in figures.items():
        body, rest = by_shape["body"], by_shape["rest"]
        print(f"  {flavour:<12} {body:6.2f} {rest:6.2f} {body / rest:16.2f}")
    print(json.dumps({"calls_per_operation": figures}))


if __name__ == "__main__":
    main()
