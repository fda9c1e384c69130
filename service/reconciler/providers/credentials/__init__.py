"""The provider's credential: obtained when first needed, kept, refreshed before it
expires, and put on each request to the provider's own origin.

One ``Credential`` per provider (``build_credential`` reads ``[auth]``):

- ``bearer`` / ``header`` with ``token_env``/``value_env``: a value read from the
  environment at load (``static.EnvHeader``); with ``token_file``: a file read again
  whenever it changes, so a mounted secret rotates without a restart
  (``static.FileHeader``);
- ``oauth2``: client credentials (RFC 6749 §4.4) from ``token_url`` (``oauth2``);
- ``google``: Application Default Credentials through ``google-auth`` (``google``);
- ``aws_sigv4``: every request signed with SigV4, credentials from botocore's chain
  (``aws``).

Guarantee: a token is fetched before its first use and again before it expires, never
once per call, by one fetch however many calls wait for it (``tokens.Refreshing``,
``core.token_refresh``). A ``401`` (for AWS also an expired-token answer) renews the
credential once and the exchange sends that call once more (``providers.exchange``).
A credential that cannot be obtained raises ``CredentialUnavailable``: the call is not
sent, and a source that refused is not asked again at once. No value is ever in a
repr, a message or a ``source``; ``source`` says where the credential comes from.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Mapping

import httpx

from reconciler.core.clock import Clock
from reconciler.core.errors import ConfigError
from reconciler.providers.credentials.credential import Credential, env_secret
from reconciler.providers.sections import AuthSpec, AuthType

__all__ = ["EXTRAS", "Credential", "build_credential", "check_credential", "missing_extra"]

# What each cloud auth type imports, and the extra that installs it.
EXTRAS = {AuthType.AWS_SIGV4: ("botocore", "aws"), AuthType.GOOGLE: ("google.auth", "google")}


def missing_extra(auth: AuthSpec) -> str | None:
    """The extra a cloud auth type needs and this install lacks, or None."""
    found = EXTRAS.get(auth.type)
    if found is None:
        return None
    module, extra = found
    try:
        present = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        present = False
    return None if present else extra


def check_credential(
    auth: AuthSpec, where: Callable[[str], str], environ: Mapping[str, str]
) -> None:
    """What can be checked at load without a network call: the extra is installed, every
    variable the credential names is set, a token file can be read. ``ConfigError``."""
    extra = missing_extra(auth)
    if extra is not None:
        raise ConfigError(
            f'{where("auth.type")}: "{auth.type.value}" needs the optional extra '
            f"reconciler[{extra}] (pip install 'reconciler[{extra}]')"
        )
    named = [("token_env", auth.token_env), ("value_env", auth.value_env)]
    named += [("client_id_env", auth.client_id_env), ("client_secret_env", auth.client_secret_env)]
    for key, variable in named:
        if variable is not None:
            env_secret(where(f"auth.{key}"), variable, environ)
    if auth.token_file is not None and not os.access(auth.token_file, os.R_OK):
        raise ConfigError(f"{where('auth.token_file')}: cannot read {auth.token_file}")


def build_credential(
    auth: AuthSpec,
    where: Callable[[str], str],
    environ: Mapping[str, str],
    clock: Clock,
    transport: httpx.AsyncBaseTransport | None = None,
) -> Credential | None:
    """The provider's credential (None for ``auth.type = "none"``); ``where`` names a key of
    the provider's file in messages. A missing variable or extra is a ``ConfigError``."""
    check_credential(auth, where, environ)
    kind = auth.type
    if kind is AuthType.NONE:
        return None
    if kind in (AuthType.BEARER, AuthType.HEADER):
        from reconciler.providers.credentials.static import static_credential

        return static_credential(auth, where, environ)
    if kind is AuthType.OAUTH2:
        from reconciler.providers.credentials.oauth2 import OAuth2Credential

        assert auth.token_url and auth.client_id_env and auth.client_secret_env
        return OAuth2Credential(
            auth.token_url,
            env_secret(where("auth.client_id_env"), auth.client_id_env, environ),
            env_secret(where("auth.client_secret_env"), auth.client_secret_env, environ),
            auth.scope,
            clock,
            transport,
        )
    if kind is AuthType.GOOGLE:
        from reconciler.providers.credentials.google import GoogleCredential

        return GoogleCredential(auth.google_scopes, clock)
    from reconciler.providers.credentials.aws import AwsSigV4

    assert auth.service and auth.region
    return AwsSigV4(auth.service, auth.region, environ)
