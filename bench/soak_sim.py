"""The soak's simulated provider in a process of its own, its webhooks spread over the replicas.

    python -m bench.soak_sim --port P --seed S --replica URL [--replica URL ...]

Chaos rates are the soak's (``bench.soak_load.CHAOS``). Each webhook goes to a replica
drawn from the seeded ``random.Random``; when that one refuses the connection (killed,
restarting) the next one is tried, as a load balancer would. A separate process keeps
the provider's request times honest when the soak driver is busy.
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _path in (str(ROOT), str(ROOT / "service")):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import httpx  # noqa: E402
import uvicorn  # noqa: E402
from bench.soak_load import CHAOS  # noqa: E402
from tests.support.stack import SIM_TOKEN, WEBHOOK_SECRET  # noqa: E402

from reconciler.demo.sim import ConnectionDropped, SimConfig, create_app  # noqa: E402

WEBHOOK_URL = "http://replicas.invalid/webhooks/sim"


class FailoverRouter(httpx.AsyncBaseTransport):
    """Sends each webhook to a random replica, falling over to the others on refusal."""

    def __init__(self, replicas: Sequence[str], rng: random.Random) -> None:
        self.replicas = [httpx.URL(u) for u in replicas]
        self.rng = rng
        self.inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        order = self.rng.sample(self.replicas, len(self.replicas))
        for target in order:
            request.url = request.url.copy_with(host=target.host, port=target.port)
            request.headers["host"] = f"{target.host}:{target.port}"
            try:
                return await self.inner.handle_async_request(request)
            except httpx.ConnectError:
                if target is order[-1]:
                    raise
        raise httpx.ConnectError("no replica")

    async def aclose(self) -> None:
        await self.inner.aclose()


class _HideDrops(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, ConnectionDropped)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak_sim")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--replica", action="append", required=True)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    config = SimConfig(
        token=SIM_TOKEN,
        webhook_secret=WEBHOOK_SECRET,
        webhook_url=WEBHOOK_URL,
        webhook_transport=FailoverRouter(args.replica, random.Random(rng.random())),
        seed=rng.randrange(2**31),
        faults=CHAOS,
    )
    server = uvicorn.Config(
        create_app(config), host="127.0.0.1", port=args.port, log_level="warning", lifespan="on"
    )
    logging.getLogger("uvicorn.error").addFilter(_HideDrops())
    uvicorn.Server(server).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
