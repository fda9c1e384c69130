"""Everything a running service holds, built once from the settings.

Routes, the worker and the CLI take what they need from here; tests build
one with a ``ManualClock`` and a seeded ``Random`` instead of the defaults.
"""

from __future__ import annotations

import os
import random
import socket
from dataclasses import dataclass, field

from reconciler.clock import Clock, SystemClock
from reconciler.config import Settings
from reconciler.db import Database
from reconciler.ids import worker_id
from reconciler.journal import Journal


@dataclass
class Runtime:
    settings: Settings
    db: Database
    journal: Journal
    clock: Clock = field(default_factory=SystemClock)
    rng: random.Random = field(default_factory=random.Random)
    worker_id: str = field(default_factory=lambda: worker_id(socket.gethostname(), os.getpid()))

    @classmethod
    def build(
        cls,
        settings: Settings,
        *,
        clock: Clock | None = None,
        rng: random.Random | None = None,
    ) -> Runtime:
        key = settings.audit_key()
        return cls(
            settings=settings,
            db=Database(settings.database_url),
            journal=Journal(key=key.reveal().encode("utf-8") if key else None),
            clock=clock or SystemClock(),
            rng=rng or random.Random(),
        )

    async def start(self) -> None:
        """Open clients and start background work (the worker, listeners)."""

    async def stop(self) -> None:
        """Stop background work and close clients; the database goes last."""
        self.db.dispose()
