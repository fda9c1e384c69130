"""Console sessions: a signed cookie naming the operator token's row, and CSRF tokens bound to it.

Guarantee: a cookie is accepted only with a valid signature and before its
expiry; it carries the token's row id and name, never the token or its digest.
Each session has a random id, and its CSRF token is an HMAC of that id, so a
form from one session is refused in another. Pure apart from ``secrets``.

The signing key (``key_from``): ``RECONCILER_CONSOLE_SECRET`` (the variable is
``[console] session_secret_env``), the same value on every replica so any of
them accepts a session that another issued. Without it each process makes a
random key at start: fine for one process (sessions end at a restart), and
``key_from`` says so when the database is PostgreSQL, where replicas are
likely. The key is never logged; only that a variable is missing.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from reconciler.config import Secret, Settings
from reconciler.core.errors import ConfigError

log = logging.getLogger("reconciler.console")

SESSION_COOKIE = "reconciler_console"
SIGNIN_COOKIE = "reconciler_console_signin"
MIN_SECRET_CHARS = 32
SIGNIN_SECONDS = 30 * 60  # how long a sign-in form stays usable
_SESSION = b"reconciler console session\x00"
_SIGNIN = b"reconciler console sign-in\x00"
_CSRF = b"reconciler console csrf\x00"
_MAX_COOKIE_CHARS = 1024


def key_from(settings: Settings, environ: Mapping[str, str]) -> bytes:
    """The session signing key: from the environment, else random for this process."""
    variable = settings.console.session_secret_env
    value = environ.get(variable)
    if value:
        secret = Secret(value)
        if len(secret.reveal()) < MIN_SECRET_CHARS:
            raise ConfigError(
                f"{settings.source}: console.session_secret_env: {variable} must be at least "
                f"{MIN_SECRET_CHARS} characters (e.g. python -c 'import secrets; "
                "print(secrets.token_urlsafe(32))')"
            )
        return hashlib.sha256(_SESSION + secret.reveal().encode("utf-8")).digest()
    if settings.database_url.startswith("postgresql"):
        log.warning(
            "%s is not set: console sessions are signed with a key of this process only, "
            "so they do not carry over to other replicas or restarts",
            variable,
        )
    return secrets.token_bytes(32)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True)
class Session:
    token_id: int
    name: str  # the operator token's name: the actor recorded on decisions
    sid: str  # random per sign-in; the CSRF token is bound to it
    expires: int  # Unix seconds


class Signer:
    """Signs and checks session cookies, sign-in nonces and CSRF tokens with one key."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    def __repr__(self) -> str:
        return "Signer(key='**********')"

    def _mac(self, purpose: bytes, text: str) -> str:
        return _b64(hmac.new(self._key, purpose + text.encode("ascii"), hashlib.sha256).digest())

    def _signed(self, purpose: bytes, body: str) -> str:
        return f"{body}.{self._mac(purpose, body)}"

    def _verified(self, purpose: bytes, value: str | None) -> str | None:
        if not value or len(value) > _MAX_COOKIE_CHARS or not value.isascii():
            return None
        body, _, mac = value.rpartition(".")
        if not body or not hmac.compare_digest(mac, self._mac(purpose, body)):
            return None
        return body

    # --- sessions ------------------------------------------------------------------------

    def issue(self, token_id: int, name: str, now: datetime, seconds: float) -> tuple[str, Session]:
        session = Session(token_id, name, secrets.token_urlsafe(18), int(now.timestamp() + seconds))
        payload = json.dumps(
            {"t": session.token_id, "n": session.name, "s": session.sid, "e": session.expires},
            separators=(",", ":"),
        )
        return self._signed(_SESSION, _b64(payload.encode("utf-8"))), session

    def session(self, cookie: str | None, now: datetime) -> Session | None:
        """The session a cookie carries, or None (missing, forged, altered or expired)."""
        body = self._verified(_SESSION, cookie)
        if body is None:
            return None
        try:
            data = json.loads(_unb64(body))
            session = Session(int(data["t"]), str(data["n"]), str(data["s"]), int(data["e"]))
        except (ValueError, KeyError, TypeError):
            return None
        return session if session.expires > now.timestamp() else None

    # --- the sign-in form, before there is a session ---------------------------------------

    def signin_nonce(self, now: datetime) -> tuple[str, str]:
        """``(cookie, nonce)`` for a sign-in form: the form's CSRF token is bound to the nonce."""
        nonce = f"{secrets.token_urlsafe(18)}:{int(now.timestamp()) + SIGNIN_SECONDS}"
        return self._signed(_SIGNIN, nonce), nonce

    def signin_nonce_of(self, cookie: str | None, now: datetime) -> str | None:
        nonce = self._verified(_SIGNIN, cookie)
        if nonce is None:
            return None
        _, _, until = nonce.rpartition(":")
        return nonce if until.isdigit() and int(until) > now.timestamp() else None

    # --- CSRF ----------------------------------------------------------------------------

    def csrf(self, bound_to: str) -> str:
        return self._mac(_CSRF, bound_to)

    def csrf_ok(self, bound_to: str | None, presented: str | None) -> bool:
        if not bound_to or not presented or not presented.isascii():
            return False
        return hmac.compare_digest(self.csrf(bound_to), presented)
