"""The console's sign-in returns only to console pages, however ``next`` is spelled.

Before: ``next`` was checked as written (starts with ``/console``, no scheme or host), so
``/console/../v1/operations`` passed and the browser, resolving the dot segments, landed
on the agent API: same origin, not a console page. ``%2e%2e``, ``%2f`` and ``%252e``
spellings did the same. Now ``next`` is resolved first (``console.return_to``) and only
a console page is followed; anything else goes to the inbox.
"""

from __future__ import annotations

from urllib.parse import quote, urljoin, urlsplit

from tests.support import loopback
from tests.support.console import csrf_of
from tests.support.stack import Stack

LEAVING = [
    "/console/../v1/operations",
    "/console/./../v1/operations",
    "/console/%2e%2e/v1/operations",
    "/console/%2E%2E/v1/operations",
    "/console/.%2e/v1/operations",
    "/console%2f..%2fv1/operations",
    "/console/%252e%252e/v1/operations",
    "/console/..\\v1/operations",
    "/console\\..\\v1\\operations",
    "/console/operations/../../healthz",
    "//evil.example/console",
    "/\\evil.example/console",
    "\\\\evil.example/console",
    "https://evil.example/console",
    "/console/sign-in?next=https://evil.example/",
    "/console/static/../../metrics",
    "/consolex/../v1/operations",
    "/v1/operations?x=/console",
]
STAYING = {
    "/console": "/console",
    "/console/providers": "/console/providers",
    "/console/operations/op_1/../op_2": "/console/operations/op_2",
    "/console/operations/op_1?tab=story": "/console/operations/op_1?tab=story",
    "/console/?state=escalated&provider=sim": "/console?state=escalated&provider=sim",
}


def _sign_in_to(stack: Stack, next_url: str) -> str:
    with loopback.client(base_url=stack.url) as client:
        form = client.get("/console/sign-in", params={"next": next_url})
        assert form.status_code == 200, form.text
        answer = client.post(
            "/console/sign-in",
            data={"csrf": csrf_of(form.text), "token": stack.operator_token, "next": next_url},
        )
        assert answer.status_code == 303, answer.text
        location: str = answer.headers["location"]
        # An operator already signed in is sent on by the form page the same way.
        again = client.get("/console/sign-in", params={"next": next_url})
        assert again.status_code == 303 and again.headers["location"] == location
        return location


def test_sign_in_follows_next_only_to_a_console_page(stack: Stack) -> None:
    for next_url in LEAVING:
        location = _sign_in_to(stack, next_url)
        assert location == "/console", (next_url, location)
    for next_url, expected in STAYING.items():
        location = _sign_in_to(stack, next_url)
        assert location == expected, (next_url, location)
        # What the browser then asks for is the same console page.
        landed = urlsplit(urljoin(f"{stack.url}/console/sign-in", quote(location, safe="/?=&")))
        assert landed.netloc == urlsplit(stack.url).netloc
        assert landed.path.startswith("/console")
