"""A token that expires, kept and fetched again before it does: one fetch at a time.

``Refreshing`` holds the current token and when it is fetched again
(``core.token_refresh.refresh_at`` on the injected clock). Every call asks ``value()``;
only when the token is due does one of them fetch, under a lock, and the others wait
for that fetch and use its token. A fetch that fails is not repeated at once
(``retry_delay``): until then each call is refused with the failure's reason, or, while
the last token has not expired yet, goes out with it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

import httpx

from reconciler.config import Secret
from reconciler.core.clock import Clock
from reconciler.core.errors import CredentialUnavailable
from reconciler.core.token_refresh import refresh_at, retry_delay
from reconciler.providers.credentials.credential import Credential


@dataclass(frozen=True)
class Token:
    value: Secret
    lifetime_seconds: float | None  # as the source said; None: not said


class Refreshing:
    def __init__(self, fetch: Callable[[], Awaitable[Token]], clock: Clock) -> None:
        self._fetch = fetch
        self._clock = clock
        self._lock = asyncio.Lock()
        self._token: Token | None = None
        self._due: datetime | None = None  # when the token is fetched again
        self._expires: datetime | None = None
        self._failures = 0
        self._retry: datetime | None = None
        self._failure: CredentialUnavailable | None = None
        self.fetches = 0  # every fetch tried, for the metrics and the benchmarks

    def _fresh(self, now: datetime) -> bool:
        return self._token is not None and (self._due is None or now < self._due)

    async def value(self) -> Secret:
        if self._fresh(self._clock.now()):
            assert self._token is not None
            return self._token.value
        async with self._lock:
            return await self._refreshed(force=False)

    async def renew(self) -> bool:
        """A fresh token now (after a 401): True when one was fetched, False while the
        source is not to be asked again yet; ``CredentialUnavailable`` when it refused."""
        async with self._lock:
            before = self._token
            await self._refreshed(force=True)
            if self._token is before and self._failure is not None:
                raise self._failure
            return self._token is not before

    async def _refreshed(self, *, force: bool) -> Secret:
        now = self._clock.now()
        if not force and self._fresh(now):  # another caller fetched it while we waited
            assert self._token is not None
            return self._token.value
        if self._retry is not None and now < self._retry:
            return self._fallback(now)
        self.fetches += 1
        try:
            token = await self._fetch()
        except CredentialUnavailable as exc:
            self._failures += 1
            self._retry = now + timedelta(seconds=retry_delay(self._failures))
            self._failure = exc
            return self._fallback(now)
        now = self._clock.now()
        self._token, self._failures, self._retry, self._failure = token, 0, None, None
        self._due = refresh_at(now, token.lifetime_seconds)
        life = token.lifetime_seconds
        self._expires = None if life is None else now + timedelta(seconds=life)
        return token.value

    def _fallback(self, now: datetime) -> Secret:
        """While the source is failing: the last token if it still lives, else refuse."""
        if self._token is not None and (self._expires is None or now < self._expires):
            return self._token.value
        assert self._failure is not None
        raise self._failure


class BearerToken(Credential):
    """A credential that is a token fetched by ``fetch`` (OAuth2, Google), sent as
    ``Authorization: Bearer`` and fetched again when it is due or refused."""

    def __init__(self, fetch: Callable[[], Awaitable[Token]], clock: Clock) -> None:
        self.tokens = Refreshing(fetch, clock)

    async def apply(self, request: httpx.Request) -> None:
        token = await self.tokens.value()
        request.headers["Authorization"] = "Bearer " + token.reveal()

    async def renew(self) -> bool:
        return await self.tokens.renew()
