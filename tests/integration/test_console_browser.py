"""The operator console in a real browser: Debian's chromium, driven by Playwright.

One browser per module and one service per backend. An operator signs in,
sees an escalation arrive in the inbox without losing what they were typing,
opens it, decides ``extend`` with a note through the button and its confirmation,
sees the confirmation at once (and not again on reload), and watches the
operation resume and finish; an agent token is refused; a POST without the CSRF
token changes nothing; provider text with HTML in it renders as text; every page
fits a 390 px phone and a 1440 px desktop without sideways scrolling, with
readable contrast, a skip link and the current page marked; the charts render
with every mark, a legend and their time zone under the console's CSP.

Screenshots of each page at both widths are taken in the test's directory; with
``RECONCILER_DOC_SCREENSHOTS=1`` they are written to ``docs/console/`` too, which
is how the pictures in docs/operations.md are made (``tests/support/screenshots.py``).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from reconciler.core.states import State
from tests.support import loopback
from tests.support.chart_data import TRANSITIONS, VERDICTS, completed_hours, long_story
from tests.support.factories import insert_operation
from tests.support.screenshots import DOCS, SHOTS, SIGNATURE, WIDTHS, small_png
from tests.support.stack import QUICK_POLLING, Stack, running_stack
from tests.support.waiting import wait_until

playwright = pytest.importorskip("playwright.sync_api")

CHROMIUM = Path("/usr/bin/chromium")
LAUNCH_ARGS = [
    "--no-sandbox",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-gpu",
    "--no-first-run",
    "--disable-sync",
]
WAIT_MS = 20_000
NEVER = {"scenario": "never_finishes", "webhooks": "never"}
DENIED = {**NEVER, "auth_fault": 403, "auth_fault_after": 1}
HTML_ERROR = '<img src=x onerror="alert(1)"><b>quota</b> exceeded'
HTML_META = "<script>alert('meta')</script>"
DESKTOP, PHONE = WIDTHS["desktop"], WIDTHS["phone"]
NARROWEST = {"width": 360, "height": 740}  # the narrowest phone the console is made for


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        if os.environ.get("CI") == "true":
            pytest.fail("/usr/bin/chromium is missing; .ci/run installs Debian's chromium")
        pytest.skip("Debian's chromium is not installed (apt-get install -y chromium)")
    playwright.expect.set_options(timeout=WAIT_MS)
    with playwright.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=LAUNCH_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, module_db_url: str) -> Iterator[Stack]:
    provider = {"polling": QUICK_POLLING}
    with running_stack(
        tmp_path_factory.mktemp("console-browser"), module_db_url, provider=provider
    ) as s:
        yield s


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport=DESKTOP)
    context.set_default_timeout(WAIT_MS)
    try:
        yield context.new_page()
    finally:
        context.close()


def sign_in(page: Any, stack: Stack, token: str) -> None:
    page.goto(f"{stack.url}/console")
    assert "/console/sign-in" in page.url  # no session yet: sent to sign in
    page.fill("#token", token)
    page.click("#sign-in")


def escalated(stack: Stack, request: dict[str, Any], **fields: Any) -> dict[str, Any]:
    created = stack.create(request, **fields)
    assert created.status_code == 202, created.text
    op = stack.wait_state(created.json()["id"], {State.ESCALATED.value}, timeout=20)
    assert op["state"] == State.ESCALATED.value, op
    return op


def shoot(page: Any, tmp_path: Path, name: str, part: Any = None) -> None:
    """What the screen shows (as an operator first sees it), or only ``part`` (a locator),
    as a PNG; for docs/ with a palette, which keeps the pictures small."""
    path = tmp_path / name
    (part or page).screenshot(path=str(path), animations="disabled")
    assert path.read_bytes()[:8] == SIGNATURE
    if name in SHOTS and os.environ.get("RECONCILER_DOC_SCREENSHOTS") == "1":
        DOCS.mkdir(parents=True, exist_ok=True)
        (DOCS / name).write_bytes(small_png(page, path.read_bytes()))


# Every text's colour against the first opaque background behind it (WCAG's ratio); SVG
# text is left out (its figures are also the chart's table, which is checked).
CONTRAST = """() => {
  const rgba = s => { const v = s.match(/[\\d.]+/g).map(Number);
    return v.length === 3 ? [...v, 1] : v; };
  const lum = ([r, g, b]) => [r, g, b].map(c => { c /= 255;
    return c <= 0.03928 ? c / 12.92 : Math.pow((c + 0.055) / 1.055, 2.4); })
    .reduce((sum, c, i) => sum + c * [0.2126, 0.7152, 0.0722][i], 0);
  const behind = el => { for (let e = el; e; e = e.parentElement) {
    const c = rgba(getComputedStyle(e).backgroundColor); if (c[3] > 0) return c; }
    return [255, 255, 255, 1]; };
  const low = [], seen = new Set();
  const walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let n = walk.nextNode(); n; n = walk.nextNode()) {
    const el = n.parentElement;
    if (!n.textContent.trim() || seen.has(el) || el.closest("svg")) continue;
    seen.add(el);
    const box = el.getBoundingClientRect();
    if (box.width < 2 || box.height < 2) continue;
    const a = lum(rgba(getComputedStyle(el).color)), b = lum(behind(el));
    const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
    const text = n.textContent.trim().slice(0, 30);
    if (ratio < 4.5) low.push(`${el.tagName}.${el.className} "${text}" ${ratio.toFixed(2)}`);
  }
  return low;
}"""


def check_page(page: Any) -> None:
    """No sideways scroll at this width, and every text readable against its background."""
    wide, view = page.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")
    assert wide <= view, f"{page.url} is {wide} px wide in a {view} px window"
    assert page.evaluate(CONTRAST) == [], page.url


def test_operator_decides_extend_and_the_operation_resumes(page: Any, stack: Stack) -> None:
    expect = playwright.expect
    now = stack.runtime.clock.now()
    # A running operation with most of its budget spent: the inbox's "at risk" list.
    insert_operation(
        stack.runtime.db,
        stack.runtime.journal,
        now,
        state=State.OBSERVING.value,
        remote_job_id="job_at_risk",
        status_requests_used=10,
        deadline_at=now + timedelta(minutes=30),
    )
    sign_in(page, stack, stack.operator_token)
    expect(page.locator("h1")).to_have_text("Inbox")
    expect(page.locator(".signout")).to_contain_text("ops-1")
    expect(page.locator("#at-risk")).to_contain_text("10 of 12 status requests used")

    # The operator starts a search; escalations arrive meanwhile. The lists refresh by
    # themselves and the half-typed search and the chosen filter stay as they were.
    page.fill("input[name=q]", "op_01")
    page.select_option("select[name=reason]", "unknown_state")
    page.evaluate("() => { window.sameDocument = true; }")
    op = escalated(stack, NEVER, max_status_requests=2, metadata={"ticket": HTML_META})
    other = escalated(stack, {"scenario": "unknown_state", "duration": 0.2, "webhooks": "never"})
    row = page.locator("#escalated tr", has_text=op["id"])
    expect(row).to_be_visible()
    expect(row).to_contain_text("2 of 2 status requests used")
    expect(row.locator("a.option")).to_have_text([o["action"] for o in op["escalation"]["options"]])
    expect(page.locator("#escalated tr", has_text=other["id"])).to_contain_text("unknown_state")
    expect(page.locator("#refreshed")).to_contain_text("the lists were refreshed")
    expect(page.locator("input[name=q]")).to_have_value("op_01")
    expect(page.locator("select[name=reason]")).to_have_value("unknown_state")
    assert page.evaluate("() => window.sameDocument") is True

    page.click(f"a.op:text('{op['id']}')")
    expect(page.locator("h1")).to_have_text(op["id"])
    escalation = page.locator("#escalation")
    expect(escalation).to_contain_text("Every allowed status read was spent")
    expect(escalation).to_contain_text("2 of 2 status requests used")
    actions = page.locator("button.decision").evaluate_all(
        "buttons => buttons.map(b => b.dataset.action)"
    )
    assert actions == [o["action"] for o in op["escalation"]["options"]]
    extend = page.locator("button.decision-extend")
    expect(extend).to_contain_text("additional checks")
    expect(page.locator("#metadata")).to_contain_text(HTML_META)  # as text, not a script

    # The job finishes at the provider while nobody looks; the extension will find it.
    done = loopback.post(
        f"{stack.sim_url}/_sim/jobs/{op['remote_job_id']}/complete", json={"state": "succeeded"}
    )
    assert done.status_code == 200
    extend.click()
    expect(page.locator("h1")).to_have_text("Confirm: extend")
    offered = op["escalation"]["options"][0]
    expect(page.locator("#extra_status_requests")).to_have_value(
        str(offered["extra_status_requests"])
    )
    page.fill("#note", "the provider's status page says <degraded>")
    page.click("#confirm")
    decided = page.locator("#decided")
    expect(decided).to_contain_text("Decision recorded: extended by 15 minutes and 4 status reads")
    expect(decided).to_contain_text("the provider's status page says <degraded>")
    expect(decided).to_be_in_viewport()
    expect(page.locator("#timeline")).to_contain_text("operator:ops-1 decided extend")
    expect(page.locator("#timeline")).to_contain_text("escalated → observing (decision:extend)")

    finished = stack.wait(op["id"], timeout=20)
    assert finished["state"] == State.SUCCEEDED.value
    page.reload()
    expect(page.locator(".lead .state")).to_have_text("succeeded")
    expect(page.locator("#decided")).to_have_count(0)  # said once, not on every reload
    expect(page.locator("#summary")).to_contain_text("Finished: the job succeeded")
    expect(page.locator("#timeline")).to_contain_text("collecting the result")
    expect(page.locator("#escalation")).to_have_count(0)
    expect(page.locator("#escalations")).to_contain_text("extended by 15 minutes")


def test_every_page_fits_a_phone_and_a_desktop(page: Any, stack: Stack, tmp_path: Path) -> None:
    expect = playwright.expect
    now = stack.runtime.clock.now()
    insert_operation(
        stack.runtime.db,
        stack.runtime.journal,
        now,
        state=State.OBSERVING.value,
        remote_job_id="job_nearly_spent",
        status_requests_used=11,
    )
    # An operation extended once that stopped again the same way, and one more escalation.
    op = escalated(stack, NEVER, max_status_requests=1)
    extend = {"action": "extend", "extra_status_requests": 1, "note": "one more look"}
    answer = stack.client.post(
        f"/v1/operations/{op['id']}/decisions", json=extend, headers=stack.headers(operator=True)
    )
    assert answer.status_code == 200, answer.text
    wait_until(
        lambda: stack.get(op["id"], operator=True)["escalation"]["decided"] is False,
        20,
        "the operation to escalate again",
    )
    escalated(stack, DENIED)
    sign_in(page, stack, stack.operator_token)
    expect(page.locator("h1")).to_have_text("Inbox")
    icon = page.locator("link[rel=icon]").get_attribute("href")
    assert page.request.get(f"{stack.url}{icon}").status == 200
    pages = {
        "inbox": "/console",
        "operation": f"/console/operations/{op['id']}",
        "confirm": f"/console/operations/{op['id']}/confirm?action=extend",
        "audit": "/console/audit",
    }
    for width, size in {**WIDTHS, "narrowest": NARROWEST}.items():
        page.set_viewport_size(size)
        for name, path in pages.items():
            page.goto(f"{stack.url}{path}")
            check_page(page)
            if width in WIDTHS:
                shoot(page, tmp_path, f"{name}-{width}.png")
        # A phone's view: the header wraps (sign out on screen), tables become blocks,
        # the story chart keeps a readable size and scrolls by itself.
        if width == "phone":
            signout = page.locator(".signout button").bounding_box()
            assert signout is not None and signout["x"] + signout["width"] <= PHONE["width"]
            page.goto(f"{stack.url}{pages['operation']}")
            cell = page.locator("#timeline td").first
            assert cell.evaluate("td => getComputedStyle(td).display") == "block"
            chart = page.locator(".story-chart .chart-scroll")
            inner, outer = chart.evaluate("e => [e.scrollWidth, e.clientWidth]")
            assert inner > outer and inner >= 640

    page.goto(f"{stack.url}/console")
    row = page.locator("#escalated tr", has_text=op["id"])
    expect(row.locator(".repeat")).to_contain_text(
        "escalated again (2 times; last decision: extended by 15 minutes and 1 status read at"
    )
    expect(row.locator("a.option", has_text="extend")).to_contain_text("(tried once)")
    expect(page.locator('nav a[aria-current="page"]')).to_have_text("Inbox")
    # The keyboard: the first Tab reaches the skip link, which leads past the filters to
    # the first operation that needs a decision.
    page.keyboard.press("Tab")
    assert page.evaluate("() => document.activeElement.className") == "skip"
    page.keyboard.press("Enter")
    page.keyboard.press("Tab")
    focused = page.evaluate("() => document.activeElement.closest('#escalated tr') !== null")
    assert focused, page.evaluate("() => document.activeElement.outerHTML")

    page.goto(f"{stack.url}{pages['operation']}")
    expect(page.locator("#repeat")).to_contain_text("This operation was escalated again")
    expect(page.locator("button.decision-extend .tried")).to_contain_text(
        "Tried once before: extended by 15 minutes and 1 status read — ops-1"
    )
    expect(page.locator("#escalations")).to_contain_text("one more look")
    assert "Do not report" not in page.content()


def test_an_agent_token_gets_no_session(page: Any, stack: Stack) -> None:
    sign_in(page, stack, stack.agent_token)
    playwright.expect(page.locator(".refused")).to_contain_text("agent tokens cannot use")
    cookies = {c["name"] for c in page.context.cookies()}
    assert "reconciler_console" not in cookies
    page.goto(f"{stack.url}/console")
    assert "/console/sign-in" in page.url


def test_a_post_without_the_csrf_token_decides_nothing(page: Any, stack: Stack) -> None:
    op = escalated(stack, NEVER, max_status_requests=1)
    sign_in(page, stack, stack.operator_token)
    playwright.expect(page.locator("h1")).to_have_text("Inbox")
    # The browser's own cookies, a form without the token: what a forged page would send.
    answer = page.request.post(
        f"{stack.url}/console/operations/{op['id']}/decisions", form={"action": "abandon"}
    )
    assert answer.status == 403
    assert "CSRF token" in answer.text()
    after = stack.get(op["id"], operator=True)
    assert after["state"] == State.ESCALATED.value
    assert after["escalation"]["decided"] is False


def test_provider_text_with_html_is_shown_as_text(page: Any, stack: Stack) -> None:
    failing = {
        "scenario": "late_failure",
        "duration": 0.2,
        "webhooks": "never",
        "error": {"code": "quota", "message": HTML_ERROR},
    }
    created = stack.create(failing)
    assert created.status_code == 202, created.text
    op = stack.wait(created.json()["id"], timeout=20)
    assert op["state"] == State.FAILED.value, op
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    sign_in(page, stack, stack.operator_token)
    page.goto(f"{stack.url}/console/operations/{op['id']}")
    error = page.locator("#provider-error")
    playwright.expect(error).to_contain_text(HTML_ERROR)
    assert error.locator("img, b").count() == 0
    assert dialogs == []


def boxes(locator: Any) -> list[dict[str, float]]:
    """Each element's rendered box (what was drawn, not what the markup says)."""
    found: list[dict[str, float]] = locator.evaluate_all(
        "els => els.map(e => { const r = e.getBoundingClientRect();"
        " return {x: r.x, y: r.y, width: r.width, height: r.height}; })"
    )
    return found


