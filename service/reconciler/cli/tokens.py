"""``reconciler tokens``: API tokens and the agents' callback secrets.

A token and a callback secret are printed once, the token on stdout (for scripts) and
the secret on stderr; a listing shows names, scopes, expiry and revocation, never a
token or a secret."""

from __future__ import annotations

import argparse
import sys

from reconciler.cli.durations import parse_duration
from reconciler.commands import database, tokens
from reconciler.config import Settings
from reconciler.core.callback_secrets import agent_key, as_whsec
from reconciler.core.clock import SystemClock, isoformat
from reconciler.core.errors import ConfigError
from reconciler.core.signatures import decode_whsec
from reconciler.core.vocabulary import Scope

DEFAULT_ROTATION_WINDOW = "24h"


def _service_key(settings: Settings) -> bytes | None:
    secret = settings.callback_secret()
    if secret is None:
        return None
    try:
        return decode_whsec(secret.reveal())
    except ValueError:
        raise ConfigError(
            f"{settings.callbacks.signing_secret_env} is not a valid whsec_ secret"
        ) from None


def _show_callback_secret(settings: Settings, name: str, salt: str | None) -> None:
    """The agent's callback secret, once, on stderr (stdout stays the token for scripts)."""
    key = _service_key(settings)
    variable = settings.callbacks.signing_secret_env
    if salt is None:
        return
    if key is None:
        print(
            f"no callback secret shown: {variable} is not set here; run 'reconciler tokens "
            f"rotate-callback-secret --name {name}' where it is",
            file=sys.stderr,
        )
        return
    secret = as_whsec(agent_key(key, salt))
    print(
        f"callback secret for {name!r} (verify its callbacks with it; shown only this once): "
        f"{secret}",
        file=sys.stderr,
    )


def tokens_create(args: argparse.Namespace, settings: Settings) -> int:
    now = SystemClock().now()
    expires = now + parse_duration(args.expires_in, "--expires-in") if args.expires_in else None
    with database.current(settings.database_url) as db:
        token, salt = tokens.create(db, args.name, args.scope, now, expires)
    print(token)
    until = f", expires {isoformat(expires)}" if expires else ""
    print(
        f"token {args.name!r} ({args.scope}{until}) created; it is shown only this once",
        file=sys.stderr,
    )
    _show_callback_secret(settings, args.name, salt)
    return 0


def tokens_rotate(args: argparse.Namespace, settings: Settings) -> int:
    key = _service_key(settings)
    if key is None:
        raise ConfigError(
            f"{settings.callbacks.signing_secret_env} must be set: the agent's secret is "
            "derived from it"
        )
    window = parse_duration(args.window, "--window")
    now = SystemClock().now()
    with database.current(settings.database_url) as db:
        salt = tokens.rotate_callback_salt(db, args.name, now, window)
    print(as_whsec(agent_key(key, salt)))
    print(
        f"new callback secret for {args.name!r}, shown only this once; until "
        f"{isoformat(now + window)} callbacks carry signatures for the old and the new one",
        file=sys.stderr,
    )
    return 0


def tokens_list(args: argparse.Namespace, settings: Settings) -> int:
    with database.current(settings.database_url) as db:
        found = tokens.listing(db)
    now = SystemClock().now()
    for info in found:
        if info.revoked_at:
            status = f"revoked {isoformat(info.revoked_at)}"
        elif info.expires_at and info.expires_at <= now:
            status = f"expired {isoformat(info.expires_at)}"
        else:
            status = "active"
        columns = [info.name, info.scope.value, f"created {isoformat(info.created_at)}", status]
        if info.expires_at and status == "active":
            columns.append(f"expires {isoformat(info.expires_at)}")
        if info.scope is Scope.AGENT and not info.own_callback_secret:
            # Made before per-agent secrets: rotate to give it one.
            columns.append("callback secret: shared")
        print("\t".join(columns))
    return 0


def tokens_revoke(args: argparse.Namespace, settings: Settings) -> int:
    with database.current(settings.database_url) as db:
        info = tokens.revoke(db, args.name, SystemClock().now())
    print(
        f"token {info.name!r} revoked at {isoformat(info.revoked_at)}; running services "
        "refuse it within a few seconds"
    )
    return 0
