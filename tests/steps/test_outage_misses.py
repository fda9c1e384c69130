"""A webhook due while our own storage was down is not the provider's miss.

While the database refuses writes, the webhook endpoint answers 503: a provider's
completion webhook sent then is refused by us. Before, the read that later found the
job done, with no webhook in the grace, was judged a miss (after a 60 s outage a
provider was left distrusted with 5 misses). Now such a completion is ``excused``:
judged, and counted nowhere. Without an outage the same story is still a miss.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from reconciler.core.trust import Health
from reconciler.engine.trust import TrustKeeper
from reconciler.storage import trust as health_store
from reconciler.storage.availability import WriteFailure
from reconciler.storage.tables import VERDICTS
from tests.support.stack import QUICK_POLLING
from tests.support.steps import StepRig, step_rig

pytestmark = pytest.mark.anyio

PROVIDER = {
    "polling": {
        **QUICK_POLLING,
        "deadline_seconds": 600,
        "max_status_requests": 40,
        "webhook_trust": "adaptive",
        "webhook_grace_seconds": 30,
    }
}


async def _done_and_read(rig: StepRig, *, outage: bool) -> str:
    op_id = rig.submit()
    op = await rig.step(op_id)
    assert op.state == "observing" and op.remote_job_id is not None
    rig.advance_to_due(op_id)
    await rig.step(op_id)  # one read: still running
    rig.advance(5)
    rig.provider.finish(op.remote_job_id)  # its webhook never reaches us
    if outage:
        rig.runtime.db.availability.failed(WriteFailure.UNREACHABLE)
        rig.advance(3)
    op = await rig.run(op_id, ["succeeded"])
    return op_id


def _verdicts(rig: StepRig) -> list[str]:
    with rig.runtime.db.read() as conn:
        return [r.verdict for r in conn.execute(sa.select(VERDICTS.c.verdict))]


async def _settled(rig: StepRig) -> Health:
    rig.advance(31)  # past the grace
    await TrustKeeper(rig.ctx).sweep()
    with rig.runtime.db.read() as conn:
        return health_store.load_all(conn).get("sim", Health())


async def test_a_completion_whose_webhook_fell_in_our_outage_is_excused(
    tmp_path: Path, db_url: str
) -> None:
    async with step_rig(tmp_path, db_url, provider=PROVIDER) as rig:
        await _done_and_read(rig, outage=True)
        health = await _settled(rig)
        assert _verdicts(rig) == ["excused"]
        assert health.missed == 0 and health.misses == 0


async def test_an_outage_during_the_grace_excuses_the_missing_webhook(
    tmp_path: Path, db_url: str
) -> None:
    async with step_rig(tmp_path, db_url, provider=PROVIDER) as rig:
        await _done_and_read(rig, outage=False)
        assert _verdicts(rig) == ["pending"]
        rig.advance(5)
        rig.runtime.db.availability.failed(WriteFailure.LOCKED)  # a retry would be refused
        rig.advance(5)
        rig.runtime.db.availability.succeeded(changed=True)
        health = await _settled(rig)
        assert _verdicts(rig) == ["excused"]
        assert health.missed == 0


async def test_without_an_outage_a_missing_webhook_is_still_a_miss(
    tmp_path: Path, db_url: str
) -> None:
    async with step_rig(tmp_path, db_url, provider=PROVIDER) as rig:
        await _done_and_read(rig, outage=False)
        health = await _settled(rig)
        assert _verdicts(rig) == ["miss"]
        assert health.missed == 1
