"""Webhook trust end to end: real HTTP both ways, the scheduler's own trust job, wall clock.

What only this can show: with nobody calling the keeper by hand, the service's scheduler
settles a miss once its grace is over and brings the stretched waits back, while the
simulated provider signs and posts its webhooks over loopback. The step-level cases are
in ``test_webhook_trust.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import sqlalchemy as sa

from reconciler.storage.tables import OPS
from tests.support.stack import QUICK_POLLING, Stack, running_stack
from tests.support.waiting import wait_until

# Trust after 3 webhook-first completions; stretched waits of 1-2 s instead of 25-200 ms.
POLLING = {
    **QUICK_POLLING,
    "trust_after": 3,
    "trusted_max_delay_seconds": 2.0,
    "webhook_grace_seconds": 0.3,
    "max_status_requests": 60,
}


def until(check: Callable[[], bool], timeout: float = 20.0) -> None:
    wait_until(check, timeout, "the condition")


def trust_state(stack: Stack) -> str | None:
    state = stack.runtime.trust_views()["sim"].state
    return state.value if state is not None else None


def stretched(stack: Stack, op_ids: list[str]) -> list[str]:
    with stack.runtime.db.read() as conn:
        rows = conn.execute(
            sa.select(OPS.c.id).where(
                OPS.c.id.in_(op_ids),
                OPS.c.state == "observing",
                OPS.c.delay_source == "webhook_trust",
            )
        )
        return [r.id for r in rows]


def start(stack: Stack, **request: object) -> str:
    response = stack.create({"webhook_on_running": False, **request})
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def test_trust_is_earned_and_an_outage_is_answered_by_the_scheduler(
    tmp_path: Path, db_url: str
) -> None:
    with running_stack(tmp_path, db_url, provider={"polling": POLLING}) as stack:
        # Three webhook-first completions in a row; a read that happens to find a job's end
        # a moment before its webhook is only "late", so a few more jobs may be needed.
        for _ in range(10):
            op_id = start(stack, scenario="success", duration=0.3)
            assert stack.wait(op_id)["state"] == "succeeded"
            if trust_state(stack) == "trusted":
                break
        assert trust_state(stack) == "trusted", stack.runtime.trust_views()["sim"]

        waiting = [start(stack, scenario="never_finishes") for _ in range(4)]
        lost = start(stack, scenario="success", duration=0.2, webhooks="never")
        until(
            lambda: all(
                any(e["delay_source"] == "webhook_trust" for e in stack.history(i)) for i in waiting
            )
        )
        # The lost job is found by its stretched read, judged a miss after the grace, and
        # the provider distrusted: the stretched waits come back, with a history line
        # (one caught in the middle of its read instead decides again, now distrusted).
        assert stack.wait(lost)["state"] == "succeeded"
        until(lambda: trust_state(stack) == "distrusted")
        until(lambda: not stretched(stack, waiting))
        notes = [
            e["detail"]["note"]
            for op_id in waiting
            for e in stack.history(op_id)
            if e["cause"] == "webhook_trust_withdrawn"
        ]
        assert notes, "no stretched wait was brought back"
        assert all(f"webhooks distrusted after a miss on {lost}" in n for n in notes)
        view = stack.runtime.trust_views()["sim"]
        assert view.webhook_first >= 3 and view.misses >= 1
