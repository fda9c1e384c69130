"""The operator console over plain HTTP: sessions, bad input, escaping, no secrets, and
what each page shows (deciding is tests/integration/test_console_decisions.py).

The live service on uvicorn (one per backend for the module) with the simulated
provider; httpx plays the browser. Every bad input must be an HTML 4xx page
that says what to fix, never a 500.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator
from contextlib import closing
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from reconciler.console.session import SESSION_COOKIE
from reconciler.core.errors import RejectReason
from reconciler.core.states import State
from reconciler.core.trust import Verdict
from reconciler.inbound.auth import CACHE_SECONDS
from reconciler.storage.tables import HISTORY
from reconciler.storage.tokens import create_token, revoke_token
from tests.support import loopback
from tests.support.chart_data import VERDICTS, completed_hours, long_story
from tests.support.console import (
    csrf_of,
    decide_form,
    escalated,
    html_page,
    operator_client,
    sign_in,
)
from tests.support.factories import insert_escalation, insert_operation
from tests.support.stack import (
    CALLBACK_SECRET,
    QUICK_POLLING,
    SIM_TOKEN,
    WEBHOOK_SECRET,
    Stack,
    running_stack,
)

NEVER = {"scenario": "never_finishes", "webhooks": "never"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, module_db_url: str) -> Iterator[Stack]:
    with running_stack(
        tmp_path_factory.mktemp("console-http"), module_db_url, provider={"polling": QUICK_POLLING}
    ) as s:
        yield s


@pytest.fixture(scope="module")
def ops(stack: Stack) -> Iterator[httpx.Client]:
    client = operator_client(stack.url, stack.operator_token)
    try:
        yield client
    finally:
        client.close()


# --- sessions ----------------------------------------------------------------------------


def test_pages_need_a_session_and_send_you_to_sign_in(stack: Stack) -> None:
    with loopback.client(base_url=stack.url) as anonymous:
        for path in ("/console", "/console/providers", "/console/audit", "/console/operations/x"):
            answer = anonymous.get(path)
            assert answer.status_code == 303
            assert answer.headers["location"].startswith("/console/sign-in?why=none&next=")
        assert anonymous.get("/console/inbox/stamp").status_code == 303
        slash = anonymous.get("/console/")
        assert (slash.status_code, slash.headers["location"]) == (308, "/console")


def test_the_session_cookie_is_httponly_strict_and_expires(stack: Stack) -> None:
    client, answer = sign_in(stack.url, stack.operator_token)
    with closing(client):
        assert answer.status_code == 303 and answer.headers["location"] == "/console"
        cookie = answer.headers["set-cookie"]
        assert cookie.startswith(f"{SESSION_COOKIE}=")
        for part in ("HttpOnly", "SameSite=strict", "Path=/console", "Max-Age=43200"):
            assert part.lower() in cookie.lower(), cookie
        assert "secure" not in cookie.lower()  # the service is on plain http here
        assert stack.operator_token not in cookie
        # The cookie names the token's row, not the token; altering it ends the session.
        value = client.cookies[SESSION_COOKIE]
        client.cookies.set(SESSION_COOKIE, value[:-2] + "xx", path="/console")
        assert client.get("/console").headers["location"].startswith("/console/sign-in?why=expired")


def test_the_cookie_is_secure_when_the_public_url_is_https(tmp_path: Path, db_url: str) -> None:
    server = {"public_url": "https://reconciler.example"}
    with running_stack(tmp_path, db_url, server=server) as s, loopback.client(base_url=s.url) as c:
        form = c.get("/console/sign-in")
        assert "; secure" in form.headers["set-cookie"].lower()
        # A client keeps Secure cookies for https only: carry the sign-in cookie by hand.
        nonce = form.headers["set-cookie"].split(";")[0]
        answer = c.post(
            "/console/sign-in",
            data={"csrf": csrf_of(form.text), "token": s.operator_token},
            headers={"cookie": nonce},
        )
        assert answer.status_code == 303, answer.text
        assert "; secure" in answer.headers["set-cookie"].lower()


@pytest.mark.parametrize(
    ("which", "words"),
    [
        ("agent", "agent tokens cannot use the console"),
        ("revoked", "This token was revoked"),
        ("unknown", "not known to this service"),
        ("empty", "Paste an operator token"),
    ],
)
def test_only_a_valid_operator_token_signs_in(stack: Stack, which: str, words: str) -> None:
    token = {"agent": stack.agent_token, "unknown": "rk_" + "x" * 43, "empty": " "}.get(which)
    if which == "revoked":
        with stack.runtime.db.write() as conn:
            token = create_token(conn, "ops-revoked", "operator", stack.runtime.clock.now())
            revoke_token(conn, "ops-revoked", stack.runtime.clock.now())
    assert token is not None
    client, answer = sign_in(stack.url, token)
    with closing(client):
        page = html_page(answer, 400 if which == "empty" else 403)
        assert words in page
        assert SESSION_COOKIE not in client.cookies
        assert token.strip() == "" or token not in page


def test_a_session_dies_when_its_token_is_revoked(stack: Stack) -> None:
    with stack.runtime.db.write() as conn:
        token = create_token(conn, "ops-leaving", "operator", stack.runtime.clock.now())
    with closing(operator_client(stack.url, token)) as client:
        assert client.get("/console").status_code == 200
        with stack.runtime.db.write() as conn:
            revoke_token(conn, "ops-leaving", stack.runtime.clock.now())
        # Within the token cache's few seconds at most; clearing it stands for their passing.
        assert CACHE_SECONDS <= 5
        stack.runtime.token_cache.clear()
        answer = client.get("/console")
        assert answer.status_code == 303
        assert "why=revoked" in answer.headers["location"]
        signin = client.get(answer.headers["location"])
        assert "its operator token was revoked" in signin.text


def test_sign_in_needs_its_csrf_token_and_sign_out_ends_the_session(stack: Stack) -> None:
    with loopback.client(base_url=stack.url) as client:
        client.get("/console/sign-in")
        forged = client.post("/console/sign-in", data={"token": stack.operator_token})
        assert "CSRF token" in html_page(forged, 403)
        assert SESSION_COOKIE not in client.cookies
    with closing(operator_client(stack.url, stack.operator_token)) as client:
        inbox = client.get("/console")
        out = client.post("/console/sign-out", data={"csrf": csrf_of(inbox.text)})
        assert out.status_code == 303
        assert SESSION_COOKIE not in client.cookies
        assert client.get("/console").status_code == 303


def test_sign_in_only_returns_to_console_pages(stack: Stack) -> None:
    with loopback.client(base_url=stack.url) as client:
        form = client.get("/console/sign-in")
        answer = client.post(
            "/console/sign-in",
            data={
                "csrf": csrf_of(form.text),
                "token": stack.operator_token,
                "next": "https://evil.example/console",
            },
        )
        assert answer.headers["location"] == "/console"


def test_pages_mark_where_you_are_and_carry_a_skip_link_and_an_icon(ops: httpx.Client) -> None:
    for path in ("/console", "/console/providers", "/console/audit"):
        page = html_page(ops.get(path), 200)
        assert page.count('aria-current="page"') == 1
        assert f'<a href="{path}" aria-current="page">' in page
        assert re.search(r'<body>\s*<a class="skip" href="#', page)
        assert '<link rel="icon" href="/console/static/favicon.svg"' in page
    icon = ops.get("/console/static/favicon.svg")
    assert icon.status_code == 200 and icon.headers["content-type"].startswith("image/svg")


# --- bad input -----------------------------------------------------------------------------


BAD_INBOX = [
    ("state=nope", "'state' must be one of"),
    ("reason=bored", "'reason' must be one of"),
    ("provider=nobody", "'provider' must be one of"),
    ("page=0", "'page' must be a whole number"),
    ("risk_page=abc", "'risk_page' must be a whole number"),
    ("all_page=99999999", "'all_page' must be a whole number"),
    ("colour=red", "unknown parameter(s): colour"),
    ("q=" + "x" * 301, "'q' must be the start of an operation id"),
    ("q=%00op", "'q' must be the start of an operation id"),
]


@pytest.mark.parametrize(("query", "words"), BAD_INBOX)
def test_bad_inbox_filters_are_a_400_page(ops: httpx.Client, query: str, words: str) -> None:
    assert words in html_page(ops.get(f"/console?{query}"), 400)


@pytest.mark.parametrize(
    "path",
    [
        "/console/operations/op_doesnotexist",
        "/console/operations/" + "o" * 300,
        "/console/operations/op_doesnotexist/confirm?action=extend",
        "/console/nowhere",
        "/console/operations/op_x/decisions/extra",
    ],
)
def test_unknown_pages_and_operations_are_a_404_page(ops: httpx.Client, path: str) -> None:
    html_page(ops.get(path), 404)


def test_bad_forms_and_parameters_are_a_400_page(stack: Stack, ops: httpx.Client) -> None:
    op = escalated(stack, NEVER, max_status_requests=1)
    url = f"/console/operations/{op['id']}"
    csrf = csrf_of(ops.get(url).text)
    assert "'action' must be one of" in html_page(ops.get(f"{url}/confirm?action=pause"), 400)
    assert "'why' must be one of" in html_page(ops.get("/console/sign-in?why=hax"), 400)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"content": b"action=extend", "headers": {"content-type": "text/plain"}}, "urlencoded"),
        ({"content": b"csrf=a&csrf=b", "headers": _FORM}, "more than once"),
        ({"content": b"\xff\xfe", "headers": _FORM}, "not valid UTF-8"),
        ({"data": {"csrf": csrf, "action": "extend", "extra_seconds": "soon"}}, "must be a number"),
        ({"data": {"csrf": csrf, "action": "explode"}}, "'action' must be one of"),
        ({"data": {"csrf": csrf, "action": "extend", "colour": "red"}}, "unknown form field"),
        ({"data": {"csrf": csrf, "action": "extend", "extra_seconds": "-5"}}, "extra_seconds"),
    ]
    for kwargs, words in cases:
        answer = ops.post(f"{url}/decisions", **kwargs)
        assert answer.status_code in (400, 403), answer.text
        if answer.status_code == 400:
            assert words in html_page(answer, 400)
    big = ops.post(f"{url}/decisions", content=b"a=" + b"x" * 20_000, headers=_FORM)
    html_page(big, 413)
    assert stack.get(op["id"], operator=True)["escalation"]["decided"] is False


_FORM = {"content-type": "application/x-www-form-urlencoded"}


# --- what pages show ----------------------------------------------------------------------


def test_html_in_provider_text_and_metadata_is_escaped(stack: Stack, ops: httpx.Client) -> None:
    evil = "<script>alert(1)</script><img src=x onerror=alert(2)>"
    created = stack.create(
        {
            "scenario": "late_failure",
            "duration": 0.1,
            "webhooks": "never",
            "error": {"code": "x", "message": evil},
        },
        metadata={"note": evil, "<b>key</b>": "v"},
    )
    op = stack.wait(created.json()["id"], timeout=20)
    assert op["state"] == State.FAILED.value
    answer = ops.get(f"/console/operations/{op['id']}")
    html_page(answer, 200)
    page = answer.text
    assert evil not in page and "<b>key</b>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x onerror=alert(2)&gt;" in page
    assert "&lt;b&gt;key&lt;/b&gt;" in page
    search = ops.get("/console", params={"q": "<script>"})
    html_page(search, 200)
    assert "<script>" not in search.text.replace('<script src="/console/static/console.js"', "")


def test_no_page_shows_a_token_or_secret(stack: Stack, ops: httpx.Client) -> None:
    created = stack.create(
        {"scenario": "success", "duration": 0.1, "webhooks": "never"},
        callback_url="http://127.0.0.1:9/hook?token=callback-query-secret",
    )
    op = stack.wait(created.json()["id"], timeout=20)
    pages = [
        ops.get(path).text
        for path in (
            "/console",
            f"/console?q={op['id']}",
            f"/console/operations/{op['id']}",
            "/console/providers",
            "/console/audit",
        )
    ]
    secrets = [
        stack.operator_token,
        stack.agent_token,
        SIM_TOKEN,
        WEBHOOK_SECRET,
        WEBHOOK_SECRET.removeprefix("whsec_"),
        CALLBACK_SECRET.removeprefix("whsec_"),
        "callback-query-secret",
    ]
    for page in pages:
        for secret in secrets:
            assert secret not in page
    assert "http://127.0.0.1:9/hook (query hidden)" in pages[2]


def test_inbox_lists_filters_searches_and_pages(stack: Stack, ops: httpx.Client) -> None:
    first = escalated(stack, NEVER, max_status_requests=1)
    second = escalated(stack, {"scenario": "unknown_state", "duration": 0.1, "webhooks": "never"})
    inbox = html_page(ops.get("/console"), 200)
    assert first["id"] in inbox and second["id"] in inbox
    by_reason = ops.get("/console", params={"reason": "unknown_state"}).text
    assert second["id"] in by_reason and first["id"] not in by_reason
    for value in (first["id"], first["remote_job_id"], first["trace_id"]):
        found = html_page(ops.get("/console", params={"q": value}), 200)
        assert found.count(f'href="/console/operations/{first["id"]}"') >= 1
        assert second["id"] not in found
    nothing = ops.get("/console", params={"q": "op_nothing_like_it"}).text
    assert "No operation matches." in nothing
    state = ops.get("/console", params={"state": "escalated", "provider": "sim"}).text
    assert "All matching operations" in state and first["id"] in state
    counts = re.search(r'state-escalated">escalated</span> <b>(\d+)</b>', inbox)
    assert counts is not None and int(counts.group(1)) >= 2


def test_inbox_pages_through_a_long_list(
    stack: Stack, ops: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    escalated(stack, NEVER, max_status_requests=1)
    escalated(stack, NEVER, max_status_requests=1)
    monkeypatch.setattr("reconciler.console.inbox.PAGE_SIZE", 1)
    one = ops.get("/console").text
    assert 'rel="next"' in one and "page 1 of" in one
    two = ops.get("/console", params={"page": 2}).text
    assert "page 2 of" in two and 'rel="prev"' in two
    rows = re.findall(
        r'<tr class="escalated-row">\s*<td data-label="Operation"><a class="op" href="([^"]+)"',
        one + two,
    )
    assert len(rows) == 2 and rows[0] != rows[1]


def test_at_risk_operations_follow_the_risk_rules(stack: Stack, ops: httpx.Client) -> None:
    now = stack.runtime.clock.now()
    db, journal = stack.runtime.db, stack.runtime.journal
    budget = insert_operation(db, journal, now, state="observing", status_requests_used=10)
    failing = insert_operation(db, journal, now, state="observing", transport_failures_used=2)
    late = insert_operation(
        db,
        journal,
        now - timedelta(minutes=50),
        state="observing",
        deadline_at=now + timedelta(minutes=5),
    )
    calm = insert_operation(db, journal, now, state="observing", status_requests_used=2)
    # Let go on after a rate_limited escalation, and answered 429 again since.
    esc_id = 1_000_000 + secrets.randbelow(1_000_000)
    again = insert_operation(
        db, journal, now, state="observing", rate_limited_count=1, escalation_id=esc_id
    )
    insert_escalation(db, again.id, esc_id, "rate_limited", decided=True, at=now)
    page = html_page(ops.get("/console"), 200)
    section = page.split('id="at-risk"')[1].split("</section>")[0]
    assert budget.id in section and "10 of 12 status requests used" in section
    assert failing.id in section and "2 of 3 transport failures" in section
    assert late.id in section and "of the time left" in section
    assert again.id in section and "429 again (1 in a row) after the rate_limited" in section
    assert calm.id not in section


def test_stamp_changes_when_an_escalation_opens_or_is_decided(
    stack: Stack, ops: httpx.Client
) -> None:
    before = ops.get("/console/inbox/stamp").json()["stamp"]
    op = escalated(stack, NEVER, max_status_requests=1)
    opened = ops.get("/console/inbox/stamp").json()["stamp"]
    assert opened != before
    csrf = csrf_of(ops.get("/console").text)
    assert decide_form(ops, op["id"], action="abandon", csrf=csrf).status_code == 303
    assert ops.get("/console/inbox/stamp").json()["stamp"] != opened


def test_providers_page_counts_webhooks_from_the_database_and_rejections(
    stack: Stack, ops: httpx.Client
) -> None:
    bad = loopback.post(
        f"{stack.url}/webhooks/sim",
        content=b"{}",
        headers={"webhook-id": "x", "webhook-timestamp": "1", "webhook-signature": "v1,AAAA"},
    )
    assert bad.status_code == 401
    page = html_page(ops.get("/console/providers"), 200)
    section = page.split('id="provider-sim"')[1]
    assert "Events received" in section and "Orphaned" in section
    rejected = section.split("Rejected")[1].split("</dl>")[0]
    assert any(reason.value in rejected for reason in RejectReason), rejected
    assert "Status reads per completed operation" in section
    trust = section.split("Webhook trust")[1].split("</dl>")[0]
    assert "<b>learning</b>" in trust and "Webhook-first share" in trust


def svg_in(page: str, after: str) -> str:
    """The first chart's SVG after ``after`` in the page."""
    rest = page.split(after, 1)[1]
    return rest[rest.index("<svg") : rest.index("</svg>")]


