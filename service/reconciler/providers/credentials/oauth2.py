"""OAuth2 client credentials (RFC 6749 §4.4): a bearer token from the token endpoint.

The client authenticates with HTTP Basic (§2.3.1, which every server supports) and asks
for ``grant_type=client_credentials`` and the file's ``scope``. The answer's
``access_token`` is used until ``core.token_refresh`` says to fetch again (from its
``expires_in``). A ``4xx`` from the endpoint (``invalid_client``, ``invalid_scope``...) is a
refusal: ``authorization_denied``, with the endpoint's ``error`` and its description. A
``5xx`` or no answer is "not now".
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from reconciler.config import Secret
from reconciler.core.clock import Clock
from reconciler.core.errors import CredentialUnavailable
from reconciler.core.strict_json import shown
from reconciler.providers.credentials.tokens import BearerToken, Token

TOKEN_TIMEOUT_SECONDS = 10.0
MAX_TOKEN_ANSWER_BYTES = 65_536


class OAuth2Credential(BearerToken):
    def __init__(
        self,
        token_url: str,
        client_id: Secret,
        client_secret: Secret,
        scope: str | None,
        clock: Clock,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._url = token_url
        self._client_id = client_id
        self._client_secret = client_secret
        self._scope = scope
        self._http = httpx.AsyncClient(transport=transport, timeout=TOKEN_TIMEOUT_SECONDS)
        super().__init__(self._fetch, clock)
        self.source = f"OAuth2 client credentials from {token_url}"

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _fetch(self) -> Token:
        form = {"grant_type": "client_credentials"}
        if self._scope:
            form["scope"] = self._scope
        try:
            response = await self._http.post(
                self._url,
                data=form,
                auth=(self._client_id.reveal(), self._client_secret.reveal()),
                headers={"Accept": "application/json"},
            )
        except httpx.HTTPError as exc:
            raise CredentialUnavailable(
                f"the token endpoint {self._url} gave no answer ({type(exc).__name__})",
                refused=False,
            ) from None
        body = _json(response.content[:MAX_TOKEN_ANSWER_BYTES])
        if 400 <= response.status_code < 500:
            raise CredentialUnavailable(
                f"the token endpoint {self._url} refused this client "
                f"(HTTP {response.status_code}{_said(body)})",
                refused=True,
            )
        if response.status_code != 200:
            raise CredentialUnavailable(
                f"the token endpoint {self._url} answered HTTP {response.status_code}",
                refused=False,
            )
        return _token(body, self._url)


def _json(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return None


def _said(body: Any) -> str:
    if not isinstance(body, dict):
        return ""
    parts = [str(body.get(k)) for k in ("error", "error_description") if body.get(k)]
    return ": " + shown(": ".join(parts), 200) if parts else ""


def _token(body: Any, url: str) -> Token:
    token = body.get("access_token") if isinstance(body, dict) else None
    kind = body.get("token_type", "bearer") if isinstance(body, dict) else None
    if not isinstance(token, str) or not token.strip() or not token.isprintable():
        raise CredentialUnavailable(f"the token endpoint {url} gave no access_token", refused=True)
    if not isinstance(kind, str) or kind.lower() != "bearer":
        raise CredentialUnavailable(
            f"the token endpoint {url} gave a token of type {shown(str(kind), 40)!r}, not bearer",
            refused=True,
        )
    life = body.get("expires_in")
    if isinstance(life, str) and life.isdigit():
        life = int(life)  # some servers send it as a string
    valid = isinstance(life, int | float) and not isinstance(life, bool) and life > 0
    return Token(Secret(token.strip()), float(life) if valid else None)
