"""The ``reconciler`` command line.

Every command takes ``--config``; a problem with input is one line on
stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from reconciler import audit, migrate
from reconciler.clock import SystemClock
from reconciler.config import Settings, load_settings
from reconciler.db import Database
from reconciler.errors import ConfigError, ReconcilerError
from reconciler.tokens import create_token

Handler = Callable[[argparse.Namespace, Settings], int]


def _serve(args: argparse.Namespace, settings: Settings) -> int:
    from reconciler.server import serve

    return serve(settings, migrate_first=not args.no_migrate)


def _db_upgrade(args: argparse.Namespace, settings: Settings) -> int:
    db = Database(settings.database_url)
    try:
        migrate.upgrade(db)
        print(f"database at revision {migrate.current_revision(db)}")
    finally:
        db.dispose()
    return 0


def _tokens_create(args: argparse.Namespace, settings: Settings) -> int:
    db = Database(settings.database_url)
    try:
        if not migrate.is_current(db):
            raise ConfigError(
                "the database schema is not current; run 'reconciler db upgrade' first"
            )
        with db.write() as conn:
            token = create_token(conn, args.name, args.scope, SystemClock().now())
    finally:
        db.dispose()
    print(token)
    print(
        f"token {args.name!r} ({args.scope}) created; it is shown only this once", file=sys.stderr
    )
    return 0


def _audit_verify(args: argparse.Namespace, settings: Settings) -> int:
    db = Database(settings.database_url)
    try:
        key = settings.audit_key()
        report = audit.verify(db, key.reveal().encode("utf-8") if key else None)
    finally:
        db.dispose()
    if report.fault is not None:
        print(f"audit FAILED: {report.fault.describe()}", file=sys.stderr)
        return 1
    print(f"audit ok: {report.operations} operations, {report.entries} history entries intact")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="reconciler", description=__doc__)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", help="path to reconciler.toml (default: $RECONCILER_CONFIG)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", parents=[common], help="run the service")
    serve.add_argument(
        "--no-migrate", action="store_true", help="do not upgrade the schema on start"
    )
    serve.set_defaults(handler=_serve)

    db = sub.add_parser("db", parents=[common], help="database schema")
    db_sub = db.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    db_sub.add_parser("upgrade", parents=[common], help="apply migrations").set_defaults(
        handler=_db_upgrade
    )

    tokens = sub.add_parser("tokens", parents=[common], help="API tokens")
    tokens_sub = tokens.add_subparsers(dest="tokens_command", required=True, metavar="ACTION")
    create = tokens_sub.add_parser("create", parents=[common], help="make a token (printed once)")
    create.add_argument("--name", required=True)
    create.add_argument("--scope", required=True, choices=["agent", "operator"])
    create.set_defaults(handler=_tokens_create)

    aud = sub.add_parser("audit", parents=[common], help="history integrity")
    aud_sub = aud.add_subparsers(dest="audit_command", required=True, metavar="ACTION")
    aud_sub.add_parser("verify", parents=[common], help="check every hash chain").set_defaults(
        handler=_audit_verify
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = load_settings(args.config)
        handler: Handler = args.handler
        return handler(args, settings)
    except ConfigError as exc:
        print(f"reconciler: {exc.message}", file=sys.stderr)
        return 2
    except ReconcilerError as exc:
        print(f"reconciler: {exc.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
