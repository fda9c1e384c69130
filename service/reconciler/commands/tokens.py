"""API tokens as the command line and the console handle them: made (shown once, with
the agent's callback salt), listed, revoked, an agent's callback secret rotated, and a
presented token's standing at the console's sign-in. The tokens themselves are
``storage.tokens``; a request's bearer token is checked by ``inbound.auth``."""

from __future__ import annotations

from datetime import datetime, timedelta

from reconciler.storage import tokens
from reconciler.storage.database import Database
from reconciler.storage.tokens import Standing, TokenInfo


def create(
    db: Database, name: str, scope: str, now: datetime, expires_at: datetime | None = None
) -> tuple[str, str | None]:
    """A new token (returned once) and the salt of its callback secret (None: an operator's,
    or one that signs with the shared secret), in one transaction."""
    with db.write() as conn:
        token = tokens.create_token(conn, name, scope, now, expires_at)
        return token, tokens.callback_salt(conn, name)


def listing(db: Database) -> list[TokenInfo]:
    with db.read() as conn:
        return tokens.list_tokens(conn)


def revoke(db: Database, name: str, now: datetime) -> TokenInfo:
    with db.write() as conn:
        return tokens.revoke_token(conn, name, now)


def rotate_callback_salt(db: Database, name: str, now: datetime, window: timedelta) -> str:
    with db.write() as conn:
        return tokens.rotate_callback_salt(conn, name, now, window)


def standing(db: Database, token: str, now: datetime) -> Standing | None:
    """The presented token's row as the console's sign-in judges it (None: never made)."""
    with db.read() as conn:
        return tokens.standing_of(conn, token, now)
