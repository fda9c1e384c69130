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
from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from reconciler.core import callback_secrets
from reconciler.core.errors import (
    AuthenticationFailed,
    Conflict,
    InvalidRequest,
    NotFound,
    PermissionDenied,
)
from reconciler.core.vocabulary import Scope
from reconciler.storage.fastsql import raw_for, run
from reconciler.storage.models import ApiToken

TOKENS = ApiToken.__table__  # type: ignore[attr-defined]
PREFIX = "rk_"
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,99}$")


@dataclass(frozen=True)
class Principal:
    """Who is calling: the token's name is the caller recorded on operations."""

    name: str
    scope: Scope
    expires_at: datetime | None = None

    @property
    def is_operator(self) -> bool:
        return self.scope is Scope.OPERATOR


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
    exists = conn.execute(sa.select(TOKENS.c.id).where(TOKENS.c.name == name)).first()
    if exists is not None:
        raise Conflict(f"a token named {name!r} already exists; choose another name")
    if expires_at is not None and expires_at <= now:
        raise InvalidRequest("the expiry must be in the future")
    token = PREFIX + secrets.token_urlsafe(32)
    salt = callback_secrets.new_salt() if parsed is Scope.AGENT else None
    conn.execute(
        sa.insert(TOKENS).values(
            name=name,
            scope=parsed.value,
            token_hash=digest(token),
            created_at=now,
            expires_at=expires_at,
            callback_salt=salt,
        )
    )
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
    rows = conn.execute(
        sa.select(
            TOKENS.c.name,
            TOKENS.c.scope,
            TOKENS.c.created_at,
            TOKENS.c.revoked_at,
            TOKENS.c.expires_at,
            TOKENS.c.callback_salt,
        ).order_by(TOKENS.c.name)
    ).all()
    return [
        TokenInfo(
            r.name,
            Scope(r.scope),
            r.created_at,
            r.revoked_at,
            r.expires_at,
            r.callback_salt is not None,
        )
        for r in rows
    ]


def revoke_token(conn: Connection, name: str, now: datetime) -> TokenInfo:
    """Revoke by name; revoking a revoked token changes nothing (its first time stays)."""
    conn.execute(
        sa.update(TOKENS)
        .where(TOKENS.c.name == name, TOKENS.c.revoked_at.is_(None))
        .values(revoked_at=now)
    )
    for info in list_tokens(conn):
        if info.name == name:
            return info
    raise NotFound(f"no token named {name!r}; 'reconciler tokens list' shows the names")


def callback_salt(conn: Connection, name: str) -> str | None:
    """The salt of the agent's current callback secret (None: it signs with the shared one)."""
    row = conn.execute(sa.select(TOKENS.c.callback_salt).where(TOKENS.c.name == name)).first()
    if row is None:
        raise NotFound(f"no token named {name!r}; 'reconciler tokens list' shows the names")
    return row.callback_salt  # type: ignore[no-any-return]


def rotate_callback_salt(conn: Connection, name: str, now: datetime, window: timedelta) -> str:
    """A new callback salt for agent ``name``; the previous one verifies until ``window`` ends."""
    row = conn.execute(
        sa.select(TOKENS.c.scope, TOKENS.c.callback_salt).where(TOKENS.c.name == name)
    ).first()
    if row is None:
        raise NotFound(f"no token named {name!r}; 'reconciler tokens list' shows the names")
    if Scope(row.scope) is not Scope.AGENT:
        raise InvalidRequest(f"token {name!r} is an operator token; only agents get callbacks")
    salt = callback_secrets.new_salt()
    previous = row.callback_salt if row.callback_salt is not None else callback_secrets.SHARED
    conn.execute(
        sa.update(TOKENS)
        .where(TOKENS.c.name == name)
        .values(
            callback_salt=salt,
            previous_callback_salt=previous,
            previous_callback_until=now + window,
        )
    )
    return salt


def callback_keys(
    conn: Connection, caller: str, service_key: bytes, now: datetime
) -> list[bytes] | None:
    """The keys that sign a callback to ``caller``: its own, and in a rotation window the
    previous one too. None when the caller has no token (nothing may sign for it)."""
    raw = raw_for(conn.dialect.name)
    sql = raw.statement(
        "callback-salts",
        lambda r: (
            "SELECT callback_salt, previous_callback_salt, previous_callback_until "
            f"FROM api_tokens WHERE name = {r.mark}"
        ),
    )
    row = run(conn, sql, [caller]).fetchone()
    if row is None:
        return None
    current, previous, raw_until = row
    salt = current if current is not None else callback_secrets.SHARED
    keys = [callback_secrets.agent_key(service_key, salt)]
    until = raw.read_time(raw_until)
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
    row = conn.execute(
        sa.select(
            TOKENS.c.name,
            TOKENS.c.scope,
            TOKENS.c.token_hash,
            TOKENS.c.revoked_at,
            TOKENS.c.expires_at,
        ).where(TOKENS.c.token_hash == wanted)
    ).first()
    if row is None or row.revoked_at is not None or not hmac.compare_digest(row.token_hash, wanted):
        raise AuthenticationFailed("the bearer token is not valid")
    if row.expires_at is not None and now is not None and row.expires_at <= now:
        raise AuthenticationFailed("the bearer token has expired; ask an operator for a new one")
    return Principal(name=row.name, scope=Scope(row.scope), expires_at=row.expires_at)


def require_operator(principal: Principal) -> None:
    if not principal.is_operator:
        raise PermissionDenied("this action needs an operator token")


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
    row = conn.execute(
        sa.select(
            TOKENS.c.id,
            TOKENS.c.name,
            TOKENS.c.scope,
            TOKENS.c.token_hash,
            TOKENS.c.revoked_at,
            TOKENS.c.expires_at,
        ).where(TOKENS.c.token_hash == wanted)
    ).first()
    if row is None or not hmac.compare_digest(row.token_hash, wanted):
        return None
    expired = row.expires_at is not None and now is not None and row.expires_at <= now
    principal = Principal(row.name, Scope(row.scope), row.expires_at)
    return Standing(row.id, principal, row.revoked_at is not None or expired)


def principal_by_id(conn: Connection, token_id: int, now: datetime | None = None) -> Principal:
    """The principal of a token that is still valid, by row id (a console session's anchor)."""
    row = conn.execute(
        sa.select(TOKENS.c.name, TOKENS.c.scope, TOKENS.c.expires_at).where(
            TOKENS.c.id == token_id, TOKENS.c.revoked_at.is_(None)
        )
    ).first()
    if row is None:
        raise AuthenticationFailed("the token behind this session was revoked; sign in again")
    if row.expires_at is not None and now is not None and row.expires_at <= now:
        raise AuthenticationFailed("the token behind this session has expired; sign in again")
    return Principal(name=row.name, scope=Scope(row.scope), expires_at=row.expires_at)
