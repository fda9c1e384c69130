"""httpx to the tests' own servers on 127.0.0.1, with the process's one TLS context.

httpx builds a verifying context for every client and every ``httpx.get``, whatever the
scheme; loading its roots costs about 45 ms of CPU, paid again on each try of a readiness
poll. ``providers.aiohttp_transport.default_tls_context`` is made once per process.
"""

from __future__ import annotations

from typing import Any

import httpx

from reconciler.providers.aiohttp_transport import default_tls_context


def get(url: str, **kw: Any) -> httpx.Response:
    return httpx.get(url, verify=default_tls_context(), **kw)


def post(url: str, **kw: Any) -> httpx.Response:
    return httpx.post(url, verify=default_tls_context(), **kw)


def client(**kw: Any) -> httpx.Client:
    return httpx.Client(verify=default_tls_context(), **kw)
