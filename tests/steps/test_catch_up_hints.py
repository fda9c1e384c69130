"""The catch-up spread leaves alone the reads a webhook brought forward.

A burst of completions fills the provider's share, so reads made due by webhook hints
queue for some seconds. Before, one of them overdue by more than
``catch_up_after_seconds`` set off the spread for every due read of the provider: on
PostgreSQL, where the service is slower, 170 announced completions waited up to two
minutes for their confirming read. A read overdue by its own schedule is still spread.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from reconciler.core.vocabulary import DelaySource
from reconciler.engine.catch_up import spread_overdue
from reconciler.storage.tables import OPS
from tests.support.statements import Ran, recording
from tests.support.steps import StepRig, step_rig

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

OPERATIONS = 12
OVERDUE = timedelta(seconds=30)  # far past catch_up_after_seconds (5)


async def _observing(rig: StepRig, source: DelaySource | None) -> list[str]:
    """Operations being observed whose next read fell due ``OVERDUE`` ago, set by ``source``."""
    ids = [rig.submit() for _ in range(OPERATIONS)]
    for op_id in ids:
        assert (await rig.step(op_id)).state == "observing"
    with rig.runtime.db.write() as conn:
        conn.execute(
            sa.update(OPS)
            .where(OPS.c.id.in_(ids))
            .values(
                next_poll_at=rig.clock.now() - OVERDUE,
                delay_source=source.value if source is not None else None,
            )
        )
    return ids


def _spread(rig: StepRig) -> int:
    with rig.runtime.db.write() as conn:
        return spread_overdue(conn, rig.runtime, rig.clock.now(), "worker:test")


async def test_reads_a_webhook_brought_forward_are_claimed_at_once(
    tmp_path: Path, db_url: str
) -> None:
    async with step_rig(tmp_path, db_url) as rig:
        ids = await _observing(rig, DelaySource.WEBHOOK_HINT)
        assert _spread(rig) == 0
        for op_id in ids:
            op = rig.row(op_id)
            assert op.next_poll_at is not None and op.next_poll_at <= rig.clock.now()
            assert "catch_up" not in rig.causes(op_id)


async def test_reads_overdue_by_their_own_schedule_are_still_spread(
    tmp_path: Path, db_url: str
) -> None:
    async with step_rig(tmp_path, db_url) as rig:
        ids = await _observing(rig, DelaySource.LOCAL_BACKOFF)
        assert _spread(rig) == OPERATIONS
        assert all("catch_up" in rig.causes(op_id) for op_id in ids)


async def test_claims_look_for_a_burst_once_a_second_and_still_spread_one(
    tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe for long-overdue reads is a statement every claim would run (many a second
    under load): it runs once a second at most, and a burst is still spread."""
    async with step_rig(tmp_path, db_url) as rig:
        ids = await _observing(rig, DelaySource.LOCAL_BACKOFF)
        with rig.runtime.db.write() as conn:  # not due: the first claim finds nothing
            conn.execute(sa.update(OPS).values(next_poll_at=rig.clock.now() + timedelta(hours=1)))
        with recording(monkeypatch) as first:
            await rig.tick()
        rig.advance(0.5)
        with recording(monkeypatch) as second:
            await rig.tick()
        assert _probes(first) == 1 and _probes(second) == 0
        with rig.runtime.db.write() as conn:
            conn.execute(sa.update(OPS).values(next_poll_at=rig.clock.now() - OVERDUE))
        rig.advance(0.5)
        await rig.tick()
        assert all("catch_up" in rig.causes(op_id) for op_id in ids)


def _probes(ran: list[Ran]) -> int:
    return sum(
        1 for sql, _ in ran if sql.startswith("SELECT id FROM operations WHERE next_poll_at <")
    )
