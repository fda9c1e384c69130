"""Signing in to the operator console over plain HTTP, for tests that do not need a browser."""

from __future__ import annotations

import re

import httpx

from tests.support import loopback

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
