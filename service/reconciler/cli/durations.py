"""Durations on the command line: a whole number with a unit (90d, 12h, 30m, 45s)."""

from __future__ import annotations

from datetime import timedelta

from reconciler.core.errors import InvalidRequest
from reconciler.core.strict_json import shown

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_EXPIRY = timedelta(days=3660)


def parse_duration(text: str, what: str) -> timedelta:
    """``90d``, ``12h``, ``30m`` or ``45s``: a unit is required; positive, at most ten years."""
    raw = text.strip().lower()
    unit = _UNITS.get(raw[-1:])
    number = raw[:-1]
    if unit is None or not (number.isascii() and number.isdigit()) or int(number) == 0:
        raise InvalidRequest(
            f"{what} must be a whole number with a unit, s, m, h or d (e.g. 90d), "
            f"got {shown(text)!r}"
        )
    # Compared as a number: a count of days past what a datetime holds would overflow.
    if int(number) * unit > MAX_EXPIRY.total_seconds():
        raise InvalidRequest(f"{what} may be at most {MAX_EXPIRY.days} days")
    return timedelta(seconds=int(number) * unit)