def inside(box: dict[str, float], outer: dict[str, float]) -> bool:
    return (
        outer["x"] - 1 <= box["x"] <= box["x"] + box["width"] <= outer["x"] + outer["width"] + 1
        and outer["y"] - 1
        <= box["y"]
        <= box["y"] + box["height"]
        <= outer["y"] + outer["height"] + 1
    )


def overlapping(drawn: list[dict[str, float]]) -> int:
    """How many marks touch or cover the one before them on their lane (the same row)."""
    rows: dict[float, list[dict[str, float]]] = {}
    for b in drawn:
        rows.setdefault(round(b["y"]), []).append(b)
    pairs = [
        pair
        for row in rows.values()
        for pair in itertools.pairwise(sorted(row, key=lambda b: b["x"]))
    ]
    return sum(1 for a, b in pairs if b["x"] - a["x"] < a["width"] - 0.5)


def test_the_charts_render_with_their_marks(page: Any, tmp_path: Path, db_url: str) -> None:
    # A service of its own: the provider's trust history here is this test's alone.
    polling = {**QUICK_POLLING, "trust_after": 3, "distrust_after_misses": 1}
    with running_stack(tmp_path, db_url, provider={"polling": polling}) as stack:
        rt = stack.runtime
        made = completed_hours(rt.db, rt.journal, "sim", rt.clock.now())
        story = long_story(rt.db, rt.journal, rt.clock.now())
        blocked: list[str] = []
        page.on("console", lambda m: blocked.append(m.text) if "Content Security" in m.text else 0)
        sign_in(page, stack, stack.operator_token)
        playwright.expect(page.locator("h1")).to_have_text("Inbox")

        page.goto(f"{stack.url}/console/providers")
        chart = page.locator("#provider-sim svg.chart")
        playwright.expect(chart).to_be_visible()
        frame = chart.bounding_box()
        assert frame is not None and frame["width"] > 300 and frame["height"] > 100
        bars = chart.locator("rect.bar")
        assert bars.count() == len(made.reads) + len(VERDICTS)
        drawn = boxes(bars)
        assert all(inside(b, frame) for b in drawn)
        assert all(b["height"] >= 2 and b["width"] > 0 for b in drawn)  # 0 % is drawn too
        assert chart.locator("text.zero-label").count() == chart.locator("rect.bar.zero").count()
        assert "UTC" in chart.locator("text.axis-zone").all_text_contents()
        legend = page.locator("#provider-sim .chart-legend")
        playwright.expect(legend).to_contain_text("trust became distrusted")
        markers = chart.locator("g.marker")
        assert markers.count() == len(TRANSITIONS)
        assert markers.locator("text").all_text_contents() == [s for _, s in TRANSITIONS]
        playwright.expect(page.locator("#provider-sim .trust-words")).to_contain_text(
            "webhook-first completions in a row"
        )
        for width, size in {**WIDTHS, "narrowest": NARROWEST}.items():
            page.set_viewport_size(size)
            check_page(page)
            if width == "narrowest":
                continue
            if width == "phone":  # past the storage figures, to the provider's chart
                page.locator("#provider-sim").evaluate("e => e.scrollIntoView()")
            shoot(page, tmp_path, f"providers-{width}.png")

        page.set_viewport_size(DESKTOP)
        page.goto(f"{stack.url}/console/operations/{story.op_id}")
        lanes = page.locator("#timeline svg.chart")
        playwright.expect(lanes).to_be_visible()
        frame = lanes.bounding_box()
        assert frame is not None and frame["width"] > 300 and frame["height"] > 100
        marks = lanes.locator("circle.mark")
        assert marks.count() == story.entries
        drawn = boxes(marks)
        assert all(inside(b, frame) and b["width"] > 0 for b in drawn)
        assert overlapping(drawn) == 0  # entries milliseconds apart are marks of their own
        for lane, count in story.lanes.items():
            assert lanes.locator(f"circle.lane-{lane}").count() == count
        playwright.expect(page.locator("#timeline .chart-legend")).to_contain_text(
            "an error answer or a failed attempt"
        )
        for width, size in WIDTHS.items():
            page.set_viewport_size(size)
            check_page(page)
            shoot(page, tmp_path, f"story-{width}.png", page.locator("#timeline .chart-figure"))
        assert blocked == []
