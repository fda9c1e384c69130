"""API tokens: made once, shown once, stored as a SHA-256 digest; with an expiry and a
callback salt.

Tokens carry 256 bits of randomness, so a plain digest (no salt, no slow
hash) is enough: nothing can be guessed from it and lookup stays one
indexed read. A token may expire (refused from then on). An agent token
carries the salt of its own callback secret (``core.callback_secrets``); a
rotation draws a new salt and keeps the previous one valid for a window, in
which callbacks carry both signatures. Tokens made before per-agent secrets
have no salt: their callbacks stay signed with the shared secret until rotated.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.engine import Connection

from reconciler.core import callback_secrets
from reconciler.core.errors import (
    AuthenticationFailed,
    Conflict,
    InvalidRequest,
    NotFound,
)
from reconciler.core.principal import Principal
from reconciler.core.vocabulary import Scope
from reconciler.storage.fastsql import Sql
from reconciler.storage.tables import TOKENS

PREFIX = "rk_"
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,99}$")

_ID_BY_NAME = Sql("token-id", TOKENS, "SELECT id FROM api_tokens WHERE name = ?", params=("name",))
_INSERT = Sql(
    "token-insert",
    TOKENS,
    "INSERT INTO api_tokens (name, scope, token_hash, created_at, expires_at, callback_salt) "
    "VALUES (?, ?, ?, ?, ?, ?)",
    params=("name", "scope", "token_hash", "created_at", "expires_at", "callback_salt"),
)
_LIST = Sql(
    "tokens-list",
    TOKENS,
    "SELECT name, scope, created_at, revoked_at, expires_at, callback_salt "
    "FROM api_tokens ORDER BY name",
    returns=("name", "scope", "created_at", "revoked_at", "expires_at", "callback_salt"),
)
_REVOKE = Sql(
    "token-revoke",
    TOKENS,
    "UPDATE api_tokens SET revoked_at = ? WHERE name = ? AND revoked_at IS NULL",
    params=("revoked_at", "name"),
)
SALTS = Sql(
    "token-salts",
    TOKENS,
    "SELECT scope, callback_salt, previous_callback_salt, previous_callback_until "
    "FROM api_tokens WHERE name = ?",
    params=("name",),
    returns=("scope", "callback_salt", "previous_callback_salt", "previous_callback_until"),
)
_ROTATE = Sql(
    "token-rotate",
    TOKENS,
    "UPDATE api_tokens SET callback_salt = ?, previous_callback_salt = ?, "
    "previous_callback_until = ? WHERE name = ?",
    params=("callback_salt", "previous_callback_salt", "previous_callback_until", "name"),
)
_BY_HASH = Sql(
    "token-by-hash",
    TOKENS,
    "SELECT id, name, scope, token_hash, revoked_at, expires_at FROM api_tokens "
    "WHERE token_hash = ?",
    params=("token_hash",),
    returns=("id", "name", "scope", "token_hash", "revoked_at", "expires_at"),
)
_VALID_BY_ID = Sql(
    "token-valid-by-id",
    TOKENS,
    "SELECT name, scope, expires_at FROM api_tokens WHERE id = ? AND revoked_at IS NULL",
    params=("id",),
    returns=("name", "scope", "expires_at"),
)


def digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def create_token(
    conn: Connection, name: str, scope: str, now: datetime, expires_at: datetime | None = None
) -> str:
    """A new token (returned once); agents also get the salt of their own callback secret."""
    if not NAME_RE.match(name):
        raise InvalidRequest(
            "token name must be 1-100 characters of letters, digits, '_', '.', '@' or '-'"
        )
    try:
        parsed = Scope(scope)
    except ValueError:
        raise InvalidRequest("scope must be 'agent' or 'operator'") from None
    if _ID_BY_NAME.first(conn, name) is not None:
        raise Conflict(f"a token named {name!r} already exists; choose another name")
    if expires_at is not None and expires_at <= now:
        raise InvalidRequest("the expiry must be in the future")
    token = PREFIX + secrets.token_urlsafe(32)
    salt = callback_secrets.new_salt() if parsed is Scope.AGENT else None
    _INSERT.run(conn, name, parsed.value, digest(token), now, expires_at, salt)
    return token


@dataclass(frozen=True)
class TokenInfo:
    """What an operator may see of a token: never the token, never its digest."""

    name: str
    scope: Scope
    created_at: datetime
    revoked_at: datetime | None
    expires_at: datetime | None = None
    own_callback_secret: bool = False  # False: callbacks signed with the shared secret


def list_tokens(conn: Connection) -> list[TokenInfo]:
    return [
        TokenInfo(name, Scope(scope), created_at, revoked_at, expires_at, salt is not None)
        for name, scope, created_at, revoked_at, expires_at, salt in _LIST.rows(conn)
    ]


def revoke_token(conn: Connection, name: str, now: datetime) -> TokenInfo:
    """Revoke by name; revoking a revoked token changes nothing (its first time stays)."""
    _REVOKE.run(conn, now, name)
    for info in list_tokens(conn):
        if info.name == name:
            return info
    raise NotFound(f"no token named {name!r}; 'reconciler tokens list' shows the names")


def callback_salt(conn: Connection, name: str) -> str | None:
    """The salt of the agent's current callback secret (None: it signs with the shared one)."""
    row = SALTS.first(conn, name)
    if row is None:
        raise NotFound(f"no token named {name!r}; 'reconciler tokens list' shows the names")
    return row[1]  # type: ignore[no-any-return]


