"""Credentials that real clouds use: what refreshing and signing cost.

Three measurements, in one run:

1. **Token requests per hour of polling.** One provider's adapter reads the status of
   ``--jobs`` jobs, each every ``--every`` seconds, for an hour of the injected clock,
   with OAuth2 client credentials (a token endpoint answering in process) and with
   Google Application Default Credentials (google-auth against a token endpoint on
   loopback that checks the service account's signed assertion). Both issue hour-long
   tokens. Printed: status reads, token requests, and their ratio; the baseline a
   token per call would cost is the reads themselves.
2. **A SigV4 signature per call.** CPU of putting the credential on one request (a 1 KB
   body): AWS SigV4 (botocore's signer) against a static bearer header, the floor.
3. **Signed against unsigned, end to end.** A real service (``reconciler serve``,
   SQLite) runs ``--operations`` jobs through the same job API (``fixtures/runs_api.py``,
   which takes any signature) with a bearer token and with ``aws_sigv4``, 16 in flight:
   operations a second each way and their ratio. The API's own ceiling (requests a
   second it answers a bare client) is printed beside it.

    python bench/credentials.py [--operations N] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path[:0] = [
    str(Path(__file__).resolve().parents[1]),
    str(Path(__file__).resolve().parents[1] / "service"),
]

import httpx  # noqa: E402
from bench.call_shapes import runs_tables, service  # noqa: E402
from bench.support import SMOKE_HELP, smoke  # noqa: E402
from fixtures.runs_api import TOKEN, RunsApi  # noqa: E402
from tests.support import loopback  # noqa: E402
from tests.support.servers import serve_asgi  # noqa: E402
from tests.support.token_authority import (  # noqa: E402
    CLIENT_ID,
    CLIENT_SECRET,
    GOOGLE_SCOPE,
    TokenAuthority,
    service_account_file,
)

from reconciler.core.clock import ManualClock  # noqa: E402
from reconciler.providers.adapter import Subject  # noqa: E402
from reconciler.providers.credentials.aws import AwsSigV4  # noqa: E402
from reconciler.providers.credentials.static import EnvHeader  # noqa: E402
from reconciler.providers.http_adapter import HttpAdapter  # noqa: E402
from reconciler.providers.loader import parse_provider  # noqa: E402

TOKEN_HOST = "auth.bench"
AWS_ENV = {"AWS_ACCESS_KEY_ID": "AKIDEXAMPLEBENCH0001", "AWS_SECRET_ACCESS_KEY": "x" * 40}


async def polled_hour(
    auth: dict[str, Any], jobs: int, every: float, authority: TokenAuthority
) -> tuple[int, int]:
    """(status reads, token requests) of an hour's polling with ``auth``."""
    clock = ManualClock()
    authority.clock = clock
    api = RunsApi(keep_bodies=False)
    runs = [api.add(f"job-{n}") for n in range(jobs)]
    (table,) = runs_tables("http://runs.bench", ("runs",)).values()
    table["auth"] = auth
    spec = parse_provider("runs", table, "bench")
    transport = httpx.MockTransport(authority.guarded(api.handle, TOKEN_HOST, TOKEN))
    env = {"RUNS_CLIENT_ID": CLIENT_ID, "RUNS_CLIENT_SECRET": CLIENT_SECRET}
    adapter = HttpAdapter(spec, env, transport, clock=clock)
    reads = 0
    try:
        for _ in range(int(3600 / every)):
            for run in runs:
                outcome = await adapter.status(Subject("op", "idem", "tr", run.run_id))
                assert outcome.call.http_status == 200, outcome.call
                reads += 1
            clock.advance(every)
    finally:
        await adapter.aclose()
    return reads, authority.requests


def google_hour(jobs: int, every: float) -> tuple[int, int]:
    """``polled_hour`` with Google's credentials from a service-account file."""
    authority = TokenAuthority()
    with (
        serve_asgi(authority.google_app(), lifespan="off") as url,
        tempfile.TemporaryDirectory() as tmp,
    ):
        key = Path(tmp) / "account.json"
        authority.public_key = service_account_file(key, f"{url}/token")
        os.environ["GOOGLE_APPLICATION_CREDENTIALS"] = str(key)
        auth = {"type": "google", "scopes": [GOOGLE_SCOPE]}
        return asyncio.run(polled_hour(auth, jobs, every, authority))


def sign_costs(rounds: int) -> tuple[float, float]:
    """µs of CPU to put the credential on a request: SigV4, and a bearer header."""
    body = b'{"TranscriptionJobName":"idem_' + b"a" * 32 + b'","pad":"' + b"x" * 940 + b'"}'
    aws = AwsSigV4("transcribe", "us-east-1", AWS_ENV)
    bearer = EnvHeader("Authorization", _secret("Bearer " + TOKEN), "RUNS_TOKEN")
    os.environ.update(AWS_ENV)

    def request() -> httpx.Request:
        return httpx.Request(
            "POST",
            "https://transcribe.us-east-1.amazonaws.com/",
            headers={
                "X-Amz-Target": "Transcribe.GetTranscriptionJob",
                "Content-Type": "application/x-amz-json-1.1",
                "X-Trace-ID": "tr_" + "b" * 32,
            },
            content=body,
        )

    async def timed(credential: Any) -> float:
        requests = [request() for _ in range(rounds)]
        await credential.apply(requests[0])  # the chain found once, as a service does
        started = time.process_time()
        for made in requests:
            await credential.apply(made)
        return (time.process_time() - started) / rounds * 1e6

    return asyncio.run(timed(aws)), asyncio.run(timed(bearer))


