"""The in-process world (``tests/support/world.py``) set up for webhook trust.

The default polling schedule with a small ``trust_after``, so trust is earned in a few jobs,
and creates that send no ``running`` webhook, so each completion is webhook-first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reconciler.core.clock import ManualClock
from reconciler.demo.sim import SimState
from tests.support.world import START, World, open_world

__all__ = ["POLLING", "START", "Rig", "open_rig"]

POLLING: dict[str, Any] = {
    "base_delay_seconds": 5,
    "max_delay_seconds": 120,
    "jitter_floor": 0.5,
    "deadline_seconds": 2400,
    "max_status_requests": 40,
    "max_transport_failures": 3,
    "trust_after": 3,
    "webhook_grace_seconds": 30,
}

Rig = World


async def open_rig(
    tmp_path: Path,
    db_url: str,
    *,
    polling: dict[str, Any] | None = None,
    clock: ManualClock | None = None,
    sim: SimState | None = None,
    seed: int = 7,
    provider_concurrency: int = 16,
    tokens: tuple[str, str] | None = None,
) -> World:
    """The service on ``db_url`` and the sim, both on ``clock`` (shared with a second rig)."""
    return await open_world(
        tmp_path,
        db_url,
        polling={**POLLING, **(polling or {})},
        clock=clock,
        sim=sim,
        seed=seed,
        provider_concurrency=provider_concurrency,
        tokens=tokens,
        request_defaults={"webhook_on_running": False},
    )
