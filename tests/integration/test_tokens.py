"""Tokens: made by the CLI, shown once, stored hashed; checked on every API request.

The commands run in this process, through the CLI's ``main`` (the parser and handlers
``python -m reconciler`` runs), with only the database named by the environment:
what is tested is the command, and the process start is proven by every test that
runs the service as a process.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa

from reconciler.cli import main
from reconciler.core.clock import ManualClock
from reconciler.core.errors import AuthenticationFailed, Conflict, InvalidRequest, PermissionDenied
from reconciler.core.principal import require_operator
from reconciler.core.vocabulary import Scope
from reconciler.storage.database import Database
from reconciler.storage.tables import TOKENS
from reconciler.storage.tokens import authenticate, create_token

pytestmark = pytest.mark.both_backends


@dataclass(frozen=True)
class Run:
    returncode: int
    stdout: str
    stderr: str


Cli = Callable[..., Run]


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Cli:
    """``reconciler <args>`` with ``RECONCILER_DATABASE_URL`` the only setting."""
    for name in [n for n in os.environ if n.startswith("RECONCILER_")]:
        monkeypatch.delenv(name)

    def run(db_url: str, *args: str) -> Run:
        monkeypatch.setenv("RECONCILER_DATABASE_URL", db_url)
        capsys.readouterr()
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse refusing the arguments
            code = exc.code if isinstance(exc.code, int) else 2
        out = capsys.readouterr()
        return Run(code, out.out, out.err)

    return run


def test_cli_prints_the_token_once_and_stores_only_a_digest(
    db: Database, db_url: str, cli: Cli
) -> None:
    result = cli(db_url, "tokens", "create", "--name", "ops-1", "--scope", "operator")
    assert result.returncode == 0, result.stderr
    token = result.stdout.strip()
    assert token.startswith("rk_") and len(token) > 40
    assert token not in result.stderr
    with db.read() as conn:
        rows = conn.execute(sa.select(TOKENS)).mappings().all()
        dump = repr([dict(r) for r in rows])
        assert token not in dump
        principal = authenticate(conn, f"Bearer {token}")
    assert principal.name == "ops-1" and principal.scope is Scope.OPERATOR


def test_cli_rejects_a_bad_scope(db_url: str, cli: Cli) -> None:
    result = cli(db_url, "tokens", "create", "--name", "x", "--scope", "root")
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


def test_cli_lists_and_revokes_tokens_without_showing_them(
    db: Database, db_url: str, cli: Cli
) -> None:
    with db.write() as conn:
        agent = create_token(conn, "agent-1", "agent", datetime(2026, 1, 1, tzinfo=UTC))
        operator = create_token(conn, "ops-1", "operator", datetime(2026, 1, 2, tzinfo=UTC))

    listed = cli(db_url, "tokens", "list")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines() == [
        "agent-1\tagent\tcreated 2026-01-01T00:00:00Z\tactive",
        "ops-1\toperator\tcreated 2026-01-02T00:00:00Z\tactive",
    ]

    revoked = cli(db_url, "tokens", "revoke", "--name", "agent-1")
    assert revoked.returncode == 0, revoked.stderr
    assert "'agent-1' revoked at" in revoked.stdout
    with db.read() as conn, pytest.raises(AuthenticationFailed):
        authenticate(conn, f"Bearer {agent}")
    with db.read() as conn:
        first = conn.execute(sa.select(TOKENS.c.revoked_at).where(TOKENS.c.name == "agent-1"))
        revoked_at = first.scalar_one()

    again = cli(db_url, "tokens", "revoke", "--name", "agent-1")
    assert again.returncode == 0, again.stderr
    with db.read() as conn:
        still = conn.execute(sa.select(TOKENS.c.revoked_at).where(TOKENS.c.name == "agent-1"))
        assert still.scalar_one() == revoked_at  # the first revocation time stays
        assert authenticate(conn, f"Bearer {operator}").name == "ops-1"  # the others still work
    listed = cli(db_url, "tokens", "list")
    assert listed.stdout.splitlines()[0].startswith("agent-1\tagent\tcreated ")
    assert "\trevoked 20" in listed.stdout.splitlines()[0]
    assert listed.stdout.splitlines()[1].endswith("\tactive")
    for line in (listed.stdout, revoked.stdout, again.stdout):
        assert agent not in line and operator not in line and "rk_" not in line

    unknown = cli(db_url, "tokens", "revoke", "--name", "nobody")
    assert unknown.returncode == 1
    assert unknown.stderr.strip() == (
        "reconciler: no token named 'nobody'; 'reconciler tokens list' shows the names"
    )


def test_cli_on_a_database_without_the_schema_says_to_upgrade(empty_db_url: str, cli: Cli) -> None:
    for args in (("tokens", "list"), ("tokens", "revoke", "--name", "x"), ("ops", "list")):
        result = cli(empty_db_url, *args)
        assert result.returncode == 2, (args, result.stderr)
        assert result.stderr.strip() == (
            "reconciler: the database schema is not current; run 'reconciler db upgrade' first"
        )
