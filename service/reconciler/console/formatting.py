"""How the console writes times, ages and amounts (Jinja filters; plain text, escaped later)."""

from __future__ import annotations

from datetime import datetime

import jinja2

from reconciler.core.clock import utc
from reconciler.core.escalation import format_duration


def when(value: datetime | None) -> str:
    """``2026-12-01 10:58:03 UTC``, or a dash."""
    return utc(value).strftime("%Y-%m-%d %H:%M:%S UTC") if value is not None else "—"


def clock(value: datetime | None) -> str:
    return utc(value).strftime("%H:%M:%S") if value is not None else "—"


def age(value: datetime | None, now: datetime) -> str:
    if value is None:
        return "—"
    seconds = (now - utc(value)).total_seconds()
    if seconds < 0:
        return "in " + format_duration(-seconds)
    return format_duration(seconds) + " ago"


def seconds(value: float | None) -> str:
    return format_duration(value) if value is not None else "—"


def days(value: float) -> str:
    """A retention window: ``30 days``, ``12 hours`` for a fraction, or ``forever`` for 0."""
    return "forever" if value == 0 else format_duration(value * 86_400)


def number(value: float | int) -> str:
    """An amount as a person writes it: ``900`` for 900.0, ``92.5`` as it is."""
    return str(int(value)) if float(value).is_integer() else str(value)


def install(env: jinja2.Environment) -> None:
    env.filters.update(
        when=when,
        clock=clock,
        seconds=seconds,
        days=days,
        number=number,
    )
    env.globals.update(age=age)
