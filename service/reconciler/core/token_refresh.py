"""When a credential that expires is fetched again: pure decisions.

A token is fetched before its first use and again before it expires, never once per
call: ``refresh_at`` is a margin before the end of its life (a tenth of it, at least a
minute, at most half), so a call never goes out with a token about to lapse and a
token that lives an hour is fetched about once an hour. A source that failed is not
asked again at once: ``retry_delay`` spaces the tries (doubling from a second, at most
five minutes), so a token endpoint that is down costs a handful of requests an hour,
not one per call.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from reconciler.core.backoff import BackoffPolicy

MIN_MARGIN_SECONDS = 60.0
MARGIN_FRACTION = 0.1
FIRST_RETRY_SECONDS = 1.0
MAX_RETRY_SECONDS = 300.0
_RETRY = BackoffPolicy(base_seconds=FIRST_RETRY_SECONDS, max_seconds=MAX_RETRY_SECONDS)


def refresh_at(issued_at: datetime, lifetime_seconds: float | None) -> datetime | None:
    """When a token issued at ``issued_at`` that lives ``lifetime_seconds`` is fetched
    again; None when its life is not known (it is used until a 401 says otherwise)."""
    if lifetime_seconds is None:
        return None
    life = max(lifetime_seconds, 0.0)
    margin = min(max(MIN_MARGIN_SECONDS, life * MARGIN_FRACTION), life / 2)
    return issued_at + timedelta(seconds=life - margin)


def retry_delay(failures: int) -> float:
    """Seconds before a source that failed ``failures`` times in a row is asked again."""
    if failures <= 0:
        return 0.0
    return _RETRY.raw(failures - 1)