def test_providers_page_charts_each_providers_last_hours(stack: Stack, ops: httpx.Client) -> None:
    # A provider of its own: the page lists every provider the database names.
    provider = f"charted-{secrets.token_hex(4)}"
    rt = stack.runtime
    made = completed_hours(rt.db, rt.journal, provider, rt.clock.now())
    page = html_page(ops.get("/console/providers"), 200)
    svg = svg_in(page, f'id="provider-{provider}"')
    assert 'role="img"' in svg and "<title" in svg and "<desc" in svg
    assert svg.count('<rect class="bar') == len(made.reads) + len(VERDICTS)
    zero = [v for v in VERDICTS.values() if v is not Verdict.WEBHOOK_FIRST]
    assert svg.count('<rect class="bar zero"') == len(zero)  # 0 % drawn, not left out
    assert f"{len(made.reads)} hour(s) with data" in svg
    assert 'class="marker' not in svg  # no longer configured: its trust keys are unknown
    section = page.split(f'id="provider-{provider}"', 1)[1].split("</section>")[0]
    assert "Figures as a table" in section
    # One judged completion per hour: its share is all or nothing.
    assert section.count(" UTC: 100% (1 judged completion)") == len(VERDICTS) - len(zero)
    assert section.count(" UTC: 0% (1 judged completion)") == len(zero)
    # The configured provider has its chart too, with data or saying it has none.
    sim = svg_in(page, 'id="provider-sim"')
    assert "hour(s) with data" in sim or "no data yet" in sim


