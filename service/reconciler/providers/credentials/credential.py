"""What the exchange asks of a provider's credential (each kind of credential in this
package is one), and the reading of one environment variable as a secret.

Apart from the package's ``__init__`` (which builds the credential a provider file
names) so that the kinds import this and the builder imports them: no circle.
"""

from __future__ import annotations

from collections.abc import Mapping

import httpx

from reconciler.config import Secret
from reconciler.core.errors import ConfigError


class Credential:
    """What the exchange asks of a provider's credential."""

    source = "none"

    def static_header(self) -> tuple[str, str] | None:
        """A header that never changes (a value read at load): put on with the other
        headers, with no work per call. None: ``apply`` runs on each request."""
        return None

    async def apply(self, request: httpx.Request) -> None:
        """Put the credential on ``request`` (a header, or a signature over all of it).
        Raises ``CredentialUnavailable`` when it cannot be obtained."""
        raise NotImplementedError

    async def renew(self) -> bool:
        """After an answer that refused the credential: obtain a fresh one now. False when
        there is nothing fresher to try (the call is not sent again); raises
        ``CredentialUnavailable`` when a fresh one could not be obtained."""
        return False

    def renews_on(self, status: int | None, body: bytes | None) -> bool:
        """Whether an answer says this credential needs renewing (a 401)."""
        return status == 401

    async def obtain(self) -> str:
        """Obtain the credential now (``providers check``); returns ``source``."""
        await self.apply(httpx.Request("GET", "http://credential.check/"))
        return self.source

    async def aclose(self) -> None:
        return None


def env_secret(key: str, variable: str, environ: Mapping[str, str]) -> Secret:
    """One variable as a ``Secret``; the error names the key and variable, never a value."""
    value = environ.get(variable)
    if value is None:
        raise ConfigError(f"{key}: environment variable {variable} is not set")
    if not value.strip():
        raise ConfigError(f"{key}: environment variable {variable} is empty")
    return Secret(value)