def _secret(text: str) -> Any:
    from reconciler.config import Secret

    return Secret(text)


def end_to_end(operations: int, rounds: int, work: Path) -> tuple[float, float, float]:
    """(ops/s bearer, ops/s signed, the API's own requests/s against a bare client):
    medians of ``rounds`` rounds."""
    api = RunsApi(finish_after_gets=2, check_token=False, keep_bodies=False)
    with serve_asgi(api.app(), lifespan="off") as api_url:
        ceiling = _ceiling(api_url)
        tables = runs_tables(api_url, ("runs",))
        signed = dict(tables["runs"])
        signed["auth"] = {"type": "aws_sigv4", "service": "execute-api", "region": "us-east-1"}
        tables["runs_aws"] = signed
        rates: dict[str, list[float]] = {"runs": [], "runs_aws": []}
        with service(work, tables, AWS_ENV) as (url, token):
            for round_ in range(rounds):
                # Alternating which goes first, so neither gains from going second.
                order = ("runs", "runs_aws") if round_ % 2 == 0 else ("runs_aws", "runs")
                for name in order:
                    rates[name].append(_rate(url, token, name, operations))
    return statistics.median(rates["runs"]), statistics.median(rates["runs_aws"]), ceiling


def _ceiling(api_url: str) -> float:
    body = {"run_id": "none"}
    headers = {"X-Runs-Fields": "full"}
    started = time.perf_counter()
    count = 400
    with httpx.Client() as client:
        for _ in range(count):
            client.post(f"{api_url}/api/2.0/runs/get", json=body, headers=headers)
    return count / (time.perf_counter() - started)


def _rate(url: str, token: str, provider: str, operations: int) -> float:
    headers = {"Authorization": f"Bearer {token}"}

    def one(n: int) -> str:
        made = loopback.post(
            f"{url}/v1/operations",
            json={"provider": provider, "request": {"task": f"b-{n}"}},
            headers=headers,
            timeout=30,
        )
        made.raise_for_status()
        op_id = made.json()["id"]
        done = loopback.get(
            f"{url}/v1/operations/{op_id}/wait?timeout_seconds=60", headers=headers, timeout=70
        ).json()
        return str(done["state"])

    started = time.perf_counter()
    with ThreadPoolExecutor(16) as pool:
        states = list(pool.map(one, range(operations)))
    elapsed = time.perf_counter() - started
    assert states.count("succeeded") == operations, states
    return operations / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--operations", type=int, default=400, help="per provider, end to end")
    parser.add_argument("--jobs", type=int, default=20, help="jobs polled for the hour")
    parser.add_argument("--every", type=float, default=30.0, help="seconds between reads")
    parser.add_argument("--rounds", type=int, default=5000, help="signatures timed")
    parser.add_argument("--rounds-e2e", type=int, default=3, help="end-to-end rounds")
    parser.add_argument("--work", default="/tmp/bench-credentials")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args()
    smoke(args, operations=8, jobs=2, every=300.0, rounds=200, rounds_e2e=1)
    work = Path(args.work)
    subprocess.run(["rm", "-rf", str(work)], check=True)
    work.mkdir(parents=True)

    oauth2 = {
        "type": "oauth2",
        "token_url": f"http://{TOKEN_HOST}/token",
        "client_id_env": "RUNS_CLIENT_ID",
        "client_secret_env": "RUNS_CLIENT_SECRET",
    }
    print(f"an hour of polling, {args.jobs} jobs read every {args.every:g} s, hour-long tokens")
    print(f"  {'source':<8} {'reads':>7} {'tokens':>7} {'reads/token':>12}")
    for name, (reads, tokens) in (
        ("oauth2", asyncio.run(polled_hour(oauth2, args.jobs, args.every, TokenAuthority()))),
        ("google", google_hour(args.jobs, args.every)),
    ):
        print(f"  {name:<8} {reads:7d} {tokens:7d} {reads / max(tokens, 1):12.0f}")

    aws, bearer = sign_costs(args.rounds)
    print("putting the credential on one request (CPU per call)")
    print(f"  sigv4 {aws:.1f} µs, bearer header (floor) {bearer:.1f} µs, ratio {aws / bearer:.1f}")

    plain, signed, ceiling = end_to_end(args.operations, args.rounds_e2e, work)
    print(
        f"end to end, {args.operations} operations per provider and round, 16 in flight, "
        f"medians of {args.rounds_e2e} rounds"
    )
    print(f"  the job API's own ceiling: {ceiling:.0f} requests/s against a bare client")
    print(
        f"  bearer {plain:.1f} ops/s, aws_sigv4 {signed:.1f} ops/s, ratio signed/bearer "
        f"{signed / plain:.2f}"
    )


if __name__ == "__main__":
    main()
