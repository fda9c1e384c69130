"""The httpx client every outbound call is made with: provider calls and agent callbacks.

It picks up nothing from the environment (no proxy or netrc behind the provider file's
or the SSRF guard's back) and follows no redirect on its own: the callers decide what a
3xx means. It keeps no cookies. Each call carries what the code gives it (the provider file's
credential, a signature) and nothing a peer set earlier: a provider's ``Set-Cookie``
never rides into a later call made for another operation or another agent. It also
spares every response httpx's cookie extraction, which builds a urllib request for it
and cost about 2 % of the service's CPU under load (``bench/throughput.py``).
"""

from __future__ import annotations

from http.cookiejar import Cookie, CookieJar
from typing import Any

import httpx


class _RefusingJar(CookieJar):
    def set_cookie(self, cookie: Cookie) -> None:
        raise TypeError("an outbound client keeps no cookies")


class _NoCookies(httpx.Cookies):
    def __init__(self) -> None:
        super().__init__(_RefusingJar())

    def extract_cookies(self, response: httpx.Response) -> None:
        return None


_NONE = _NoCookies()  # one for every client: nothing can be put in it


class OutboundClient(httpx.AsyncClient):
    """``httpx.AsyncClient`` without the environment, redirects or cookies (see the module)."""

    def __init__(self, **options: Any) -> None:
        super().__init__(trust_env=False, follow_redirects=False, **options)

    @property
    def cookies(self) -> httpx.Cookies:
        return _NONE

    @cookies.setter
    def cookies(self, cookies: httpx._types.CookieTypes) -> None:
        raise TypeError("an outbound client keeps no cookies")
