"""Focused regressions for the breaches the chaos soak (bench/soak.py) found.

1. Status requests earlier than a Retry-After: a webhook hint brought the next status read
   forward to "now" although the last answer's Retry-After had not elapsed (seen when the
   backoff, not the Retry-After, chose the wait, so the schedule did not show it); a hint
   that arrived while the read was in flight did the same; and a cancel scheduled its first
   status read after the cancel call without looking at the Retry-After either. The
   operation now keeps the Retry-After as a moment (``retry_not_before``) and every path
   that schedules a status read honours it.
2. Status requests past the deadline: the deadline was checked before the request was
   charged and before it waited for a free provider slot, so under load a request could
   leave after the deadline. It is checked again just before transmission; a late one is
   not sent (an unused reservation) and the operation times out.
3. Completion steps recorded done several times: when a worker's own lease lapsed during a
   slow step (its heartbeat fell behind under load), its next tick claimed the operation
   again and started a second task on it. Both tasks carry the same owner, so both passed
   every lease guard and both ran and recorded the same step. A worker now keeps one task
   per operation.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from reconciler.core.next_read import hinted_wait
from reconciler.core.states import State
from reconciler.core.vocabulary import DelaySource
from reconciler.demo.sim import FaultRates
from reconciler.engine import worker
from reconciler.storage.database import Database
from reconciler.storage.journal import Journal
from reconciler.storage.tables import HISTORY, OPS
from reconciler.storage.webhook_events import IncomingEvent, Outcome, write_batch
from tests.support import hooks
from tests.support.factories import insert_operation
from tests.support.stack import Stack, running_stack
from tests.support.waiting import wait_until
from tests.support.world import SyncWorld, sync_world

SKEW = 0.05
NOW = datetime(2025, 4, 18, 10, 20, tzinfo=UTC)


def epoch(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


@contextmanager
def world_with(tmp_path: Path, db_url: str, polling: dict[str, Any]) -> Iterator[SyncWorld]:
    """The in-process world (one manual clock for the service and the sim): for the
    Retry-After cases, whose verdict is a comparison of moments."""
    polling = {"deadline_seconds": 60, "max_status_requests": 20, **polling}
    with sync_world(tmp_path, db_url, polling=polling) as world:
        yield world


@contextmanager
def stack_with(
    tmp_path: Path, db_url: str, polling: dict[str, Any], **options: Any
) -> Iterator[Stack]:
    provider = {"polling": {"deadline_seconds": 60, "max_status_requests": 20, **polling}}
    with running_stack(tmp_path, db_url, provider=provider, tick_seconds=0.1, **options) as stack:
        yield stack


def status_reads(scene: Stack | SyncWorld, job_id: str) -> list[dict[str, Any]]:
    reads: list[dict[str, Any]] = scene.sim_job(job_id)["requests"]["status"]
    return sorted(reads, key=lambda r: r["at"])


def first_429(world: SyncWorld, op_id: str) -> tuple[str, dict[str, Any]]:
    """Run until the operation's first status read has been answered 429; return it."""

    def seen() -> tuple[str, dict[str, Any]] | None:
        job_id = world.row(op_id)["remote_job_id"]
        reads = status_reads(world, job_id) if job_id else []
        return (job_id, reads[0]) if reads and reads[0]["status"] == 429 else None

    world.run_until(seen)
    found = seen()
    assert found is not None
    return found


# --- 1. Retry-After ------------------------------------------------------------------


def test_a_webhook_inside_a_retry_after_window_brings_the_read_to_its_end_not_before(
    tmp_path: Path, db_url: str
) -> None:
    # Backoff 3 s then 6 s (no jitter); the 429's Retry-After is 2 s, so the 6 s backoff
    # chooses the wait and nothing in the schedule shows the Retry-After any more.
    polling = {"base_delay_seconds": 3, "max_delay_seconds": 6, "jitter_floor": 1.0}
    request = {
        "scenario": "never_finishes",
        "duration": 60,
        "webhook_on_running": False,
        "status_fault": 429,
        "status_fault_count": 1,
        "retry_after": 2,
    }
    with world_with(tmp_path, db_url, polling) as world:
        op_id = world.create(request).json()["id"]
        job_id, limited = first_429(world, op_id)
        assert limited["retry_after"] == "2"
        allowed_at = limited["answered_at"] + 2
        # The provider finishes now: its webhook arrives inside the Retry-After window.
        world.sim_client.post(
            f"/_sim/jobs/{job_id}/complete", json={"state": "succeeded"}
        ).raise_for_status()
        op = world.wait(op_id)
        assert op["state"] == "succeeded", op
        hints = [e for e in world.history(op_id) if e["kind"] == "hint"]
        assert hints and epoch(hints[0]["at"]) < allowed_at, "the hint came inside the window"
        following = status_reads(world, job_id)[1]
        assert following["at"] >= allowed_at - SKEW, (limited, following)
        # ... and the hint still counted: the read did not wait for the 6 s backoff.
        assert following["at"] < limited["at"] + 5.5, (limited, following)


