"""The console's SVG charts: scales and ticks, marks inside the viewBox and each one seen,
every text escaped, legends, time zones and zero bars said.

The markup is parsed as XML: a text that escaped wrongly would either break the
parse or add an element, and both fail here.
"""

from __future__ import annotations

import itertools
import math
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.console import charts, provider_charts, timeline
from reconciler.core.records import HistoryRecord
from reconciler.core.trust import Health, TrustMode, TrustPolicy, TrustState, Verdict, needs_replay
from reconciler.core.vocabulary import HistoryKind
from reconciler.storage.provider_stats import Hour

NOW = datetime(2026, 12, 1, 10, 30, tzinfo=UTC)
SVG = "{http://www.w3.org/2000/svg}"
HOSTILE = "<script>alert('x')</script> & \"quotes\" </svg><b>"
ELEMENTS = {
    "figure", "figcaption", "details", "summary", "table", "thead", "tbody", "tr", "th", "td",
    "div", "ul", "li", "span",
    f"{SVG}svg", f"{SVG}title", f"{SVG}desc", f"{SVG}g", f"{SVG}line", f"{SVG}rect",
    f"{SVG}text", f"{SVG}circle",
}  # fmt: skip
PROPERTY = settings(deadline=None, max_examples=60)

finite = st.floats(min_value=-1e9, max_value=1e9, allow_nan=False)
moments = st.datetimes(
    min_value=datetime(2020, 1, 1), max_value=datetime(2035, 1, 1), timezones=st.just(UTC)
)
texts = st.text(max_size=40)


def parsed(markup: str) -> ET.Element:
    root = ET.fromstring(markup)
    assert {e.tag for e in root.iter()} <= ELEMENTS
    return root


def svg_of(root: ET.Element) -> ET.Element:
    svg = root.find(f"div/{SVG}svg")
    assert svg is not None
    return svg


def box(svg: ET.Element) -> tuple[float, float]:
    _, _, width, height = (float(v) for v in svg.attrib["viewBox"].split())
    return width, height


def assert_inside(svg: ET.Element) -> None:
    width, height = box(svg)
    for el in svg.iter():
        a = el.attrib
        xs = [a[k] for k in ("x", "x1", "x2", "cx") if k in a]
        ys = [a[k] for k in ("y", "y1", "y2", "cy") if k in a]
        for v in xs:
            assert 0 <= float(v) <= width, (el.tag, a)
        for v in ys:
            assert 0 <= float(v) <= height, (el.tag, a)
        if "width" in a and el.tag == f"{SVG}rect":
            assert float(a["x"]) + float(a["width"]) <= width + 1e-6
            assert float(a["y"]) + float(a["height"]) <= height + 1e-6


@PROPERTY
@given(finite, finite, finite, finite, st.floats(allow_nan=True, allow_infinity=True))
def test_a_scale_never_leaves_its_range(
    d0: float, d1: float, r0: float, r1: float, v: float
) -> None:
    out = charts.Scale(d0, d1, r0, r1)(v)
    assert min(r0, r1) <= out <= max(r0, r1)


@PROPERTY
@given(finite, finite, st.floats(min_value=-1e6, max_value=1e6, allow_nan=False))
def test_a_scale_keeps_order(d0: float, d1: float, a: float) -> None:
    scale = charts.Scale(min(d0, d1), max(d0, d1), 10.0, 500.0)
    assert scale(a) <= scale(a + 1.0)


@PROPERTY
@given(st.floats(min_value=1e-6, max_value=1e9, allow_nan=False))
def test_an_axis_top_covers_the_value_and_little_more(value: float) -> None:
    top = charts.nice_top(value)
    assert value <= top < 1.7 * value
    step = charts.nice_step(value, 4)
    mantissa = step / 10 ** math.floor(math.log10(step))
    assert any(math.isclose(mantissa, f) for f in (1, 2, 5, 10))
    assert math.isclose(top / step, round(top / step))
    assert charts.nice_top(0) == charts.nice_top(-3) == 1.0


