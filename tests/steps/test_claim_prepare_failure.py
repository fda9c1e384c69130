"""A claim whose step preparation fails keeps nothing of it and claims again plainly.

The claim prepares each claimed operation's first write in its own transaction. When one
preparation raises (a defect in a step), that transaction is given up whole: no lease of
it and no half-prepared step remain, the claim is made again without preparing, and the
step then runs on its own and reaches its usual end.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from tests.support.steps import step_rig

pytestmark = pytest.mark.anyio


async def test_a_failed_preparation_is_claimed_again_plainly(
    tmp_path: Path, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with step_rig(tmp_path, db_url) as rig:
        op_id = rig.submit()
        step = rig.step_for(rig.row(op_id))
        assert hasattr(step, "prepare")
        real = step.prepare
        failed: list[str] = []

        def failing_once(conn: Any, op: Any, now: Any) -> Any:
            if not failed:
                failed.append(op.id)
                raise RuntimeError("a defect in the step's preparation")
            return real(conn, op, now)

        step.prepare = failing_once  # type: ignore[method-assign]
        writes = rig.runtime.db.write_transactions
        with caplog.at_level(logging.ERROR, logger="reconciler.engine.worker"):
            assert await rig.tick() == 1
        assert failed == [op_id]
        assert "preparing a claimed step failed" in caplog.text
        # The prepared claim was given up and the plain one taken: two claim transactions.
        assert rig.runtime.db.write_transactions - writes >= 2
        assert rig.row(op_id).state == "observing", rig.causes(op_id)
