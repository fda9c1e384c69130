"""A database outage is logged a few times, not at every tick, delivery and request.

Before: during a 60 s PostgreSQL outage each replica logged about 10 warnings a second
("claim failed: the database is unreachable", "webhook trust sweep skipped", once per
tick; one line per refused webhook batch and per 503 answer). Now each kind of failure
is one line when it starts, one a minute while it lasts (with how many it did not log),
and one when it ends (``logs.OutageLog``).

The outage is simulated where the database reports it: every read and write raises
``StorageUnavailable`` after telling ``Availability``, as ``Database`` does on a driver
error; the worker, the trust sweep, the webhook committer and the API are the real ones.
The clock is a ``ManualClock``: 150 s of ticks every 0.2 s take no time to pass.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from reconciler.app import create_app
from reconciler.core.errors import StorageUnavailable
from reconciler.engine.trust import TrustKeeper
from reconciler.storage.availability import WriteFailure
from reconciler.storage.database import Database
from reconciler.storage.tokens import create_token
from reconciler.storage.webhook_events import IncomingEvent
from tests.support.steps import StepRig, step_rig

pytestmark = pytest.mark.anyio

OUTAGE_SECONDS = 150.0
TICK_SECONDS = 0.2
TICKS = round(OUTAGE_SECONDS / TICK_SECONDS)
KINDS = {
    "claims": "claim failed: the database is unreachable",
    "webhook trust sweeps": "webhook trust sweep skipped: the database is unreachable",
    "webhook batches": (
        "webhook batch of 1 not stored (the database is unreachable); answered 503 with Retry-After"
    ),
    "API requests": "request failed: the database is unavailable; retry later",
}


@contextmanager
def outage(db: Database, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every read and write of ``db`` fails as an unreachable server's would."""

    def down(*_: Any, **__: Any) -> Any:
        db.availability.failed(WriteFailure.UNREACHABLE)
        raise StorageUnavailable("the database is unavailable; retry later")

    async def down_async(*args: Any, **kw: Any) -> Any:
        return down(*args, **kw)

    with monkeypatch.context() as patch:
        for name in ("run", "run_write", "run_joined"):
            patch.setattr(db, name, down_async)
        yield


def _lines(caplog: pytest.LogCaptureFixture) -> dict[str, list[logging.LogRecord]]:
    by_kind: dict[str, list[logging.LogRecord]] = {kind: [] for kind in KINDS}
    for record in caplog.records:
        kind = getattr(record, "outage", None)
        if kind in by_kind:
            by_kind[kind].append(record)
    return by_kind


async def _one_of_each(rig: StepRig, trust: TrustKeeper, api: httpx.AsyncClient, n: int) -> None:
    await rig.worker.tick()
    await trust.sweep()
    event = IncomingEvent("sim", f"evt_{n}", "job_nobody", "0" * 64, "{}", datetime.now(UTC))
    with suppress(StorageUnavailable):
        await rig.runtime.webhooks.submit(event)
    await api.get("/v1/operations")


async def test_an_outage_is_logged_at_its_start_each_minute_and_at_its_end(
    tmp_path: Path, db_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, logger="reconciler")
    async with step_rig(tmp_path, db_url) as rig:
        rt = rig.runtime
        with rt.db.write() as conn:
            token = create_token(conn, "agent-outage", "agent", rig.clock.now())
        trust = TrustKeeper(rig.ctx)
        app = create_app(rt, background=False)  # the routes and error handlers, no lifespan
        transport = httpx.ASGITransport(app=app)
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(
            transport=transport, base_url="http://svc", headers=headers
        ) as api:
            assert (await api.get("/v1/operations")).status_code == 200  # token now cached
            caplog.clear()
            with outage(rt.db, monkeypatch):
                for n in range(TICKS):
                    await _one_of_each(rig, trust, api, n)
                    rig.advance(TICK_SECONDS)
                during = _lines(caplog)
                refused = await api.get("/v1/operations")
                assert refused.status_code == 503
            await _one_of_each(rig, trust, api, TICKS)  # the first turn after the outage
        after = _lines(caplog)

    for kind, first in KINDS.items():
        lines = after[kind]
        levels = Counter(r.levelno for r in lines)
        # Started, at 60 s and at 120 s, ended: four lines for 750 failures.
        assert levels == {logging.WARNING: 3, logging.INFO: 1}, (kind, lines)
        assert [r.levelno for r in during[kind]] == [logging.WARNING] * 3
        start, *minutes, end = lines
        assert start.getMessage() == first
        for line in minutes:
            assert line.getMessage().startswith(first + " (failing for ")
            assert "not logged since the last line" in line.getMessage()
        assert end.levelno == logging.INFO and end.getMessage().startswith(f"{kind} work again")
        # Every failure is accounted for: logged, or counted as not logged in a later line.
        failures = end.__dict__["failures"]
        skipped = sum(r.__dict__.get("skipped", 0) for r in lines)
        assert failures == TICKS + (1 if kind == "API requests" else 0)
        assert failures == skipped + 3, (kind, failures, skipped)
