"""Verifying the service's completion callbacks in an agent's receiver (Standard Webhooks).

Guarantee: ``verify_callback`` returns the event only for a delivery signed with
the secret, stamped within the tolerance and not seen before; anything else
raises ``SignatureRejected`` (a ``reconciler.core.errors.AuthenticationFailed``) with
a machine-readable ``reason``.

How a replay is told from a retry: the service signs every delivery attempt
afresh, with the current time in ``webhook-timestamp``, while ``webhook-id``
stays the same for every attempt about one operation. A *replay* is a delivery
presented again as it was, so its ``(webhook-id, webhook-timestamp)`` pair has
been seen already; a *retry* has a new timestamp and passes. (A retry signed in
the same second as the attempt before it is byte for byte that attempt, and is
refused as one; the service tries again later, with a later timestamp.) Pairs are
remembered for as long as their timestamp is inside the tolerance (after that
the timestamp check refuses them anyway), so the memory stays bounded. Use the
``webhook-id`` (it is ``event.webhook_id``) to process each operation's outcome
once: a retry after a lost ``2xx`` brings the same outcome again.

The default memory lives in this process. A receiver with several processes
passes a ``ReplayGuard`` over storage they share (``SeenStore``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from reconciler.client.model import Operation
from reconciler.core.errors import InvalidRequest, RejectReason, SignatureRejected
from reconciler.core.signatures import DEFAULT_TOLERANCE_SECONDS, StandardWebhooksVerifier
from reconciler.core.strict_json import parse_json

MAX_REMEMBERED = 100_000


class SeenStore(Protocol):
    def remember(self, key: str, expires_at: float) -> bool:
        """Record ``key`` until ``expires_at`` (epoch seconds); False if it was already there."""
        ...


class MemorySeenStore:
    """Keys with expiry times in a dict, pruned as it goes; safe across threads."""

    def __init__(self, limit: int = MAX_REMEMBERED, now: Callable[[], float] = time.time) -> None:
        self._limit, self._now = limit, now
        self._keys: dict[str, float] = {}
        self._lock = threading.Lock()

    def remember(self, key: str, expires_at: float) -> bool:
        with self._lock:
            now = self._now()
            seen = self._keys.pop(key, None)
            if seen is not None and seen > now:
                self._keys[key] = seen
                return False
            if len(self._keys) >= self._limit:
                self._keys = {k: t for k, t in self._keys.items() if t > now}
                while len(self._keys) >= self._limit:
                    # Still full of live keys: the oldest go first (insertion order).
                    del self._keys[next(iter(self._keys))]
            self._keys[key] = expires_at
            return True


class ReplayGuard:
    """Refuses a ``(webhook-id, webhook-timestamp)`` pair that was verified before."""

    def __init__(self, store: SeenStore | None = None) -> None:
        self.store: SeenStore = store if store is not None else MemorySeenStore()

    def first_time(self, webhook_id: str, timestamp: int, tolerance_seconds: int) -> bool:
        # Kept a little past the window so a delivery at its very edge cannot come back.
        return self.store.remember(f"{webhook_id}.{timestamp}", timestamp + tolerance_seconds + 1)


_PROCESS_GUARD = ReplayGuard()


@dataclass(frozen=True)
class CallbackEvent:
    """One verified delivery: ``{"type": "operation.completed", "operation": ...}``."""

    type: str
    webhook_id: str
    timestamp: int
    operation: Operation
    raw: Mapping[str, Any]


class _FixedClock:
    def __init__(self, now: float | None) -> None:
        self._now = now

    def now(self) -> datetime:
        return datetime.fromtimestamp(time.time() if self._now is None else self._now, UTC)

    def monotonic(self) -> float:
        return time.monotonic()


def verify_callback(
    body: bytes,
    headers: Mapping[str, str],
    secret: str,
    *,
    tolerance_seconds: int = DEFAULT_TOLERANCE_SECONDS,
    replay_guard: ReplayGuard | None = None,
    now: float | None = None,
) -> CallbackEvent:
    """Verify one delivery from the service; raises ``SignatureRejected`` on a bad, old or
    replayed signature and ``InvalidRequest`` on a signed body that is not an event.

    ``body`` is the raw request body, ``headers`` its headers (any case),
    ``secret`` the service's ``RECONCILER_CALLBACK_SECRET`` (``whsec_...``; during a
    rotation, several comma-separated). ``now`` (epoch seconds) is for tests.
    """
    lowered = {str(k).lower(): v for k, v in headers.items()}
    secrets = [part.strip() for part in secret.split(",") if part.strip()]
    verifier = StandardWebhooksVerifier(
        secrets, clock=_FixedClock(now), tolerance_seconds=tolerance_seconds
    )
    verified = verifier.verify(lowered, body)
    guard = replay_guard if replay_guard is not None else _PROCESS_GUARD
    # Standard Webhooks verification always yields both (they are signed).
    event_id, timestamp = verified.event_id or "", verified.timestamp or 0
    if not guard.first_time(event_id, timestamp, tolerance_seconds):
        raise SignatureRejected(
            RejectReason.REPLAYED, "this delivery (webhook-id and timestamp) was seen before"
        )
    data = parse_json(body)
    if not isinstance(data, dict) or not isinstance(data.get("type"), str):
        raise InvalidRequest("the callback body is not an event with a 'type'")
    return CallbackEvent(
        type=data["type"],
        webhook_id=event_id,
        timestamp=timestamp,
        operation=Operation.from_json(data.get("operation")),
        raw=data,
    )