@PROPERTY
@given(moments, st.floats(min_value=0, max_value=30 * 86400, allow_nan=False))
def test_time_ticks_are_increasing_round_and_inside(start: datetime, seconds: float) -> None:
    end = start + timedelta(seconds=seconds)
    ticks, fmt = charts.time_ticks(start, end)
    assert ticks == sorted(set(ticks))
    assert all(start <= t <= end for t in ticks)
    assert len(ticks) <= 7
    if seconds >= 1:
        assert ticks and all(t.microsecond == 0 for t in ticks)
    assert fmt in ("%H:%M:%S", "%H:%M", "%m-%d")


bars = st.lists(
    st.tuples(st.integers(0, 23), st.floats(0, 1e6, allow_nan=False), texts), max_size=24
)


@PROPERTY
@given(texts, bars, st.lists(st.tuples(st.integers(-3600, 90000), texts), max_size=4))
def test_bar_panels_stay_inside_and_escape_every_text(
    name: str, values: list[tuple[int, float, str]], moved: list[tuple[int, str]]
) -> None:
    start = NOW.replace(minute=0) - timedelta(hours=23)
    end = start + timedelta(hours=24)
    made = [
        charts.Bar(start + timedelta(hours=h), start + timedelta(hours=h + 1), v, note)
        for h, v, note in values
    ]
    shares = [charts.Bar(b.start, b.end, min(1.0, b.value), b.note) for b in made]
    markers = [charts.Marker(start + timedelta(seconds=s), label, label) for s, label in moved]
    markup = charts.bar_panels(
        "c-1",
        name,
        start,
        end,
        [charts.Panel(name, made), charts.Panel("share", shares, percent=True)],
        markers,
    )
    root = parsed(str(markup))
    svg = svg_of(root)
    assert_inside(svg)
    assert len(svg.findall(f".//{SVG}rect")) == 2 * len(values)
    assert len(svg.findall(f".//{SVG}g")) == len(moved)
    title = svg.find(f"{SVG}title")
    assert title is not None and (title.text or "") == charts.clean(name)
    all_text = "".join(root.itertext())
    for _, _, note in values:
        assert charts.clean(note) in all_text
    # A bar of zero is drawn and labelled; the axis says its zone; the legend its colours.
    zeros = sum(1 for b in made if b.value <= 0) + sum(1 for b in shares if b.value <= 0)
    labels = [t for t in svg.iter(f"{SVG}text") if t.attrib.get("class") == "zero-label"]
    assert len(labels) == zeros
    assert all(float(r.attrib["height"]) >= charts.STUB for r in svg.iter(f"{SVG}rect"))
    assert "UTC" in [t.text for t in svg.iter(f"{SVG}text") if t.attrib.get("class") == "axis-zone"]
    legend = "".join(root.find("ul").itertext()) if root.find("ul") is not None else ""
    assert ("zero" in legend) == (zeros > 0)


def test_hostile_text_is_text_and_no_data_says_so() -> None:
    start = NOW - timedelta(hours=24)
    markup = str(charts.bar_panels("c", HOSTILE, start, NOW, [charts.Panel(HOSTILE, [])]))
    assert "<script>" not in markup and "&lt;script&gt;" in markup
    root = parsed(markup)
    assert svg_of(root).findall(f".//{SVG}rect") == []
    empty = [t.text for t in root.iter(f"{SVG}text") if t.attrib.get("class") == "empty"]
    assert empty == ["no data yet"]
    assert root.find("details") is None  # no figures: no table of them
    caption = root.find("figcaption")
    assert caption is not None and caption.text == f"{HOSTILE}: no data yet"


lane_marks = st.lists(
    st.tuples(st.floats(0, 7 * 86400, allow_nan=False), st.sampled_from(["a", "b", "c"]), texts),
    max_size=40,
)


