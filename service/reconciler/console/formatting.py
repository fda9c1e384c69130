"""How the console writes times, ages and amounts (Jinja filters; plain text, escaped later)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

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


def first_line(text: str | None) -> str:
    """The line after the message's fixed title: what an inbox row needs to show."""
    if not text:
        return ""
    lines = [line for line in text.splitlines() if line.strip()]
    for line in lines:
        if line.startswith("Stopped because:"):
            return line.removeprefix("Stopped because:").strip()
    return lines[0] if lines else ""


def as_json(value: Any) -> str:
    """A JSON value shown as text (the template escapes it)."""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def install(env: jinja2.Environment) -> None:
    env.filters.update(
        when=when,
        clock=clock,
        seconds=seconds,
        days=days,
        first_line=first_line,
        as_json=as_json,
    )
    env.globals.update(age=age)
