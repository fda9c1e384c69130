"""Deciding through the console over plain HTTP: CSRF, the API's refusals, the amounts and
the note, the confirmation said once, and an operation that escalates again.

The live service on uvicorn (one per backend for the module) with the simulated
provider; httpx plays the browser.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from contextlib import closing

import httpx
import markupsafe
import pytest

from reconciler.core.states import State
from tests.support import loopback
from tests.support.console import csrf_of, decide_form, escalated, html_page, operator_client
from tests.support.stack import QUICK_POLLING, Stack, running_stack
from tests.support.waiting import wait_until

NEVER = {"scenario": "never_finishes", "webhooks": "never"}
DENIED = {**NEVER, "auth_fault": 403, "auth_fault_after": 1}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, module_db_url: str) -> Iterator[Stack]:
    with running_stack(
        tmp_path_factory.mktemp("console-decisions"),
        module_db_url,
        provider={"polling": QUICK_POLLING},
    ) as s:
        yield s


@pytest.fixture(scope="module")
def ops(stack: Stack) -> Iterator[httpx.Client]:
    client = operator_client(stack.url, stack.operator_token)
    try:
        yield client
    finally:
        client.close()


def test_a_decision_without_or_with_another_sessions_csrf_changes_nothing(
    stack: Stack, ops: httpx.Client
) -> None:
    op = escalated(stack, NEVER, max_status_requests=1)
    with closing(operator_client(stack.url, stack.operator_token)) as other:
        theirs = csrf_of(other.get("/console").text)
    mine = csrf_of(ops.get("/console").text)
    assert theirs != mine
    for fields in ({"action": "abandon"}, {"action": "abandon", "csrf": theirs}):
        assert "CSRF token" in html_page(decide_form(ops, op["id"], **fields), 403)
    with loopback.client(base_url=stack.url) as anonymous:
        html_page(decide_form(anonymous, op["id"], action="abandon", csrf=mine), 403)
    after = stack.get(op["id"], operator=True)
    assert after["state"] == State.ESCALATED.value and not after["escalation"]["decided"]

    done = decide_form(ops, op["id"], action="abandon", csrf=mine)
    assert done.status_code == 303
    assert done.headers["location"] == f"/console/operations/{op['id']}#decided"
    after = stack.get(op["id"], operator=True)
    assert after["state"] == State.RESULT_TIMED_OUT.value
    [decision] = [e for e in stack.history(op["id"]) if e["kind"] == "decision"]
    assert decision["actor"] == "operator:ops-1"
    # "Decision recorded" once, on the page the decision leads to; a reload does not repeat it.
    page = html_page(ops.get(done.headers["location"]), 200)
    assert "operator:ops-1 decided abandon" in page
    assert re.search(r'id="decided"[^>]*>Decision recorded: abandoned — ops-1, 20\d\d-', page)
    assert 'id="decided"' not in ops.get(f"/console/operations/{op['id']}").text

    # A second decision: the API's own words, and a way back to the operation.
    again = decide_form(ops, op["id"], action="abandon", csrf=mine)
    api = stack.client.post(
        f"/v1/operations/{op['id']}/decisions",
        json={"action": "abandon"},
        headers=stack.headers(operator=True),
    )
    assert api.status_code == 409
    refused = html_page(again, 409)
    assert api.json()["error"]["message"] in refused
    assert f'href="/console/operations/{op["id"]}" id="back-to-operation"' in refused


def test_an_option_not_offered_is_refused_with_the_apis_message(
    stack: Stack, ops: httpx.Client
) -> None:
    op = escalated(stack, DENIED)
    assert op["escalation"]["reason"] == "authorization_denied"
    page = html_page(ops.get(f"/console/operations/{op['id']}"), 200)
    assert 'data-action="extend"' in page and 'data-action="abandon"' in page
    assert 'data-action="cancel"' not in page
    api = stack.client.post(
        f"/v1/operations/{op['id']}/decisions",
        json={"action": "cancel"},
        headers=stack.headers(operator=True),
    )
    message = api.json()["error"]["message"]
    confirm = ops.get(f"/console/operations/{op['id']}/confirm", params={"action": "cancel"})
    assert message in html_page(confirm, 409)
    csrf = csrf_of(page)
    assert message in html_page(decide_form(ops, op["id"], action="cancel", csrf=csrf), 409)
    assert stack.get(op["id"], operator=True)["escalation"]["decided"] is False


def test_the_confirmation_shows_the_offered_amounts(stack: Stack, ops: httpx.Client) -> None:
    op = escalated(stack, NEVER, max_status_requests=1)
    offered = op["escalation"]["options"][0]
    assert offered["action"] == "extend"
    page = html_page(
        ops.get(f"/console/operations/{op['id']}/confirm", params={"action": "extend"}), 200
    )
    assert f'name="extra_status_requests" value="{offered["extra_status_requests"]}"' in page
    assert offered["description"] in page
    # The page before it offers the option as a button that leads here, not a POST.
    detail = ops.get(f"/console/operations/{op['id']}").text
    assert f'action="/console/operations/{op["id"]}/confirm"' in detail


def test_a_decision_takes_a_note_and_less_than_was_offered(stack: Stack, ops: httpx.Client) -> None:
    op = escalated(stack, NEVER, max_status_requests=1)
    url = f"/console/operations/{op['id']}"
    offered = op["escalation"]["options"][0]
    assert "(awaiting a decision: not done)" in html_page(ops.get(url), 200)
    confirm = html_page(ops.get(f"{url}/confirm", params={"action": "extend"}), 200)
    seconds = str(int(offered["extra_seconds"]))
    assert f'name="extra_seconds" value="{seconds}" min="1" max="{seconds}"' in confirm
    assert '<textarea id="note" name="note" maxlength="500"' in confirm
    csrf = csrf_of(confirm)
    form = {"csrf": csrf, "action": "extend", "escalation": str(confirm_id(confirm))}
    refusals = [
        ({"note": "x" * 501}, "'note' must be at most 500 characters"),
        ({"note": "bell \x07"}, "'note' must be plain text"),
        ({"extra_status_requests": "99"}, "'extra_status_requests' may be at most"),
    ]
    for extra, words in refusals:
        refused = html_page(decide_form(ops, op["id"], **form, **extra), 400)
        assert words in refused
        assert f'href="{url}" id="back-to-operation"' in refused
    assert stack.get(op["id"], operator=True)["escalation"]["decided"] is False

    note = 'provider says <b>"soon"</b> & it was right before'
    done = decide_form(
        ops, op["id"], **form, extra_seconds="60", extra_status_requests="2", note=note
    )
    assert done.status_code == 303, done.text
    page = ops.get(done.headers["location"]).text
    shown = str(markupsafe.escape(note))
    assert "<b>" not in page.split('id="decided"')[1].split("</p>")[0]
    banner = html.unescape(page.split('id="decided"')[1].split("</p>")[0])
    assert "Decision recorded: extended by 1 minute and 2 status reads — ops-1" in banner
    assert note in banner
    assert shown in page.split('id="escalations"')[1]
    # Stored with the decision: the escalation's record and the chained history entry.
    after = stack.get(op["id"], operator=True)
    assert after["escalation"]["decision"]["note"] == note
    [entry] = [e for e in stack.history(op["id"]) if e["kind"] == "decision"]
    assert entry["detail"]["note"] == note
    assert after["budget"]["max_status_requests"] == 1 + 2
    assert "(awaiting a decision" not in page and "(an end state)" not in page


def confirm_id(page: str) -> int:
    found = re.search(r'name="escalation" value="(\d+)"', page)
    assert found is not None
    return int(found.group(1))


def test_an_operation_escalated_again_says_so_and_what_was_tried(
    stack: Stack, ops: httpx.Client
) -> None:
    op = escalated(stack, NEVER, max_status_requests=1)
    first = op["escalation"]["created_at"]
    answer = stack.client.post(
        f"/v1/operations/{op['id']}/decisions",
        json={"action": "extend", "extra_status_requests": 1},
        headers=stack.headers(operator=True),
    )
    assert answer.status_code == 200, answer.text
    again = wait_until(
        lambda: (
            (seen := stack.get(op["id"], operator=True))["state"] == State.ESCALATED.value
            and seen["escalation"]["created_at"] != first
            and seen
        ),
        20,
        "the operation to escalate again",
    )
    assert again["escalation"]["reason"] == "request_budget_exhausted"
    said = re.compile(
        r"escalated again \(2 times; last decision: extended by 15 minutes and 1 status read "
        r"at 20\d\d-\d\d-\d\d \d\d:\d\d:\d\d UTC by ops-1\)"
    )
    inbox = html_page(ops.get("/console", params={"q": op["id"]}), 200)
    row = inbox.split('id="escalated"')[1].split("</tr>", 2)[1]
    assert op["id"] in row and said.search(row)
    assert 'extend <span class="tried">(tried once)</span>' in row
    assert f'href="/console/operations/{op["id"]}/confirm?action=extend"' in row

    page = html_page(ops.get(f"/console/operations/{op['id']}"), 200)
    assert said.search(page.split('id="repeat"')[1])
    button = page.split('data-action="extend"')[1].split("</button>")[0]
    assert "Tried once before: extended by 15 minutes and 1 status read — ops-1" in button
    assert "it stopped again the same way" in button
    # The operator's words only: not the agent's message, the options once.
    for agents_words in ("Do not report", "Tell your user", "/wait", "`", "Safe options"):
        assert agents_words not in page
    for option in again["escalation"]["options"]:
        assert page.count(option["description"]) == 1
    assert "Every allowed status read was spent" in page
    confirm = ops.get(f"/console/operations/{op['id']}/confirm", params={"action": "extend"})
    assert said.search(html_page(confirm, 200))
