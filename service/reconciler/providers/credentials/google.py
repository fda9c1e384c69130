"""Google Application Default Credentials, through ``google-auth`` (``reconciler[google]``).

``google.auth.default(scopes=...)`` finds the credential as Google's client libraries do:
a service-account file named by ``GOOGLE_APPLICATION_CREDENTIALS``, workload identity
federation, the user credentials of ``gcloud auth application-default login``, or the
metadata server of the machine the service runs on. Finding it and fetching a token are
blocking calls (the metadata server, a token endpoint), so both run in a worker thread;
the token (an hour, usually) is fetched again before it expires
(``tokens.Refreshing``), never once per call.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import anyio.to_thread

from reconciler.config import Secret
from reconciler.core.clock import Clock
from reconciler.core.errors import CredentialUnavailable
from reconciler.providers.credentials.tokens import BearerToken, Token

# What each kind of credential google.auth.default finds is, in words.
_SOURCES = {
    "google.oauth2.service_account": "a service account file",
    "google.auth.compute_engine.credentials": "the metadata server",
    "google.auth.identity_pool": "workload identity federation",
    "google.auth.aws": "workload identity federation (AWS)",
    "google.auth.pluggable": "workload identity federation (executable)",
    "google.auth.external_account_authorized_user": "workload identity federation (user)",
    "google.auth.impersonated_credentials": "service account impersonation",
    "google.oauth2.credentials": "user credentials (gcloud auth application-default login)",
}


class GoogleCredential(BearerToken):
    def __init__(self, scopes: tuple[str, ...], clock: Clock) -> None:
        self._scopes = scopes
        self._found: Any = None  # the google-auth credentials, once found
        super().__init__(self._fetch, clock)
        self.source = "Google Application Default Credentials (not obtained yet)"

    async def _fetch(self) -> Token:
        return await anyio.to_thread.run_sync(self._fetch_blocking)

    def _fetch_blocking(self) -> Token:
        import google.auth
        import google.auth.exceptions as errors
        import urllib3
        from google.auth.transport.urllib3 import Request

        try:
            if self._found is None:
                self._found, _ = google.auth.default(scopes=list(self._scopes))
                kind = type(self._found).__module__
                self.source = "Google Application Default Credentials: " + _SOURCES.get(kind, kind)
            request = Request(urllib3.PoolManager(retries=False))  # type: ignore[no-untyped-call]
            self._found.refresh(request)
        except errors.DefaultCredentialsError as exc:
            raise CredentialUnavailable(
                f"no Google credentials found ({_first_line(exc)})", refused=True
            ) from None
        except errors.TransportError as exc:
            raise CredentialUnavailable(
                f"Google's token endpoint gave no answer ({_first_line(exc)})", refused=False
            ) from None
        except errors.RefreshError as exc:
            retryable = bool(getattr(exc, "retryable", False))
            raise CredentialUnavailable(
                f"Google refused the credential ({_first_line(exc)})", refused=not retryable
            ) from None
        token = getattr(self._found, "token", None)
        if not isinstance(token, str) or not token:
            raise CredentialUnavailable("Google gave no access token", refused=True)
        expiry = getattr(self._found, "expiry", None)
        life = None
        if isinstance(expiry, datetime):
            # google-auth keeps expiry as naive UTC.
            ends = expiry if expiry.tzinfo else expiry.replace(tzinfo=UTC)
            life = max((ends - datetime.now(UTC)).total_seconds(), 0.0)
        return Token(Secret(token), life)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:200]
