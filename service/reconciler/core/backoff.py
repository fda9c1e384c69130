"""Capped exponential backoff with a jitter floor, and Retry-After parsing.

See docs/design.md#next-read.

Pure: the caller passes the attempt number, the policy and a ``random.Random``.
Used by the poller, the create reconciliation and callback delivery alike.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from email.utils import parsedate_to_datetime

from reconciler.core.clock import utc

MAX_EXPONENT = 62  # 2**attempt beyond this only overflows; the cap applies long before


@dataclass(frozen=True)
class BackoffPolicy:
    base_seconds: float = 5.0
    max_seconds: float = 120.0
    jitter_floor: float = 0.5  # the delay is drawn from [floor * raw, raw]

    def raw(self, attempt: int) -> float:
        factor = float(2 ** min(max(attempt, 0), MAX_EXPONENT))
        return min(self.max_seconds, self.base_seconds * factor)

    def delay(self, attempt: int, rng: random.Random) -> float:
        raw = self.raw(attempt)
        return rng.uniform(self.jitter_floor * raw, raw)


def parse_retry_after(value: str | None, now: datetime) -> timedelta | None:
    """``Retry-After`` as delay-seconds or an HTTP-date (RFC 9110); None if absent or invalid.

    A date in the past means "no wait"; a negative or non-numeric value is invalid.
    """
    if value is None:
        return None
    text = value.strip()
    if not text:
        return None
    if text.isascii() and text.isdigit():  # str.isdigit() also accepts '²' and '٣'
        return timedelta(seconds=int(text)) if len(text) <= 10 else None
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when is None:
        return None
    return max(timedelta(0), utc(when) - now)
