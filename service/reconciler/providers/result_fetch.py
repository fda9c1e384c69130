"""Fetching a result file, and where a provider may send the service for one.

``[result].path`` is rendered with ``{job_id}``/``{result_ref}`` (a path on the
provider's origin); otherwise ``result_ref`` itself is fetched when it is an http(s)
URL or a path. The errors file of a JSON Lines result is ``errors_path`` with
``{errors_ref}``. A redirect is followed by hand (at most ``MAX_REDIRECTS``).

A URL the provider hands us (``result_ref``, a redirect's ``Location``) is untrusted
input: it is fetched only when it is on the provider's own origin (its ``base_url``,
whatever address that is: the operator configured it) or on a host the provider file
lists (``[result] hosts``, exact names or ``*.domain``), and a listed host must also
pass the guard that protects callbacks (``outbound.ssrf``: http or https, no user
information, no loopback, private, link-local or metadata address unless
``callbacks.allow_hosts`` lists it), checked against the addresses it resolves to now,
which are the ones connected to. Anything else is refused before a request, naming why
(a refused fetch ends the collection ``result_unavailable``). The credential and the
file's static headers go to the provider's origin only, redirects included: httpx drops
only ``Authorization`` on a cross-origin redirect, not an API-key header.

Bodies are spooled (``providers.spool``) within ``max_bytes`` after decoding.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable, Sequence

import httpx

from reconciler.core.errors import InvalidRequest, ResolutionFailed
from reconciler.core.provider_calls import CallResult
from reconciler.core.vocabulary import TransportError
from reconciler.providers.call_request import CallRequest
from reconciler.providers.exchange import Exchange, Pinned
from reconciler.providers.spec import ProviderSpec, ResultSpec
from reconciler.providers.templates import ERRORS_REF, RESULT_REF, Values

MAX_REDIRECTS = 5
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
URL_NAME = "the result URL"

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
# Checks a URL on a listed host and resolves it: the addresses it may be fetched from.
# Raises InvalidRequest (refused: never sent) or ResolutionFailed (try again later).
UrlGuard = Callable[[str], Awaitable[Sequence[IPAddress]]]


def host_listed(host: str, hosts: Sequence[str]) -> bool:
    """Whether ``[result] hosts`` names ``host``: exactly, or under a ``*.domain`` entry."""
    name = host.lower().rstrip(".")
    for entry in hosts:
        if entry.startswith("*.") and name.endswith(entry[1:]) and len(name) > len(entry) - 1:
            return True
        if name == entry:
            return True
    return False


def _pinned(url: httpx.URL, address: IPAddress) -> Pinned:
    default = {"http": 80, "https": 443}[url.scheme]
    port = url.port or default
    host = url.host
    shown = f"[{host}]" if ":" in host else host
    sni = host.rstrip(".") if url.scheme == "https" and not _is_address(host) else None
    return Pinned(
        httpx.URL(scheme=url.scheme, host=str(address), port=port, raw_path=url.raw_path),
        shown if port == default else f"{shown}:{port}",
        sni,
    )


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class ResultFetcher:
    def __init__(self, spec: ProviderSpec, exchange: Exchange, guard: UrlGuard | None) -> None:
        self._spec = spec
        self._exchange = exchange
        self._guard = guard

    async def fetch(self, values: Values, trace_id: str, result_ref: str | None) -> CallResult:
        """The result file (not ``from_status``, which the adapter re-reads as a status)."""
        result = self._spec.result or ResultSpec()
        ex = self._exchange
        values = {**values, RESULT_REF: result_ref}
        if result.path is not None:
            built = self._exchange.build(result, result.path, values)
            if isinstance(built, CallResult):
                return built
            return await self._follow(result, ex.url(built.path), trace_id, built)
        url = self._result_url(result_ref)
        if url is None:
            reason = "result_ref is not an http(s) URL or path and [result] has no path"
            return ex.refused(result.method, "", reason)
        built = self._exchange.build(result, "", values)
        if isinstance(built, CallResult):
            return built
        return await self._follow(result, url, trace_id, built)

    async def fetch_errors(self, values: Values, trace_id: str, errors_ref: str) -> CallResult:
        """The separate errors file of a JSONL result (``errors_path`` with ``{errors_ref}``)."""
        result = self._spec.result or ResultSpec()
        ex = self._exchange
        if result.errors_path is None:
            return ex.refused(result.method, "", "the provider file has no result.errors_path")
        built = self._exchange.build(result, result.errors_path, {**values, ERRORS_REF: errors_ref})
        if isinstance(built, CallResult):
            return built
        return await self._follow(result, ex.url(built.path), trace_id, built)

    def _result_url(self, result_ref: str | None) -> httpx.URL | None:
        if not result_ref or not (result_ref.startswith("/") or "://" in result_ref):
            return None
        try:
            url = self._exchange.base.join(result_ref)
        except httpx.InvalidURL:
            return None
        return url if url.scheme in ("http", "https") and url.host else None

    async def _follow(
        self, result: ResultSpec, url: httpx.URL, trace_id: str, built: CallRequest
    ) -> CallResult:
        method = result.method
        for _ in range(MAX_REDIRECTS + 1):
            if url.userinfo:
                # A password in a URL the provider handed us is no credential of ours to send
                # (and the client would refuse to combine it with a header of its own).
                target = self._exchange.target(url)
                return self._exchange.refused(method, target, "the URL carries user info")
            call = await self._fetch_once(result, method, url, trace_id, built)
            if call.http_status not in _REDIRECTS or not call.location:
                return call
            try:
                url = url.join(call.location)
            except httpx.InvalidURL:
                return call
            if url.scheme not in ("http", "https"):
                target = self._exchange.target(url)
                return self._exchange.refused(method, target, "redirected to a non-http(s) URL")
            method = "GET" if call.http_status == 303 else method
        target = self._exchange.target(url)
        return self._exchange.refused(method, target, f"more than {MAX_REDIRECTS} redirects")

    async def _fetch_once(
        self, result: ResultSpec, method: str, url: httpx.URL, trace_id: str, built: CallRequest
    ) -> CallResult:
        ex = self._exchange
        # The file's headers and body go to the provider's own origin only, as its static
        # headers and credential do; a 303 turns the call into a plain GET.
        own = ex.own(url)
        extra = dict(built.headers) if own else None
        content = built.content if own and method == built.method else None

        async def send(pinned: Pinned | None = None) -> CallResult:
            return await ex.call(
                method,
                url,
                trace_id,
                timeout=result.timeout_seconds,
                limit=result.max_bytes,
                json_expected=False,
                extra=extra,
                content=content,
                spool=True,
                pinned=pinned,
            )

        if own:
            return await send()
        target = ex.target(url)
        if not host_listed(url.host, result.hosts):
            reason = (
                f"{URL_NAME} is on {url.host or 'no host'}, which is neither the provider's "
                "origin nor listed in [result] hosts"
            )
            return ex.refused(method, target, reason)
        if self._guard is None:
            return ex.refused(method, target, "no URL guard: foreign result hosts are refused")
        try:
            addresses = await self._guard(str(url.copy_with(raw_path=b"/", fragment=None)))
        except ResolutionFailed as exc:
            return ex.unsent(method, target, TransportError.DNS, exc.message)
        except InvalidRequest as exc:
            return ex.refused(method, target, exc.message)
        call = ex.refused(method, target, f"{URL_NAME}'s host has no address")
        for address in addresses:
            call = await send(_pinned(url, address))
            if call.maybe_delivered:
                break  # connected: another address would be a second request
        return call