@PROPERTY
@given(lane_marks, texts)
def test_lanes_draw_each_mark_inside(found: list[tuple[float, str, str]], title: str) -> None:
    marks = [charts.Mark(NOW + timedelta(seconds=s), lane, text) for s, lane, text in found]
    root = parsed(str(charts.lanes("s", title, ["a", "b"], marks)))
    svg = svg_of(root)
    assert_inside(svg)
    circles = svg.findall(f".//{SVG}circle")
    assert len(circles) == sum(1 for m in marks if m.lane in ("a", "b"))
    for lane in ("a", "b"):
        mine = [c for c in circles if f"lane-{lane}" in c.attrib["class"]]
        xs = [float(c.attrib["cx"]) for c in mine]
        assert xs == sorted(xs)  # later events never left of earlier ones
        # Each mark apart from the one before: every event is seen, however close in time.
        room = charts.LANE_WIDTH - charts.RIGHT - charts.LANE_LEFT - 2 * charts.MARK_RADIUS
        gap = min(charts.MARK_GAP, room / max(1, len(xs) - 1))
        assert all(b - a >= gap - 0.11 for a, b in itertools.pairwise(xs))
    if not marks:
        assert "no events yet" in "".join(root.itertext())
    else:
        assert "time (UTC)" in "".join(svg.itertext())


@PROPERTY
@given(
    st.lists(st.floats(-100, 1100, allow_nan=False), max_size=120),
    st.floats(1, 30, allow_nan=False),
)
def test_spread_keeps_order_room_and_distance(xs: list[float], gap: float) -> None:
    low, high = 0.0, 1000.0
    placed = charts.spread(sorted(xs), low, high, gap)
    assert len(placed) == len(xs)
    assert all(low <= x <= high for x in placed)
    step = min(gap, (high - low) / max(1, len(xs) - 1))
    assert all(b - a >= step - 1e-6 for a, b in itertools.pairwise(placed))


def test_events_milliseconds_apart_are_drawn_side_by_side() -> None:
    close = [
        charts.Mark(NOW + timedelta(milliseconds=28 * i), "state", f"change {i}") for i in range(3)
    ]
    far = charts.Mark(NOW + timedelta(minutes=5), "state", "later")
    svg = svg_of(parsed(str(charts.lanes("s", "t", ["state"], [*close, far]))))
    xs = [float(c.attrib["cx"]) for c in svg.iter(f"{SVG}circle")]
    assert len(set(xs)) == 4
    assert xs[1] - xs[0] >= charts.MARK_GAP - 0.1 and xs[2] - xs[1] >= charts.MARK_GAP - 0.1


# --- the providers page's chart: hours and the trust state's transitions ------------------

POLICY = TrustPolicy(mode=TrustMode.ADAPTIVE, trust_after=2, distrust_after_misses=1)


def at(minutes: int) -> datetime:
    return NOW - timedelta(minutes=minutes)


def test_transitions_are_the_counted_verdicts_replayed() -> None:
    verdicts = [
        (Verdict.WEBHOOK_FIRST, at(300), "op_1"),  # 1 of 2
        (Verdict.MISS, at(200), "op_2"),  # learning -> distrusted
        (Verdict.WEBHOOK_FIRST, at(100), "op_3"),
        (Verdict.WEBHOOK_FIRST, at(90), "op_4"),  # -> trusted
        (Verdict.MISS, at(30), "op_5"),  # -> distrusted
    ]
    stored = Health(state=TrustState.DISTRUSTED, changed_at=at(30))
    found = provider_charts.transitions(verdicts, POLICY, stored, at(250))
    assert [(m.at, m.label) for m in found] == [
        (at(200), "distrusted"),
        (at(90), "trusted"),
        (at(30), "distrusted"),
    ]
    # Before the window: not marked; the state stored since then holds.
    assert provider_charts.transitions(verdicts, POLICY, stored, at(150))[0].at == at(90)
    quiet = Health(state=TrustState.DISTRUSTED, changed_at=at(2000))
    assert provider_charts.transitions(verdicts, POLICY, quiet, at(250)) == []
    assert not needs_replay(POLICY, quiet, at(250))


