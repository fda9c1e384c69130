"""What the engine takes from the service that runs it, and nothing more.

The engine never imports the runtime or a door: whoever runs it (``reconciler.app``,
a test, a benchmark) hands it something with these members. ``reconciler.runtime.Runtime``
has them all; mypy checks that where the app hands it over.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Protocol

from reconciler.config import CallbackSettings, HookSpec, RetentionSettings, SchedulerSettings
from reconciler.core.clock import Clock
from reconciler.engine.wakeups import Notifier
from reconciler.metrics import Metrics
from reconciler.outbound.ssrf import AllowList
from reconciler.providers.adapter import ProviderAdapter
from reconciler.providers.spec import ProviderSpec
from reconciler.storage.database import Database
from reconciler.storage.journal import Journal
from reconciler.tracing import Tracing


class EngineSettings(Protocol):
    """The settings the engine reads: the scheduler, callbacks, hooks and retention."""

    @property
    def scheduler(self) -> SchedulerSettings: ...

    @property
    def callbacks(self) -> CallbackSettings: ...

    @property
    def hooks(self) -> Sequence[str | HookSpec]: ...

    @property
    def retention(self) -> RetentionSettings: ...

    @property
    def source(self) -> str:
        """Where the settings came from, for messages about a hook."""
        ...


class EngineDeps(Protocol):
    @property
    def settings(self) -> EngineSettings: ...

    @property
    def db(self) -> Database: ...

    @property
    def journal(self) -> Journal: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def rng(self) -> random.Random: ...

    @property
    def providers(self) -> Mapping[str, ProviderSpec]: ...

    @property
    def notifier(self) -> Notifier: ...

    @property
    def metrics(self) -> Metrics: ...

    @property
    def worker_id(self) -> str:
        """The lease owner's name for this process."""
        ...

    @property
    def callback_key(self) -> bytes | None:
        """The key callbacks are signed with; None: this service sends none."""
        ...

    @property
    def allow_hosts(self) -> AllowList:
        """The callback hosts allowed past the SSRF guard."""
        ...

    @property
    def tracing(self) -> Tracing:
        """The spans of each operation's story (a no-op when telemetry is off)."""
        ...

    def adapter(self, provider: str) -> ProviderAdapter:
        """The provider's adapter, one per provider for the process."""
        ...