RETRY_AFTER_WINDOW = 15


def test_a_cancel_inside_a_retry_after_window_reads_the_status_after_it(
    tmp_path: Path, db_url: str
) -> None:
    polling = {"base_delay_seconds": 0.2, "max_delay_seconds": 0.4, "jitter_floor": 1.0}
    request = {
        "scenario": "never_finishes",
        "duration": 60,
        "webhooks": "never",
        "status_fault": 429,
        "status_fault_count": 1,
        "retry_after": RETRY_AFTER_WINDOW,
        "cancel_delay": 0.3,
    }
    with world_with(tmp_path, db_url, polling) as world:
        op_id = world.create(request).json()["id"]
        job_id, limited = first_429(world, op_id)
        allowed_at = limited["answered_at"] + RETRY_AFTER_WINDOW
        cancel = world.client.post(f"/v1/operations/{op_id}/cancel", headers=world.headers())
        assert cancel.status_code == 202, cancel.text
        op = world.wait(op_id)
        assert op["state"] == "cancelled", op
        cancels = world.sim_job(job_id)["requests"]["cancel"]
        assert cancels and cancels[0]["at"] < allowed_at, "the cancel went out inside the window"
        following = status_reads(world, job_id)[1]
        assert following["at"] >= allowed_at - SKEW, (limited, following)


def test_a_hint_during_a_read_answered_with_retry_after_waits_for_it() -> None:
    floor = NOW + timedelta(seconds=2)
    backoff = NOW + timedelta(seconds=6)
    assert hinted_wait(backoff, DelaySource.LOCAL_BACKOFF, floor, NOW) == (
        floor,
        DelaySource.PROVIDER_RETRY_AFTER,
    )
    # Without a Retry-After (or one that has passed) the hint means "look now".
    assert hinted_wait(backoff, DelaySource.LOCAL_BACKOFF, None, NOW) == (
        NOW,
        DelaySource.WEBHOOK_HINT,
    )
    assert hinted_wait(backoff, DelaySource.LOCAL_BACKOFF, NOW, NOW) == (
        NOW,
        DelaySource.WEBHOOK_HINT,
    )
    # A Retry-After past the scheduled read (capped at the deadline) keeps the schedule.
    capped = NOW + timedelta(seconds=1)
    assert hinted_wait(capped, DelaySource.PROVIDER_RETRY_AFTER, floor, NOW) == (
        capped,
        DelaySource.PROVIDER_RETRY_AFTER,
    )


def _event(event_id: str, job: str) -> IncomingEvent:
    body = f'{{"id":"{event_id}","job":"{job}"}}'
    return IncomingEvent(
        provider="sim",
        event_id=event_id,
        remote_job_id=job,
        body_sha256=hashlib.sha256(body.encode()).hexdigest(),
        body=body,
        received_at=NOW,
    )


@pytest.mark.parametrize("retry_in", [None, -1, 2])
def test_a_stored_webhook_hint_respects_the_retry_after_moment(
    db: Database, retry_in: int | None
) -> None:
    journal = Journal()
    scheduled = NOW + timedelta(seconds=6)
    floor = None if retry_in is None else NOW + timedelta(seconds=retry_in)
    op = insert_operation(
        db,
        journal,
        NOW - timedelta(minutes=1),
        state=State.OBSERVING.value,
        remote_job_id="job_ra",
        accepted_at=NOW - timedelta(minutes=1),
        next_poll_at=scheduled,
        delay_source=DelaySource.LOCAL_BACKOFF.value,
        retry_not_before=floor,
    )
    with db.write() as conn:
        assert write_batch(conn, journal, [_event("evt_ra", "job_ra")], NOW) == [Outcome.HINTED]
    with db.read() as conn:
        row = conn.execute(sa.select(OPS).where(OPS.c.id == op.id)).mappings().one()
        entry = (
            conn.execute(
                sa.select(HISTORY).where(HISTORY.c.operation_id == op.id, HISTORY.c.kind == "hint")
            )
            .mappings()
            .one()
        )
    if floor is None or floor <= NOW:
        expected = (NOW, DelaySource.WEBHOOK_HINT.value)
    else:
        expected = (floor, DelaySource.PROVIDER_RETRY_AFTER.value)
    assert (row["next_poll_at"], row["delay_source"]) == expected
    assert row["hinted_at"] == NOW
    assert entry["delay_source"] == expected[1]


