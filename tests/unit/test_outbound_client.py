"""The outbound client keeps no cookies: a peer's Set-Cookie never rides into a later call."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from reconciler.providers.client import OutboundClient


def test_a_set_cookie_is_not_sent_back() -> None:
    seen: list[str | None] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("cookie"))
        return httpx.Response(200, headers={"set-cookie": "session=abc; Path=/"})

    async def two_calls() -> int:
        async with OutboundClient(transport=httpx.MockTransport(answer)) as client:
            await client.get("http://provider.test/v1/jobs/1")
            await client.get("http://provider.test/v1/jobs/2")
            return len(client.cookies)

    assert asyncio.run(two_calls()) == 0
    assert seen == [None, None]


def test_nothing_can_be_put_in_its_cookies() -> None:
    client = OutboundClient()
    with pytest.raises(TypeError):
        client.cookies.set("session", "abc", domain="provider.test")
    with pytest.raises(TypeError):
        client.cookies = {"session": "abc"}
