"""The operator console over plain HTTP, for tests that do not need a browser: signing in,
an escalated operation to look at, a page's checked text, a decision's form."""

from __future__ import annotations

import html
import re
from typing import Any

import httpx

from reconciler.core.states import State
from tests.support import loopback
from tests.support.stack import Stack

CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def csrf_of(html: str) -> str:
    found = CSRF.search(html)
    assert found is not None, "the page has no CSRF field"
    return found.group(1)


def sign_in(base_url: str, token: str) -> tuple[httpx.Client, httpx.Response]:
    """A client holding whatever cookie the sign-in gave (none when refused), and the answer."""
    client = loopback.client(base_url=base_url, timeout=30.0, follow_redirects=False)
    form = client.get("/console/sign-in")
    assert form.status_code == 200, form.text
    answer = client.post(
        "/console/sign-in", data={"csrf": csrf_of(form.text), "token": token, "next": "/console"}
    )
    return client, answer


def operator_client(base_url: str, token: str) -> httpx.Client:
    client, answer = sign_in(base_url, token)
    assert answer.status_code == 303, answer.text
    assert "reconciler_console" in client.cookies
    return client


def escalated(stack: Stack, request: dict[str, Any], **fields: Any) -> dict[str, Any]:
    created = stack.create(request, **fields)
    assert created.status_code == 202, created.text
    op = stack.wait_state(created.json()["id"], {State.ESCALATED.value}, timeout=20)
    assert op["state"] == State.ESCALATED.value, op
    return op


def html_page(response: httpx.Response, status: int) -> str:
    """The page's text with entities decoded (checked: HTML, the console's headers)."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in response.headers["content-security-policy"]
    assert response.headers["cache-control"] == "no-store"
    return html.unescape(response.text)


def decide_form(client: httpx.Client, op_id: str, **fields: str) -> httpx.Response:
    return client.post(f"/console/operations/{op_id}/decisions", data=fields)