def rotate_callback_salt(conn: Connection, name: str, now: datetime, window: timedelta) -> str:
    """A new callback salt for agent ``name``; the previous one verifies until ``window`` ends."""
    row = SALTS.first(conn, name)
    if row is None:
        raise NotFound(f"no token named {name!r}; 'reconciler tokens list' shows the names")
    scope, current = row[0], row[1]
    if Scope(scope) is not Scope.AGENT:
        raise InvalidRequest(f"token {name!r} is an operator token; only agents get callbacks")
    salt = callback_secrets.new_salt()
    previous = current if current is not None else callback_secrets.SHARED
    _ROTATE.run(conn, salt, previous, now + window, name)
    return salt


def callback_keys(
    conn: Connection, caller: str, service_key: bytes, now: datetime
) -> list[bytes] | None:
    """The keys that sign a callback to ``caller``: its own, and in a rotation window the
    previous one too. None when the caller has no token (nothing may sign for it)."""
    return keys_of(SALTS.first(conn, caller), service_key, now)


def keys_of(row: Sequence[Any] | None, service_key: bytes, now: datetime) -> list[bytes] | None:
    """``callback_keys`` from the caller's row of ``SALTS`` as read (None: it has none)."""
    if row is None:
        return None
    _, current, previous, until = row
    salt = current if current is not None else callback_secrets.SHARED
    keys = [callback_secrets.agent_key(service_key, salt)]
    if previous is not None and until is not None and until > now:
        keys.append(callback_secrets.agent_key(service_key, previous))
    return keys


def authenticate(
    conn: Connection, authorization: str | None, now: datetime | None = None
) -> Principal:
    if not authorization:
        raise AuthenticationFailed(
            "missing Authorization header; send 'Authorization: Bearer <token>'"
        )
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise AuthenticationFailed("Authorization must be 'Bearer <token>'")
    wanted = digest(token.strip())
    row = _BY_HASH.first(conn, wanted)
    if row is None:
        raise AuthenticationFailed("the bearer token is not valid")
    _, name, scope, token_hash, revoked_at, expires_at = row
    if revoked_at is not None or not hmac.compare_digest(token_hash, wanted):
        raise AuthenticationFailed("the bearer token is not valid")
    if expires_at is not None and now is not None and expires_at <= now:
        raise AuthenticationFailed("the bearer token has expired; ask an operator for a new one")
    return Principal(name=name, scope=Scope(scope), expires_at=expires_at)


@dataclass(frozen=True)
class Standing:
    """A presented token as the console's sign-in sees it: which row, whose, still valid."""

    token_id: int
    principal: Principal
    revoked: bool


def standing_of(conn: Connection, token: str, now: datetime | None = None) -> Standing | None:
    """The token's row (revoked or not), or None for a token this service never made.

    An expired token stands as revoked: it may not sign in.
    """
    wanted = digest(token.strip())
    row = _BY_HASH.first(conn, wanted)
    if row is None:
        return None
    token_id, name, scope, token_hash, revoked_at, expires_at = row
    if not hmac.compare_digest(token_hash, wanted):
        return None
    expired = expires_at is not None and now is not None and expires_at <= now
    return Standing(
        token_id, Principal(name, Scope(scope), expires_at), revoked_at is not None or expired
    )


def principal_by_id(conn: Connection, token_id: int, now: datetime | None = None) -> Principal:
    """The principal of a token that is still valid, by row id (a console session's anchor)."""
    row = _VALID_BY_ID.first(conn, token_id)
    if row is None:
        raise AuthenticationFailed("the token behind this session was revoked; sign in again")
    name, scope, expires_at = row
    if expires_at is not None and now is not None and expires_at <= now:
        raise AuthenticationFailed("the token behind this session has expired; sign in again")
    return Principal(name=name, scope=Scope(scope), expires_at=expires_at)
