"""The operator console in a real browser: Debian's chromium, driven by Playwright.

One browser per module and one service per backend. An operator signs in,
sees an escalation arrive in the inbox without reloading, opens it, decides
``extend`` through the button and its confirmation, and watches the operation
resume and finish; an agent token is refused; a POST without the CSRF token
changes nothing; provider text with HTML in it renders as text; the charts
(a provider's last hours, an operation's story) render with their marks under
the console's CSP. Screenshots of the inbox, of an operation page and of the
charts are saved in the test's directory (and in ``$RECONCILER_SCREENSHOTS``
when set, which is how ``docs/`` gets them).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from reconciler.core.states import State
from tests.support import loopback
from tests.support.chart_data import TRANSITIONS, VERDICTS, completed_hours, long_story
from tests.support.factories import insert_operation
from tests.support.stack import QUICK_POLLING, Stack, running_stack

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
HTML_ERROR = '<img src=x onerror="alert(1)"><b>quota</b> exceeded'
HTML_META = "<script>alert('meta')</script>"


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
    context = browser.new_context(viewport={"width": 1360, "height": 900})
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
    """The whole page, or only ``part`` (a locator), as a PNG."""
    path = tmp_path / name
    if part is None:
        page.screenshot(path=str(path), full_page=True)
    else:
        part.screenshot(path=str(path), animations="disabled")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    extra = os.environ.get("RECONCILER_SCREENSHOTS")
    if extra:
        Path(extra).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(extra) / name)


def test_operator_decides_extend_and_the_operation_resumes(
    page: Any, stack: Stack, tmp_path: Path
) -> None:
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

    # Escalations arrive while the inbox is open: it refreshes itself.
    op = escalated(stack, NEVER, max_status_requests=2, metadata={"ticket": HTML_META})
    other = escalated(stack, {"scenario": "unknown_state", "duration": 0.2, "webhooks": "never"})
    row = page.locator("#escalated tr", has_text=op["id"])
    expect(row).to_be_visible()
    expect(row).to_contain_text("request_budget_exhausted")
    expect(row).to_contain_text("extend")
    expect(page.locator("#escalated tr", has_text=other["id"])).to_contain_text("unknown_state")
    shoot(page, tmp_path, "console-inbox.png")

    page.click(f"a.op:text('{op['id']}')")
    expect(page.locator("h1")).to_have_text(op["id"])
    expect(page.locator(".escalation-message")).to_contain_text("External job needs a decision")
    expect(page.locator(".escalation-message")).to_contain_text("Status requests: 2 of 2")
    actions = page.locator("button.decision").evaluate_all(
        "buttons => buttons.map(b => b.dataset.action)"
    )
    assert actions == [o["action"] for o in op["escalation"]["options"]]
    extend = page.locator("button.decision-extend")
    expect(extend).to_contain_text("additional checks")
    expect(page.locator("#metadata")).to_contain_text(HTML_META)  # as text, not a script
    shoot(page, tmp_path, "console-operation.png")

    # The job finishes at the provider while nobody looks; the extension will find it.
    done = loopback.post(
        f"{stack.sim_url}/_sim/jobs/{op['remote_job_id']}/complete", json={"state": "succeeded"}
    )
    assert done.status_code == 200
    extend.click()
    expect(page.locator("h1")).to_have_text("Confirm: extend")
    offered = op["escalation"]["options"][0]
    expect(page.locator(".confirm .fields")).to_contain_text(str(offered["extra_status_requests"]))
    page.click("#confirm")
    expect(page.locator("#decided")).to_have_text("Decision recorded: extend.")
    expect(page.locator("#timeline")).to_contain_text("operator:ops-1 decided extend")
    expect(page.locator("#timeline")).to_contain_text("escalated -> observing (decision:extend)")

    finished = stack.wait(op["id"], timeout=20)
    assert finished["state"] == State.SUCCEEDED.value
    page.reload()
    expect(page.locator(".lead .state")).to_have_text("succeeded")
    expect(page.locator("#timeline")).to_contain_text("collecting the result")
    expect(page.locator("#escalation")).to_have_count(0)
    shoot(page, tmp_path, "console-operation-decided.png")


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
        assert all(b["height"] > 0 and b["width"] > 0 for b in drawn)  # 0 % is drawn too
        markers = chart.locator("g.marker")
        assert markers.count() == len(TRANSITIONS)
        assert markers.locator("text").all_text_contents() == [s for _, s in TRANSITIONS]
        shoot(page, tmp_path, "console-providers.png", page.locator("#provider-sim"))

        page.goto(f"{stack.url}/console/operations/{story.op_id}")
        lanes = page.locator("#timeline svg.chart")
        playwright.expect(lanes).to_be_visible()
        frame = lanes.bounding_box()
        assert frame is not None and frame["width"] > 300 and frame["height"] > 100
        marks = lanes.locator("circle.mark")
        assert marks.count() == story.entries
        assert all(inside(b, frame) and b["width"] > 0 for b in boxes(marks))
        for lane, count in story.lanes.items():
            assert lanes.locator(f"circle.lane-{lane}").count() == count
        shoot(page, tmp_path, "console-operation-timeline.png", page.locator("#timeline"))
        assert blocked == []
