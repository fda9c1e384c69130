"""API tokens: made once, shown once, stored as a SHA-256 digest.

Tokens carry 256 bits of randomness, so a plain digest (no salt, no slow
hash) is enough: nothing can be guessed from it and lookup stays one
indexed read.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from reconciler.core.vocabulary import Scope
from reconciler.errors import (
    AuthenticationFailed,
    Conflict,
    InvalidRequest,
    NotFound,
    PermissionDenied,
)
from reconciler.storage.models import ApiToken

TOKENS = ApiToken.__table__  # type: ignore[attr-defined]
PREFIX = "rk_"
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,99}$")


@dataclass(frozen=True)
class Principal:
    """Who is calling: the token's name is the caller recorded on operations."""

    name: str
    scope: Scope

    @property
    def is_operator(self) -> bool:
        return self.scope is Scope.OPERATOR


def digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def create_token(conn: Connection, name: str, scope: str, now: datetime) -> str:
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
    token = PREFIX + secrets.token_urlsafe(32)
    conn.execute(
        sa.insert(TOKENS).values(
            name=name, scope=parsed.value, token_hash=digest(token), created_at=now
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


def list_tokens(conn: Connection) -> list[TokenInfo]:
    rows = conn.execute(
        sa.select(TOKENS.c.name, TOKENS.c.scope, TOKENS.c.created_at, TOKENS.c.revoked_at).order_by(
            TOKENS.c.name
        )
    ).all()
    return [TokenInfo(r.name, Scope(r.scope), r.created_at, r.revoked_at) for r in rows]


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


def authenticate(conn: Connection, authorization: str | None) -> Principal:
    if not authorization:
        raise AuthenticationFailed(
            "missing Authorization header; send 'Authorization: Bearer <token>'"
        )
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise AuthenticationFailed("Authorization must be 'Bearer <token>'")
    wanted = digest(token.strip())
    row = conn.execute(
        sa.select(TOKENS.c.name, TOKENS.c.scope, TOKENS.c.token_hash, TOKENS.c.revoked_at).where(
            TOKENS.c.token_hash == wanted
        )
    ).first()
    if row is None or row.revoked_at is not None or not hmac.compare_digest(row.token_hash, wanted):
        raise AuthenticationFailed("the bearer token is not valid")
    return Principal(name=row.name, scope=Scope(row.scope))


def require_operator(principal: Principal) -> None:
    if not principal.is_operator:
        raise PermissionDenied("this action needs an operator token")


@dataclass(frozen=True)
class Standing:
    """A presented token as the console's sign-in sees it: which row, whose, still valid."""

    token_id: int
    principal: Principal
    revoked: bool


def standing_of(conn: Connection, token: str) -> Standing | None:
    """The token's row (revoked or not), or None for a token this service never made."""
    wanted = digest(token.strip())
    row = conn.execute(
        sa.select(
            TOKENS.c.id, TOKENS.c.name, TOKENS.c.scope, TOKENS.c.token_hash, TOKENS.c.revoked_at
        ).where(TOKENS.c.token_hash == wanted)
    ).first()
    if row is None or not hmac.compare_digest(row.token_hash, wanted):
        return None
    return Standing(row.id, Principal(row.name, Scope(row.scope)), row.revoked_at is not None)


def principal_by_id(conn: Connection, token_id: int) -> Principal:
    """The principal of a token that is still valid, by row id (a console session's anchor)."""
    row = conn.execute(
        sa.select(TOKENS.c.name, TOKENS.c.scope).where(
            TOKENS.c.id == token_id, TOKENS.c.revoked_at.is_(None)
        )
    ).first()
    if row is None:
        raise AuthenticationFailed("the token behind this session was revoked; sign in again")
    return Principal(name=row.name, scope=Scope(row.scope))
