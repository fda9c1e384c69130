"""The secrets a provider file names: read from an injected environment, never from a file.

Guarantee: a missing or empty variable stops the start with a line naming the
variable, never a value; a value read here is wrapped as ``Secret`` at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from reconciler.config import Secret
from reconciler.providers.credentials import env_secret

if TYPE_CHECKING:
    from reconciler.providers.spec import ProviderSpec


def env_value(spec: ProviderSpec, key: str, variable: str, environ: Mapping[str, str]) -> Secret:
    """Read one variable; the error names the variable, never a value."""
    return env_secret(spec.where(key), variable, environ)


def auth_secret(spec: ProviderSpec, environ: Mapping[str, str]) -> Secret | None:
    """The credential the provider's ``auth`` names, or None for ``type = "none"``."""
    found = spec.auth.env_key
    if found is None:
        return None
    return env_value(spec, f"auth.{found[0]}", found[1], environ)


def webhook_secrets(spec: ProviderSpec, environ: Mapping[str, str]) -> tuple[Secret, ...]:
    """The current webhook secrets (comma-separated in the variable, for rotation)."""
    if spec.webhook is None:
        return ()
    variable = spec.webhook.secrets_env
    joined = env_value(spec, "webhook.secrets_env", variable, environ).reveal()
    return tuple(Secret(part.strip()) for part in joined.split(",") if part.strip())
