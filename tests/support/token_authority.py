"""A token endpoint of the tests' own, and an API that takes only the tokens it issued.

``TokenAuthority`` issues short-lived bearer tokens on the test's clock and says whether a
token is valid now; it answers OAuth2 client-credentials requests (RFC 6749 §4.4, HTTP
Basic client authentication) as an ``httpx`` handler, and Google's service-account grant
(RFC 7523: a JWT assertion signed with the account's key, verified here with its public
key) as an app for real HTTP, since google-auth fetches its tokens itself.
``guarded(api)`` puts the authority in front of a provider's handler: a call without a
valid token is answered 401, as a real API refuses an expired token.
"""

from __future__ import annotations

import base64
import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import parse_qs

import httpx
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from reconciler.core.clock import Clock

CLIENT_ID = "reconciler-client"
CLIENT_SECRET = "client-secret-for-tests-0123456789"
GOOGLE_SCOPE = "https://www.googleapis.com/auth/cloud-platform"


@dataclass
class TokenAuthority:
    clock: Clock | None = None  # the test's; set before the first token is issued
    lifetime_seconds: float = 3600.0
    tokens: dict[str, datetime] = field(default_factory=dict)  # token -> when it expires
    refuse: bool = False  # answer every token request "invalid_client"
    revoked: set[str] = field(default_factory=set)
    requests: int = 0  # token requests answered
    refused_calls: int = 0  # API calls answered 401
    public_key: Any = None  # the service account's, for Google's grant
    fixed_token: str | None = None  # issue this value every time (a replay's one token)

    def now(self) -> datetime:
        assert self.clock is not None, "the authority has no clock yet"
        return self.clock.now()

    def issue(self) -> dict[str, Any]:
        token = self.fixed_token or "tok-" + secrets.token_hex(12)
        self.tokens[token] = self.now() + timedelta(seconds=self.lifetime_seconds)
        return {"access_token": token, "token_type": "Bearer", "expires_in": self.lifetime_seconds}

    def valid(self, authorization: str | None) -> bool:
        token = (authorization or "").removeprefix("Bearer ")
        expires = self.tokens.get(token)
        return expires is not None and self.now() < expires and token not in self.revoked

    def revoke_all(self) -> None:
        self.revoked.update(self.tokens)

    # --- OAuth2 client credentials, as an httpx handler --------------------------------

    def oauth2(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        form = parse_qs(request.content.decode())
        basic = base64.b64encode(f"{CLIENT_ID}:{CLIENT_SECRET}".encode()).decode()
        if self.refuse or request.headers.get("authorization") != f"Basic {basic}":
            return httpx.Response(
                401, json={"error": "invalid_client", "error_description": "unknown client"}
            )
        if form.get("grant_type") != ["client_credentials"]:
            return httpx.Response(400, json={"error": "unsupported_grant_type"})
        return httpx.Response(200, json=self.issue())

    def guarded(
        self, api: Callable[[httpx.Request], httpx.Response], token_host: str, api_token: str
    ) -> Callable[[httpx.Request], httpx.Response]:
        """A handler for both hosts: the token endpoint, and the API behind the authority
        (a valid token is swapped for the API's own before the API sees the call)."""

        def handle(request: httpx.Request) -> httpx.Response:
            if request.url.host == token_host:
                return self.oauth2(request)
            if not self.valid(request.headers.get("authorization")):
                self.refused_calls += 1
                return httpx.Response(401, json={"message": "the token is not valid"})
            request.headers["authorization"] = f"Bearer {api_token}"
            return api(request)

        return handle

    # --- Google's service-account grant, over real HTTP --------------------------------

    def google_app(self) -> Starlette:
        async def token(request: Request) -> Response:
            self.requests += 1
            form = parse_qs((await request.body()).decode())
            assertion = form.get("assertion", [""])[0]
            claims = self._verified(assertion)
            grant = form.get("grant_type", [""])[0]
            if self.refuse or claims is None or not grant.endswith("jwt-bearer"):
                return JSONResponse({"error": "invalid_grant"}, status_code=400)
            if GOOGLE_SCOPE not in str(claims.get("scope", "")).split():
                return JSONResponse({"error": "invalid_scope"}, status_code=400)
            return JSONResponse(self.issue())

        return Starlette(routes=[Route("/token", token, methods=["POST"])])

    def _verified(self, assertion: str) -> dict[str, Any] | None:
        """The JWT's claims when its RS256 signature is the service account's."""
        try:
            head, body, signature = assertion.split(".")
            self.public_key.verify(
                _unb64(signature),
                f"{head}.{body}".encode(),
                padding.PKCS1v15(),
                hashes.SHA256(),
            )
            claims: dict[str, Any] = json.loads(_unb64(body))
        except Exception:
            return None
        return claims


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def service_account_file(path: Any, token_uri: str) -> Any:
    """A service-account key file whose token endpoint is ``token_uri``; returns the
    account's public key (what the authority verifies assertions with)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    path.write_text(
        json.dumps(
            {
                "type": "service_account",
                "project_id": "reconciler-tests",
                "private_key_id": "key-1",
                "private_key": pem,
                "client_email": "reconciler@reconciler-tests.iam.gserviceaccount.com",
                "client_id": "1",
                "token_uri": token_uri,
            }
        )
    )
    return key.public_key()
