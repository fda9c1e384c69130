"""httpx to the tests' own servers on 127.0.0.1, with the process's one TLS context.

httpx builds a verifying context for every client and every ``httpx.get``, whatever the
scheme; loading its roots costs about 45 ms of CPU, paid again on each look of a wait and
each request of a loop. ``providers.aiohttp_transport.default_tls_context`` is made once
per process. A client given its own ``transport`` builds no context and needs none of this.
"""

from __future__ import annotations

from typing import Any

import httpx

from reconciler.providers.aiohttp_transport import default_tls_context


def get(url: str, **kw: Any) -> httpx.Response:
    return httpx.get(url, verify=default_tls_context(), **kw)


def post(url: str, **kw: Any) -> httpx.Response:
    return httpx.post(url, verify=default_tls_context(), **kw)


def delete(url: str, **kw: Any) -> httpx.Response:
    return httpx.delete(url, verify=default_tls_context(), **kw)


def client(**kw: Any) -> httpx.Client:
    return httpx.Client(verify=default_tls_context(), **kw)


def async_client(**kw: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(verify=default_tls_context(), **kw)
