"""A provider that hangs, or a callback receiver that hangs, fills only its own share.

The latency ratio (loaded ÷ unloaded p99 of the healthy side) is measured by
bench/faults.py; here the property is functional and ordered: the healthy
provider's operations all reach their end while not one of the hanging calls
has returned yet, and the hanging side never holds more operations than its share.
"""

from __future__ import annotations

import time
from pathlib import Path

from fixtures.provider_sim import FaultRates

from tests.support.databases import sqlite_url
from tests.support.faults import TwoProviders, hanging_server, two_providers

QUICK = {"scenario": "success", "duration": 0.3}
HANG = 60.0  # the slow provider answers after this; no test waits for it


def _wait_leased(
    stack: TwoProviders, op_ids: list[str], at_least: int, timeout: float = 20
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if stack.leased(op_ids) >= at_least:
            return
        time.sleep(0.05)
    raise AssertionError(f"fewer than {at_least} of the hanging operations were ever started")


def _counted(stack: TwoProviders, metric: str, **labels: str) -> float:
    """The sum of a counter's samples with these labels."""
    counter = getattr(stack.runtime.metrics, metric)
    return sum(
        sample.value
        for family in counter.collect()
        for sample in family.samples
        if sample.name.endswith("_total")
        and all(sample.labels.get(k) == v for k, v in labels.items())
    )


def test_a_hanging_provider_fills_only_its_own_share(tmp_path: Path) -> None:
    share = 4
    slow = {"status": FaultRates(delay=1.0, delay_seconds=HANG)}
    with (
        sqlite_url(tmp_path) as db,
        two_providers(
            tmp_path,
            db,
            slow=slow,
            slow_provider={"status": {"timeout_seconds": HANG}},
            scheduler={"provider_concurrency": share},
        ) as stack,
    ):
        stuck = [stack.create("slow", {"scenario": "never_finishes"}) for _ in range(40)]
        _wait_leased(stack, stuck, share)
        healthy = [stack.create("good", QUICK) for _ in range(20)]

        assert stack.wait_done(healthy, timeout=60), "the healthy provider's operations stalled"
        # Ordered, not timed: every healthy operation ended while the slow provider's reads
        # were all still hanging (none has come back, answered or timed out).
        assert _counted(stack, "status_requests", provider="slow") == 0
        # The claim took no more of the slow provider's operations than its share can run.
        assert stack.leased(stuck) == share
        assert not any(op.done_at for op in stack.rows(stuck))


def test_a_hanging_callback_receiver_fills_only_the_completion_share(tmp_path: Path) -> None:
    share = 4
    with (
        sqlite_url(tmp_path) as db,
        hanging_server() as receiver,
        two_providers(
            tmp_path,
            db,
            callbacks={"concurrency": share, "timeout_seconds": HANG},
        ) as stack,
    ):
        hung = [stack.create("good", QUICK, callback_url=f"{receiver}/hook/{i}") for i in range(40)]
        _wait_leased(stack, hung, share)
        unrelated = [stack.create("good", QUICK) for _ in range(20)]

        assert stack.wait_done(unrelated, timeout=60), "unrelated operations stalled"
        assert _counted(stack, "callback_attempts") == 0, (
            "a hanging callback returned before the unrelated operations ended"
        )
        completing = [op for op in stack.rows(hung) if op.done_at and op.completion_pending]
        assert sum(1 for op in completing if op.lease_owner) == share