# --- 2. deadline -----------------------------------------------------------------------

FAR_FUTURE = datetime(2100, 1, 1, tzinfo=UTC)


def set_due(db: Database, op_id: str, when: datetime) -> bool:
    """Move an unleased operation's next look to ``when`` (test set-up, version bumped)."""
    with db.write() as conn:
        moved = conn.execute(
            sa.update(OPS)
            .where(OPS.c.id == op_id, OPS.c.lease_owner.is_(None))
            .values(next_poll_at=when, version=OPS.c.version + 1)
        )
    return moved.rowcount == 1


def test_a_read_that_gets_no_provider_slot_before_its_deadline_is_not_sent(
    tmp_path: Path, db_url: str
) -> None:
    """The provider's share is full until past the deadline: the read is never sent.

    Each provider has its own share of the worker; an operation whose provider has no
    free slot is not claimed at all, so when it is, the deadline check before the
    request stops it (the deadline is checked before a request: docs/design.md#read-order).
    """
    polling = {"base_delay_seconds": 1.0, "max_delay_seconds": 1.0, "jitter_floor": 1.0}
    # Every status answer takes 5 s; with one provider slot, a read holds it that long.
    slow_status = {"status": FaultRates(delay=1.0, delay_seconds=5.0)}
    with stack_with(
        tmp_path,
        db_url,
        polling,
        sim_config={"endpoint_faults": slow_status},
        scheduler={"provider_concurrency": 1},
    ) as stack:
        rt = stack.runtime
        never = {"scenario": "never_finishes", "webhooks": "never"}
        blocker = stack.create(never).json()["id"]
        late = stack.create(never, deadline_seconds=3).json()["id"]
        # Order the two reads by what is observed, not by sleeping: hold the late one back
        # until the blocker's read holds the only provider slot (it is answered after 5 s),
        # then make it due, well before its 3 s deadline.
        stack.wait_state(late, {"observing"}, timeout=20)
        wait_until(lambda: set_due(rt.db, late, FAR_FUTURE), 20, "the late read to be held back")
        wait_until(
            lambda: any(
                r.endpoint == "status" and r.answered_at is None for r in stack.sim.requests
            ),
            20,
            "the blocker's status read to hold the only provider slot",
        )
        wait_until(lambda: set_due(rt.db, late, datetime.now(UTC)), 20, "the late read to be due")
        op = stack.wait_state(late, {"result_timed_out"}, timeout=30)
        assert op["state"] == "result_timed_out", op
        assert status_reads(stack, op["remote_job_id"]) == [], "no request after the deadline"
        # Not claimed while the share was full, so nothing was charged for it either.
        assert op["budget"]["status_requests_used"] == 0
        stops = [e for e in stack.history(late) if e["kind"] == "escalation"]
        assert [e["detail"]["reason"] for e in stops] == ["deadline_exceeded"]
        assert stack.get(blocker, operator=True)["state"] == "observing"


# --- 3. one task per operation in a worker -------------------------------------------------


def test_a_lapsed_lease_of_our_own_does_not_start_a_second_task_on_the_operation(
    tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "hooks.log"
    monkeypatch.setenv(hooks.LOG_ENV, str(log))
    monkeypatch.setenv(hooks.SLEEP_ENV, "2.5")
    # The heartbeat cannot keep the lease (as when its writes fall behind under load): a
    # 1 s lease lapses inside the 2.5 s hook, and every tick claims the operation again.
    monkeypatch.setattr(worker, "MAX_HELD_SECONDS", 0.0)
    polling = {"base_delay_seconds": 0.2, "max_delay_seconds": 0.2}
    with stack_with(tmp_path, db_url, polling, hooks=(hooks.SLOW,)) as stack:
        rt = stack.runtime
        scheduler = rt.settings.scheduler.model_copy(update={"lease_seconds": 1.0})
        rt.settings = rt.settings.model_copy(update={"scheduler": scheduler})
        op_id = stack.create({"scenario": "success", "duration": 0.2}).json()["id"]
        key = hooks.hook_key(op_id, hooks.SLOW)
        wait_until(lambda: hooks.completion_finished(rt.db, op_id), 30, "the completion")
        stack.settled([op_id])  # idle with nothing due: a stray second run has had its turn
        assert hooks.started_by_key(log) == {key: 1}
        assert hooks.finished_by_key(log) == {key: 1}
        done = [e for e in stack.history(op_id) if e["cause"] == f"step_done:hook:{hooks.SLOW}"]
        assert len(done) == 1, done
        assert hooks.completion_steps(rt.db, op_id)[f"hook:{hooks.SLOW}"]["attempts"] == 1
