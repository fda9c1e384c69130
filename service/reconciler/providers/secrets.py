"""The webhook secrets a provider file names: read from an injected environment, never
from a file.

Guarantee: a missing or empty variable stops the start with a line naming the
variable, never a value; a value read here is wrapped as ``Secret`` at once. This module
stands below the spec (it knows the ``[webhook]`` table, not the provider): the
credential's own variables are read by ``providers.credentials``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from reconciler.config import Secret
from reconciler.providers.credentials.credential import env_secret
from reconciler.providers.sections import WebhookSpec


def webhook_secrets(
    webhook: WebhookSpec | None, where: Callable[[str], str], environ: Mapping[str, str]
) -> tuple[Secret, ...]:
    """The current webhook secrets (comma-separated in the variable, for rotation);
    ``where`` names a key of the provider's file in messages."""
    if webhook is None:
        return ()
    variable = webhook.secrets_env
    joined = env_secret(where("webhook.secrets_env"), variable, environ).reveal()
    return tuple(Secret(part.strip()) for part in joined.split(",") if part.strip())