def test_operation_page_draws_the_story_on_one_time_axis(stack: Stack, ops: httpx.Client) -> None:
    story = long_story(stack.runtime.db, stack.runtime.journal, stack.runtime.clock.now())
    page = html_page(ops.get(f"/console/operations/{story.op_id}"), 200)
    svg = svg_in(page, 'id="timeline"')
    assert svg.count("<circle") == story.entries
    for lane, count in story.lanes.items():
        assert svg.count(f"lane-{lane}") == count, lane
    assert svg.count('class="mark bad') == 2  # the 503 and the failed callback
    assert f"{story.entries} events from" in svg
    # The story table stays the text of the same events.
    assert page.split('id="timeline"')[1].count('<tr class="kind-') == story.entries


def test_audit_page_names_the_first_bad_entry(stack: Stack, ops: httpx.Client) -> None:
    # Tests are handed to workers one by one: this one may be the first of the module
    # on its worker, so it makes the history it edits.
    created = stack.create(NEVER)
    assert created.status_code == 202, created.text
    assert "Intact:" in html_page(ops.get("/console/audit"), 200)
    own = HISTORY.c.operation_id == created.json()["id"]
    with stack.runtime.db.read() as conn:
        entry = conn.execute(
            sa.select(HISTORY.c.id, HISTORY.c.cause).where(own).order_by(HISTORY.c.id).limit(1)
        ).one()
    with stack.runtime.db.write() as conn:
        conn.execute(sa.update(HISTORY).where(HISTORY.c.id == entry.id).values(cause="edited"))
    try:
        page = html_page(ops.get("/console/audit"), 200)
        assert "The history was altered." in page
        assert f"history entry {entry.id}" in page
    finally:
        with stack.runtime.db.write() as conn:
            conn.execute(
                sa.update(HISTORY).where(HISTORY.c.id == entry.id).values(cause=entry.cause)
            )
    assert "Intact:" in ops.get("/console/audit").text
