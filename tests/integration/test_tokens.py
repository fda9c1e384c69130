"""Tokens: made by the CLI, shown once, stored hashed; checked on every API request."""

from __future__ import annotations

import subprocess
import sys

import pytest
import sqlalchemy as sa

from reconciler.clock import ManualClock
from reconciler.db import Database
from reconciler.errors import AuthenticationFailed, Conflict, InvalidRequest, PermissionDenied
from reconciler.tokens import TOKENS, authenticate, create_token, require_operator
from reconciler.vocabulary import Scope


def test_cli_prints_the_token_once_and_stores_only_a_digest(db: Database, db_url: str) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "reconciler",
            "tokens",
            "create",
            "--name",
            "ops-1",
            "--scope",
            "operator",
        ],
        env={"RECONCILER_DATABASE_URL": db_url, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    token = result.stdout.strip()
    assert token.startswith("rk_") and len(token) > 40
    with db.read() as conn:
        rows = conn.execute(sa.select(TOKENS)).mappings().all()
        dump = repr([dict(r) for r in rows])
        assert token not in dump
        principal = authenticate(conn, f"Bearer {token}")
    assert principal.name == "ops-1" and principal.scope is Scope.OPERATOR


def test_cli_rejects_a_bad_scope(db_url: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "reconciler", "tokens", "create", "--name", "x", "--scope", "root"],
        env={"RECONCILER_DATABASE_URL": db_url, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "invalid choice: 'root'" in result.stderr


def test_authentication_outcomes(db: Database, clock: ManualClock) -> None:
    with db.write() as conn:
        agent = create_token(conn, "agent-1", "agent", clock.now())
        with pytest.raises(Conflict, match="already exists"):
            create_token(conn, "agent-1", "agent", clock.now())
    with pytest.raises(InvalidRequest), db.write() as conn:
        create_token(conn, "bad name!", "agent", clock.now())
    with db.read() as conn:
        for header in (None, "", "Basic abc", "Bearer", "Bearer ", f"Bearer {agent}x"):
            with pytest.raises(AuthenticationFailed):
                authenticate(conn, header)
        principal = authenticate(conn, f"bearer {agent}")
    assert principal.scope is Scope.AGENT
    with pytest.raises(PermissionDenied):
        require_operator(principal)
