"""How long a provider asked us to wait, from every header that can say so. Pure.

``Retry-After`` (seconds or an HTTP date), ``retry-after-ms`` (milliseconds, sent by
OpenAI and Anthropic) and a provider's rate-limit reset header (epoch seconds, as
GitHub's ``x-ratelimit-reset``) are folded into one ``Retry-After`` value in whole
seconds, rounded up, the longest of them: every reader of ``Retry-After`` (status,
create, cancel, result) then honours all three as a minimum wait.

GitHub answers a spent primary rate limit with 403 (not only 429) and
``x-ratelimit-remaining: 0``, and a secondary limit with 403 or 429 and
``Retry-After``: such a 403 is a rate limit, not a refused credential.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime

from reconciler.core.backoff import parse_retry_after

REMAINING_HEADER = "x-ratelimit-remaining"
MAX_WAIT_SECONDS = 10**9  # a bound keeps timedelta in range; the deadline caps it anyway


def _digits(value: str | None) -> int | None:
    text = (value or "").strip()
    if not text or not text.isascii() or not text.isdigit() or len(text) > 15:
        return None
    return int(text)


def wait_seconds(
    headers: Mapping[str, str], now: datetime, reset_header: str | None = None
) -> int | None:
    """The longest wait any of the headers asks for, in whole seconds; None when none does.

    ``headers`` must be case-insensitive or lower-case keyed.
    """
    waits: list[float] = []
    after = parse_retry_after(headers.get("retry-after"), now)
    if after is not None:
        waits.append(after.total_seconds())
    millis = _digits(headers.get("retry-after-ms"))
    if millis is not None:
        waits.append(millis / 1000.0)
    if reset_header is not None:
        reset = _digits(headers.get(reset_header))
        if reset is not None:
            waits.append(max(0.0, reset - now.timestamp()))
    if not waits:
        return None
    return min(MAX_WAIT_SECONDS, math.ceil(max(waits)))


def retry_after_value(
    headers: Mapping[str, str], now: datetime, reset_header: str | None = None
) -> str | None:
    """The answer's ``Retry-After`` as readers parse it: the raw header when it is the only
    one that asks (so history shows what was sent), else the folded wait in seconds."""
    raw = headers.get("retry-after")
    others = headers.get("retry-after-ms") is not None or (
        reset_header is not None and headers.get(reset_header) is not None
    )
    if not others:
        return raw
    wait = wait_seconds(headers, now, reset_header)
    return raw if wait is None else str(wait)


def is_rate_limited(status: int | None, headers: Mapping[str, str]) -> bool:
    """A 429, or a 403 that says the rate limit is spent (remaining 0, or a Retry-After)."""
    if status == 429:
        return True
    if status != 403:
        return False
    return _digits(headers.get(REMAINING_HEADER)) == 0 or headers.get("retry-after") is not None