def test_a_replay_that_disagrees_with_the_stored_state_marks_the_stored_change_only() -> None:
    # trust_after was 3 when these were counted: the provider never became trusted.
    verdicts = [(Verdict.WEBHOOK_FIRST, at(m), f"op_{m}") for m in (50, 40)]
    stored = Health(state=TrustState.LEARNING, changed_at=at(45))
    found = provider_charts.transitions(verdicts, POLICY, stored, at(120))
    assert [(m.at, m.label) for m in found] == [(at(45), "learning")]
    off = TrustPolicy(mode=TrustMode.OFF)
    assert provider_charts.transitions(verdicts, off, stored, at(120)) == []


def test_the_provider_chart_draws_the_hours_with_data() -> None:
    window = provider_charts.Window.ending_at(NOW)
    assert len(window.starts) == 24 and window.end == NOW.replace(minute=0) + timedelta(hours=1)
    hours = provider_charts.empty_hours(window)
    hours[20] = Hour(window.starts[20], completed=4, reads=10)
    hours[22] = Hour(
        window.starts[22], verdicts={Verdict.WEBHOOK_FIRST: 3, Verdict.LATE: 1, Verdict.MISS: 0}
    )
    marker = charts.Marker(window.starts[21], "trusted", "trusted")
    root = parsed(str(provider_charts.chart("p-0", HOSTILE, window, hours, [marker])))
    rects = svg_of(root).findall(f".//{SVG}rect")
    assert [r.findtext(f"{SVG}title") for r in rects] == [
        f"{window.starts[20]:%H:%M}-{window.starts[21]:%H:%M} UTC: 2.5 (4 completed)",
        f"{window.starts[22]:%H:%M}-{window.starts[23]:%H:%M} UTC: 75% (4 judged completions)",
    ]
    assert len(svg_of(root).findall(f".//{SVG}g")) == 1


# --- the operation page's story on lanes ---------------------------------------------------


def entry(seq: int, kind: HistoryKind, cause: str, **detail: object) -> HistoryRecord:
    return HistoryRecord(
        id=seq,
        operation_id="op_1",
        seq=seq,
        at=NOW + timedelta(seconds=seq),
        kind=kind.value,
        actor="worker:1",
        from_state=None,
        to_state="create_pending" if kind is HistoryKind.TRANSITION else None,
        cause=cause,
        delay_source=None,
        detail=detail,
        prev_hash="",
        hash="",
    )


def test_the_story_marks_each_entry_on_its_lane() -> None:
    entries = [
        entry(1, HistoryKind.TRANSITION, "test:create"),
        entry(2, HistoryKind.OBSERVATION, "create_response", http_status=202),
        entry(3, HistoryKind.OBSERVATION, "status_read", http_status=503),
        entry(4, HistoryKind.HINT, "webhook:evt_1", event_id="evt_1"),
        entry(5, HistoryKind.ESCALATION, "request_budget_exhausted", reason="budget"),
        entry(6, HistoryKind.DECISION, "decision:extend", action="extend"),
        entry(7, HistoryKind.STEP, "step_failed:callback", step="callback", error=HOSTILE),
        entry(8, HistoryKind.STEP, "step_done:callback", step="callback", attempt=2),
    ]
    marks = timeline.marks(timeline.rows(entries))
    assert [(m.lane, m.bad) for m in marks] == [
        ("state", False),
        ("requests", False),
        ("requests", True),
        ("webhooks", False),
        ("decisions", False),
        ("decisions", False),
        ("callbacks", True),
        ("callbacks", False),
    ]
    root = parsed(str(timeline.chart("op_1", timeline.rows(entries))))
    circles = svg_of(root).findall(f".//{SVG}circle")
    assert len(circles) == len(entries)
    [failed] = [c for c in circles if HOSTILE in (c.findtext(f"{SVG}title") or "")]
    assert failed.attrib["class"] == "mark bad lane-callbacks"
    legend = root.find("ul")
    assert legend is not None
    words = [("".join(li.itertext())) for li in legend]
    assert words == [*timeline.LEGEND.values(), "an error answer or a failed attempt"]
