"""Small server-rendered SVG charts: values in, escaped markup out.

Pure: no I/O, no clock. Every text that reaches the markup (provider names,
causes, story lines) goes through ``markupsafe.escape``; every coordinate comes
from a clamped ``Scale``, so no mark leaves the viewBox. Each chart is a
``<figure>`` holding the SVG (with ``<title>`` and ``<desc>`` for screen
readers), a legend of its colours, a one-line caption and the same figures as a
table: the text fallback. Time axes say their zone (UTC); every event is a mark
of its own, even events a few milliseconds apart (``spread``); a bar of zero is
drawn and labelled. Styling is by class names only (the console's stylesheet),
since the Content-Security-Policy allows no inline style.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from markupsafe import Markup, escape

# Tick steps for a time axis, in seconds: the first one that gives few enough ticks.
TIME_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200)
DAY = 86400


@dataclass(frozen=True)
class Scale:
    """A linear map from a domain onto a range of pixels, clamped to the range."""

    d0: float
    d1: float
    r0: float
    r1: float

    def __call__(self, value: float) -> float:
        low, high = min(self.r0, self.r1), max(self.r0, self.r1)
        if not math.isfinite(value):
            return low if value < 0 else high if value > 0 else (low + high) / 2
        span = self.d1 - self.d0
        if span == 0 or not math.isfinite(span):
            return (self.r0 + self.r1) / 2
        out = self.r0 + (value - self.d0) / span * (self.r1 - self.r0)
        if not math.isfinite(out):
            out = high if (value - self.d0) * (self.r1 - self.r0) * span > 0 else low
        return min(high, max(low, out))


def nice_step(span: float, count: int) -> float:
    """A step of 1, 2 or 5 times a power of ten that cuts ``span`` into about ``count``."""
    raw = span / max(1, count)
    if raw <= 0 or not math.isfinite(raw):
        return 1.0
    power = 10.0 ** math.floor(math.log10(raw))
    for factor in (1.0, 2.0, 5.0):
        if raw <= factor * power:
            return factor * power
    return 10.0 * power


def nice_top(value: float, count: int = 4) -> float:
    """The smallest round number at or above ``value`` (an axis top); 1 for nothing."""
    if value <= 0 or not math.isfinite(value):
        return 1.0
    step = nice_step(value, count)
    top = math.ceil(value / step) * step
    return top if top >= value else top + step


def time_ticks(start: datetime, end: datetime, count: int = 6) -> tuple[list[datetime], str]:
    """Moments on round UTC boundaries inside ``[start, end]``, and the label format."""
    span = (end - start).total_seconds()
    if span <= 0:
        return [start], "%H:%M:%S"
    step = next((s for s in TIME_STEPS if span / s <= count), DAY * math.ceil(span / DAY / count))
    epoch = start.timestamp()
    first = math.ceil(epoch / step) * step
    ticks = []
    at = first
    while at <= end.timestamp():
        ticks.append(datetime.fromtimestamp(at, UTC))
        at += step
    fmt = "%H:%M:%S" if step < 60 else "%H:%M" if step < DAY else "%m-%d"
    return ticks, fmt


def clean(text: str) -> str:
    """``text`` without control characters (no markup may carry them), spaces instead."""
    return "".join(c if c.isprintable() else " " for c in text)


def _esc(text: str) -> str:
    return str(escape(clean(text)))


def _num(value: float) -> str:
    """A coordinate as markup text: short, never an exponent."""
    return f"{value:.1f}".rstrip("0").rstrip(".") if value % 1 else str(int(value))


def _text(x: float, y: float, text: str, cls: str, anchor: str = "middle") -> str:
    return (
        f'<text x="{_num(x)}" y="{_num(y)}" class="{cls}" text-anchor="{anchor}">'
        f"{_esc(text)}</text>"
    )


def _head(cls: str, width: int, height: int, title: str, desc: str, ident: str) -> str:
    return (
        f'<svg class="chart {cls}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-labelledby="{_esc(ident)}-title {_esc(ident)}-desc" '
        f'xmlns="http://www.w3.org/2000/svg">'
        f'<title id="{_esc(ident)}-title">{_esc(title)}</title>'
        f'<desc id="{_esc(ident)}-desc">{_esc(desc)}</desc>'
    )


def _table(head: Sequence[str], rows: Sequence[Sequence[str]], summary: str) -> str:
    if not rows:
        return ""
    cells = "".join(f"<th>{_esc(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{_esc(c)}</td>" for c in r) + "</tr>" for r in rows)
    return (
        f'<details class="chart-figures"><summary>{_esc(summary)}</summary>'
        f"<table><thead><tr>{cells}</tr></thead><tbody>{body}</tbody></table></details>"
    )


def _legend(items: Sequence[tuple[str, str]]) -> str:
    """``(swatch classes, words)`` as a list under the chart."""
    entries = "".join(
        f'<li><span class="swatch {_esc(cls)}"></span>{_esc(words)}</li>' for cls, words in items
    )
    return f'<ul class="chart-legend">{entries}</ul>' if items else ""


def _figure(svg: str, caption: str, table: str, cls: str, legend: str = "") -> Markup:
    # The drawing scrolls on its own when the screen is narrower than it can be read at.
    return Markup(
        f'<figure class="chart-figure {cls}"><div class="chart-scroll">{svg}</div>{legend}'
        f"<figcaption>{_esc(caption)}</figcaption>{table}</figure>"
    )


# --- bars over hours, with moments marked --------------------------------------------------


@dataclass(frozen=True)
class Bar:
    start: datetime
    end: datetime
    value: float
    note: str  # what the bar stands for, for its tooltip and the table ("3 completed")


@dataclass(frozen=True)
class Panel:
    label: str  # "status reads per completed operation"
    bars: Sequence[Bar]
    percent: bool = False  # values are shares in [0, 1], the axis is 0-100 %

    def shown(self, value: float) -> str:
        return f"{100 * value:.0f}%" if self.percent else f"{value:.1f}"


@dataclass(frozen=True)
class Marker:
    at: datetime
    label: str  # "distrusted"
    kind: str  # a class name suffix: the new state


BAR_WIDTH = 720
PANEL_HEIGHT = 70
PANEL_GAP = 34
TOP = 40
LEFT = 44
RIGHT = 24
AXIS = 22
STUB = 4.0  # the height of a bar of zero: drawn, and labelled
TIME_ZONE = "UTC"


def bar_panels(
    ident: str,
    title: str,
    start: datetime,
    end: datetime,
    panels: Sequence[Panel],
    markers: Sequence[Marker] = (),
    empty: str = "no data yet",
) -> Markup:
    """Panels of bars on one time axis from ``start`` to ``end``, markers across them all."""
    height = TOP + len(panels) * (PANEL_HEIGHT + PANEL_GAP) - PANEL_GAP + AXIS
    x = Scale(start.timestamp(), end.timestamp(), LEFT, BAR_WIDTH - RIGHT)
    has_data = any(p.bars for p in panels)
    desc = "; ".join(
        f"{p.label}: {len(p.bars)} hour(s) with data" if p.bars else f"{p.label}: {empty}"
        for p in panels
    )
    if markers:
        desc += "; marked: " + ", ".join(f"{m.label} at {m.at:%H:%M}" for m in markers)
    parts = [_head("bars", BAR_WIDTH, height, title, desc, ident)]
    for index, panel in enumerate(panels):
        top = TOP + index * (PANEL_HEIGHT + PANEL_GAP)
        parts.append(_panel(panel, x, top, empty))
    ticks, fmt = time_ticks(start, end)
    axis_y = height - AXIS
    parts.append(
        f'<line class="axis" x1="{LEFT}" x2="{BAR_WIDTH - RIGHT}" y1="{axis_y}" y2="{axis_y}"/>'
    )
    parts.append(_text(LEFT - 5, axis_y + 15, TIME_ZONE, "axis-zone", "end"))
    for tick in ticks:
        tx = x(tick.timestamp())
        parts.append(_text(tx, axis_y + 15, f"{tick:{fmt}}", "tick-label"))
    for marker in markers:
        mx = x(marker.at.timestamp())
        parts.append(
            f'<g class="marker marker-{_slug(marker.kind)}"><title>'
            f"{_esc(marker.label)} at {marker.at:%Y-%m-%d %H:%M:%S} UTC</title>"
            f'<line x1="{_num(mx)}" x2="{_num(mx)}" y1="{TOP - 22}" y2="{axis_y}"/>'
            + _text(mx, TOP - 26, marker.label, "marker-label")
            + "</g>"
        )
    parts.append("</svg>")
    caption = desc if has_data else f"{title}: {empty}"
    rows = [
        [f"{b.start:%H:%M}-{b.end:%H:%M}", p.label, p.shown(b.value), b.note]
        for p in panels
        for b in p.bars
    ]
    rows += [[f"{m.at:%H:%M:%S}", "trust state", m.label, ""] for m in markers]
    table = _table(("Hour (UTC)", "Figure", "Value", "From"), rows, "Figures as a table")
    legend = [("swatch-bar", "a figure of that hour")]
    if any(b.value <= 0 for p in panels for b in p.bars):
        legend.append(("swatch-bar swatch-zero", "zero"))
    for kind in sorted({m.kind for m in markers}):
        legend.append((f"swatch-line swatch-{_slug(kind)}", f"trust became {kind}"))
    return _figure("".join(parts), caption, table, "chart-bars", _legend(legend))


def _panel(panel: Panel, x: Scale, top: float, empty: str) -> str:
    bottom = top + PANEL_HEIGHT
    peak = max((b.value for b in panel.bars), default=0.0)
    high = 1.0 if panel.percent else nice_top(peak)
    y = Scale(0.0, high, bottom, top)
    out = [_text(LEFT, top - 8, panel.label, "panel-label", "start")]
    for tick in (0.0, high / 2, high):
        ty = y(tick)
        out.append(
            f'<line class="grid" x1="{LEFT}" x2="{BAR_WIDTH - RIGHT}" '
            f'y1="{_num(ty)}" y2="{_num(ty)}"/>'
        )
        out.append(_text(LEFT - 5, ty + 4, panel.shown(tick), "tick-label", "end"))
    if not panel.bars:
        out.append(_text((LEFT + BAR_WIDTH - RIGHT) / 2, top + PANEL_HEIGHT / 2, empty, "empty"))
    for bar in panel.bars:
        x0, x1 = x(bar.start.timestamp()), x(bar.end.timestamp())
        # Any bar is at least a stub: a share of 0 % is a figure, not a missing hour.
        y0 = min(y(bar.value), bottom - STUB)
        width = max(1.0, x1 - x0 - 2)
        cls = "bar zero" if bar.value <= 0 else "bar"
        out.append(
            f'<rect class="{cls}" x="{_num(x0 + 1)}" y="{_num(y0)}" width="{_num(width)}" '
            f'height="{_num(max(0.0, bottom - y0))}"><title>'
            f"{bar.start:%H:%M}-{bar.end:%H:%M} UTC: {_esc(panel.shown(bar.value))} "
            f"({_esc(bar.note)})</title></rect>"
        )
        if bar.value <= 0:
            out.append(_text(x0 + 1 + width / 2, y0 - 3, panel.shown(0.0), "zero-label"))
    return "".join(out)


# --- events on lanes -----------------------------------------------------------------------


@dataclass(frozen=True)
class Mark:
    at: datetime
    lane: str
    text: str  # the story's line, for the tooltip and the table
    bad: bool = False  # an error answer, a failed attempt


LANE_WIDTH = 960
LANE_HEIGHT = 26
LANE_LEFT = 120
MARK_RADIUS = 5
MARK_GAP = 2 * MARK_RADIUS + 1  # centres this far apart: marks side by side, not on top


def spread(xs: Sequence[float], low: float, high: float, gap: float = MARK_GAP) -> list[float]:
    """Positions for marks at ``xs`` (in order) inside ``[low, high]``, each at least ``gap``
    after the one before, or as far apart as the room allows.

    Events closer in time than a mark is wide (three state changes 28 ms apart) are
    drawn side by side: each is seen and can be pointed at, and the order stays.
    """
    if len(xs) < 2:
        return [min(high, max(low, x)) for x in xs]
    step = min(gap, (high - low) / (len(xs) - 1))
    out = [min(high, max(low, x)) for x in xs]
    for i in range(1, len(out)):
        out[i] = max(out[i], out[i - 1] + step)
    out[-1] = min(out[-1], high)
    for i in range(len(out) - 2, -1, -1):
        out[i] = min(out[i], out[i + 1] - step)
    return [min(high, max(low, x)) for x in out]


def lanes(
    ident: str,
    title: str,
    names: Sequence[str],
    marks: Sequence[Mark],
    empty: str = "no events yet",
    colours: Sequence[tuple[str, str]] = (),
) -> Markup:
    """Each mark as a dot on its lane, every lane on one time axis; ``colours`` is the
    legend's ``(lane, words)`` for each lane drawn in a colour of its own."""
    height = TOP + len(names) * LANE_HEIGHT + AXIS
    if marks:
        start, end = min(m.at for m in marks), max(m.at for m in marks)
        pad = max((end - start) / 40, timedelta(seconds=1))
        start, end = start - pad, end + pad
    else:
        start = end = datetime.fromtimestamp(0, UTC)
    low, high = LANE_LEFT + MARK_RADIUS, LANE_WIDTH - RIGHT - MARK_RADIUS
    x = Scale(start.timestamp(), end.timestamp(), low, high)
    counts = {name: sum(1 for m in marks if m.lane == name) for name in names}
    desc = ", ".join(f"{name}: {n}" for name, n in counts.items()) if marks else empty
    if marks:
        first, last = start + pad, end - pad
        desc = f"{len(marks)} events from {first:%H:%M:%S} to {last:%H:%M:%S} UTC; {desc}"
    parts = [_head("lanes", LANE_WIDTH, height, title, desc, ident)]
    row = {name: TOP + i * LANE_HEIGHT + LANE_HEIGHT / 2 for i, name in enumerate(names)}
    for name, ly in row.items():
        parts.append(
            f'<line class="lane" x1="{LANE_LEFT}" x2="{LANE_WIDTH - RIGHT}" '
            f'y1="{_num(ly)}" y2="{_num(ly)}"/>'
        )
        parts.append(_text(LANE_LEFT - 8, ly + 4, name, "lane-label", "end"))
    axis_y = height - AXIS
    parts.append(
        f'<line class="axis" x1="{LANE_LEFT}" x2="{LANE_WIDTH - RIGHT}" '
        f'y1="{axis_y}" y2="{axis_y}"/>'
    )
    if marks:
        parts.append(_text(LANE_LEFT - 8, axis_y + 15, f"time ({TIME_ZONE})", "axis-zone", "end"))
        ticks, fmt = time_ticks(start, end)
        for tick in ticks:
            parts.append(_text(x(tick.timestamp()), axis_y + 15, f"{tick:{fmt}}", "tick-label"))
    else:
        parts.append(_text((LANE_LEFT + LANE_WIDTH) / 2, TOP - 10, empty, "empty"))
    for name in names:
        mine = sorted((m for m in marks if m.lane == name), key=lambda m: m.at)
        placed = spread([x(m.at.timestamp()) for m in mine], low, high)
        for mark, cx in zip(mine, placed, strict=True):
            cls = "mark bad" if mark.bad else "mark"
            parts.append(
                f'<circle class="{cls} lane-{_slug(mark.lane)}" '
                f'cx="{_num(cx)}" cy="{_num(row[name])}" r="{MARK_RADIUS}">'
                f"<title>{_clock_ms(mark.at)} UTC {_esc(mark.text)}</title></circle>"
            )
    parts.append("</svg>")
    caption = desc if marks else f"{title}: {empty}"
    legend = [(f"swatch-{_slug(lane)}", words) for lane, words in colours]
    if any(m.bad for m in marks):
        legend.append(("swatch-bad", "an error answer or a failed attempt"))
    return _figure("".join(parts), caption, "", "chart-lanes", _legend(legend))


def _clock_ms(at: datetime) -> str:
    return f"{at:%H:%M:%S}.{at.microsecond // 1000:03d}"


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.lower())
