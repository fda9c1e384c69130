"""A provider that hangs, or a callback receiver host that hangs, fills only its own share.

The latency ratio (loaded ÷ unloaded p99 of the healthy side) is measured by
bench/faults.py; here the property is functional and ordered: the healthy
provider's operations all reach their end while not one of the hanging calls
has returned yet, and the hanging side never holds more operations than its share.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from reconciler.demo.sim import FaultRates
from tests.support import hooks
from tests.support.databases import sqlite_url
from tests.support.faults import TwoProviders, hanging_server, two_providers
from tests.support.hooks import serve_receiver
from tests.support.waiting import wait_until

QUICK = {"scenario": "success", "duration": 0.3}
NEVER = {"scenario": "never_finishes"}
HANG = 60.0  # the slow provider answers after this; no test waits for it


def _wait_leased(
    stack: TwoProviders, op_ids: list[str], at_least: int, timeout: float = 20
) -> None:
    wait_until(
        lambda: stack.leased(op_ids) >= at_least,
        timeout,
        f"{at_least} of the hanging operations to be started",
    )


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
        # At once, as agents would: each create waits out its answer window while the slow
        # provider's share is full, and forty of those one after another take 17 s.
        with ThreadPoolExecutor(max_workers=40) as pool:
            stuck = list(pool.map(lambda _: stack.create("slow", NEVER), range(40)))
        _wait_leased(stack, stuck, share)
        healthy = [stack.create("good", QUICK) for _ in range(20)]

        assert stack.wait_done(healthy, timeout=60), "the healthy provider's operations stalled"
        # Ordered, not timed: every healthy operation ended while the slow provider's reads
        # were all still hanging (none has come back, answered or timed out).
        assert _counted(stack, "status_requests", provider="slow") == 0
        # The claim took no more of the slow provider's operations than its share can run.
        assert stack.leased(stuck) == share
        assert not any(op.done_at for op in stack.rows(stuck))


def _completing_leased(stack: TwoProviders, op_ids: list[str]) -> int:
    return sum(1 for op in stack.rows(op_ids) if op.completion_pending and op.lease_owner)


def _finished(stack: TwoProviders, op_ids: list[str]) -> bool:
    return all(op.done_at and not op.completion_pending for op in stack.rows(op_ids))


def test_a_hanging_receiver_host_holds_only_its_own_slots(tmp_path: Path) -> None:
    """Callbacks to a healthy host arrive while a hanging host holds its own share.

    Pool 4, two per host: the hanging host's 40 callbacks take two slots and the
    claim leaves the rest of them out, so the healthy host's callbacks are
    claimed and delivered although the hanging ones are due first.
    """
    # The hanging host is entered last so that it lets go first: the service's shutdown
    # then finds its deliveries failed instead of waiting out its drain bound for them.
    with (
        sqlite_url(tmp_path) as db,
        serve_receiver() as (receiver, healthy_url),
        two_providers(
            tmp_path,
            db,
            callbacks={"concurrency": 4, "per_host_concurrency": 2, "timeout_seconds": HANG},
        ) as stack,
        hanging_server("127.0.0.2") as hanging,
    ):
        hung = [stack.create("good", QUICK, callback_url=f"{hanging}/hook/{i}") for i in range(40)]
        wait_until(lambda: _completing_leased(stack, hung) >= 2, 30, "the hanging deliveries")
        healthy = [
            stack.create("good", QUICK, callback_url=f"{healthy_url}/cb/h{i}") for i in range(10)
        ]

        wait_until(
            lambda: _counted(stack, "callback_attempts", result="delivered") == 10,
            60,
            "the healthy host's callbacks to arrive",
        )
        assert len({d.path for d in receiver.deliveries()}) == 10
        # Ordered, not timed: every healthy callback arrived while none of the hanging
        # host's attempts had come back, and that host never held more than its two.
        assert _counted(stack, "callback_attempts") == 10
        assert _completing_leased(stack, hung) == 2
        wait_until(lambda: _finished(stack, healthy), 30, "the healthy completions to finish")


def test_hooks_run_while_every_callback_slot_hangs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hooks have a share of their own: a full callback pool does not hold them up."""
    log = tmp_path / "hooks.log"
    monkeypatch.setenv(hooks.LOG_ENV, str(log))
    with (  # the hanging hosts last, to let go first (see above)
        sqlite_url(tmp_path) as db,
        two_providers(
            tmp_path,
            db,
            hooks=(hooks.RECORD,),
            callbacks={"concurrency": 4, "per_host_concurrency": 2, "timeout_seconds": HANG},
        ) as stack,
        hanging_server("127.0.0.2") as first,
        hanging_server("127.0.0.3") as second,
    ):
        hung = [
            stack.create("good", QUICK, callback_url=f"{(first, second)[i % 2]}/hook/{i}")
            for i in range(20)
        ]
        wait_until(lambda: _completing_leased(stack, hung) >= 4, 30, "the pool to fill")
        plain = [stack.create("good", QUICK) for _ in range(10)]

        wait_until(lambda: _finished(stack, plain), 60, "the hooks of the other operations")
        ran = hooks.finished_by_key(log)
        assert all(ran[hooks.hook_key(op_id, hooks.RECORD)] == 1 for op_id in plain)
        assert _counted(stack, "callback_attempts") == 0, "a hanging delivery came back first"
