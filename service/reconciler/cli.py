"""The ``reconciler`` command line.

Every command takes ``--config``; a problem with input is one line on
stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import gc
import getpass
import json
import os
import sys
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from reconciler.commands import providers as provider_commands
from reconciler.commands.decide import decide
from reconciler.config import DEFAULT_PROVIDERS_DIR, Settings, load_settings
from reconciler.core import story
from reconciler.core.callback_secrets import agent_key, as_whsec
from reconciler.core.clock import SystemClock, isoformat
from reconciler.core.errors import ConfigError, InvalidRequest, ReconcilerError
from reconciler.core.signatures import decode_whsec
from reconciler.core.states import State
from reconciler.core.strict_json import require_field_text, shown, visible
from reconciler.core.vocabulary import DecisionAction, Scope
from reconciler.providers.loader import load_providers, provider_tables
from reconciler.storage import audit, migrate
from reconciler.storage import operations as store
from reconciler.storage.database import Database
from reconciler.storage.history import history_of
from reconciler.storage.journal import Journal
from reconciler.storage.tokens import (
    Principal,
    callback_salt,
    create_token,
    list_tokens,
    revoke_token,
    rotate_callback_salt,
)
from reconciler.storage.views import view_of
from reconciler.wire import parse_decision

Handler = Callable[[argparse.Namespace, Settings], int]


def _serve(args: argparse.Namespace, settings: Settings) -> int:
    # Imported on use, here and in _demo: the other commands start without the web stack.
    from reconciler.app import serve

    return serve(settings, migrate_first=not args.no_migrate)


def _demo(args: argparse.Namespace, settings: Settings) -> int:
    from pathlib import Path

    from reconciler.demo.run import DemoOptions, run_demo

    options = DemoOptions(
        operations=args.operations,
        seed=args.seed,
        timeout=args.timeout,
        keep=args.keep,
        quick=args.quick,
        directory=Path(args.dir),
        keep_serving=args.keep_serving,
    )
    try:
        return run_demo(options, settings)
    finally:
        # The process ends next, and nothing of the run needs collecting: out of the
        # collector's view, the interpreter's last full collections cost nothing. They
        # walked the whole heap: measured under load (14 busy processes on 2 cores), 13
        # of the 14 s from Ctrl-C to exit.
        gc.freeze()


def _mcp(args: argparse.Namespace, settings: Settings) -> int:
    from reconciler.agent_tools.stdio import serve_stdio

    return serve_stdio(args.url, os.environ)


def _db_upgrade(args: argparse.Namespace, settings: Settings) -> int:
    db = Database(settings.database_url)
    try:
        migrate.upgrade(db)
        print(f"database at revision {migrate.current_revision(db)}")
    finally:
        db.dispose()
    return 0


def _current_database(settings: Settings) -> Database:
    """The database, refused with a clear line when its schema is behind this version."""
    db = Database(settings.database_url)
    try:
        current = migrate.is_current(db)
    except BaseException:
        db.dispose()
        raise
    if not current:
        db.dispose()
        raise ConfigError("the database schema is not current; run 'reconciler db upgrade' first")
    return db


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_EXPIRY = timedelta(days=3660)
DEFAULT_ROTATION_WINDOW = "24h"
_PATH_ARGUMENTS = {"config", "dir"}
_POSITIONAL = {"operation", "action", "command"}


def parse_duration(text: str, what: str) -> timedelta:
    """``90d``, ``12h``, ``30m`` or ``45s``: a unit is required; positive, at most ten years."""
    raw = text.strip().lower()
    unit = _UNITS.get(raw[-1:])
    number = raw[:-1]
    if unit is None or not (number.isascii() and number.isdigit()) or int(number) == 0:
        raise InvalidRequest(
            f"{what} must be a whole number with a unit, s, m, h or d (e.g. 90d), "
            f"got {shown(text)!r}"
        )
    # Compared as a number: a count of days past what a datetime holds would overflow.
    if int(number) * unit > MAX_EXPIRY.total_seconds():
        raise InvalidRequest(f"{what} may be at most {MAX_EXPIRY.days} days")
    return timedelta(seconds=int(number) * unit)


def require_text_arguments(args: argparse.Namespace) -> None:
    """The input rule of every door: an argument the database cannot store is refused by name.

    Python hands undecodable argv bytes over as lone surrogates (``surrogateescape``);
    file paths may hold them (the file system stores bytes), so they are left alone.
    """
    for name, value in vars(args).items():
        if isinstance(value, str) and name not in _PATH_ARGUMENTS:
            shown_as = name if name in _POSITIONAL else "--" + name.replace("_", "-")
            require_field_text(shown_as, value)


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


def _tokens_create(args: argparse.Namespace, settings: Settings) -> int:
    now = SystemClock().now()
    expires = now + parse_duration(args.expires_in, "--expires-in") if args.expires_in else None
    db = _current_database(settings)
    try:
        with db.write() as conn:
            token = create_token(conn, args.name, args.scope, now, expires)
            salt = callback_salt(conn, args.name)
    finally:
        db.dispose()
    print(token)
    until = f", expires {isoformat(expires)}" if expires else ""
    print(
        f"token {args.name!r} ({args.scope}{until}) created; it is shown only this once",
        file=sys.stderr,
    )
    _show_callback_secret(settings, args.name, salt)
    return 0


def _tokens_rotate(args: argparse.Namespace, settings: Settings) -> int:
    key = _service_key(settings)
    if key is None:
        raise ConfigError(
            f"{settings.callbacks.signing_secret_env} must be set: the agent's secret is "
            "derived from it"
        )
    window = parse_duration(args.window, "--window")
    now = SystemClock().now()
    db = _current_database(settings)
    try:
        with db.write() as conn:
            salt = rotate_callback_salt(conn, args.name, now, window)
    finally:
        db.dispose()
    print(as_whsec(agent_key(key, salt)))
    print(
        f"new callback secret for {args.name!r}, shown only this once; until "
        f"{isoformat(now + window)} callbacks carry signatures for the old and the new one",
        file=sys.stderr,
    )
    return 0


def _tokens_list(args: argparse.Namespace, settings: Settings) -> int:
    db = _current_database(settings)
    try:
        with db.read() as conn:
            tokens = list_tokens(conn)
    finally:
        db.dispose()
    now = SystemClock().now()
    for info in tokens:
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


def _tokens_revoke(args: argparse.Namespace, settings: Settings) -> int:
    db = _current_database(settings)
    try:
        with db.write() as conn:
            info = revoke_token(conn, args.name, SystemClock().now())
    finally:
        db.dispose()
    print(
        f"token {info.name!r} revoked at {isoformat(info.revoked_at)}; running services "
        "refuse it within a few seconds"
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


def _operator_view(db: Database, op_id: str) -> dict[str, Any]:
    with db.read() as conn:
        return view_of(conn, store.load_operation(conn, op_id), SystemClock().now())


CLI_OPERATOR = Principal(name="cli", scope=Scope.OPERATOR)


def _ops(args: argparse.Namespace, settings: Settings) -> int:
    db = _current_database(settings)
    try:
        if args.ops_command == "list":
            state = State(args.state) if args.state else None
            with db.read() as conn:
                page = store.list_operations(
                    conn,
                    CLI_OPERATOR,
                    state=state,
                    provider=args.provider,
                    limit=args.limit,
                    cursor=None,
                )
            for op in page.items:
                print(
                    visible(
                        f"{op.id}  {op.provider:<12} {op.state:<26} "
                        f"{op.remote_job_id or '-':<24} {isoformat(op.updated_at)}"
                    )
                )
            if not page.items:
                print("no operations", file=sys.stderr)
        elif args.ops_command == "show":
            print(json.dumps(_operator_view(db, args.operation), indent=2, sort_keys=True))
        else:
            with db.read() as conn:
                op = store.load_operation(conn, args.operation)
                entries = history_of(conn, args.operation)
            # Stored text no encoder can write is shown as a visible escape.
            print(visible(story.header(op)))
            for text in story.tell(entries):
                print(visible(text))
    finally:
        db.dispose()
    return 0


def _decide(args: argparse.Namespace, settings: Settings) -> int:
    decision = parse_decision(
        {
            "action": args.action,
            **({"extra_seconds": args.extra_seconds} if args.extra_seconds is not None else {}),
            **(
                {"extra_status_requests": args.extra_requests}
                if args.extra_requests is not None
                else {}
            ),
        }
    )
    key = settings.audit_key()
    journal = Journal(key=key.reveal().encode("utf-8") if key else None)
    # The provider files give the cancel window; the CLI needs none of their credentials.
    providers = load_providers(
        settings.providers_path(),
        settings.providers,
        os.environ,
        missing_ok=settings.providers_dir == DEFAULT_PROVIDERS_DIR,
        public_url=settings.server.public_url,
        check_secrets=False,
    )
    who = Principal(name=args.by, scope=Scope.OPERATOR)
    db = _current_database(settings)
    try:
        after = decide(db, journal, providers, args.operation, who, decision, SystemClock().now())
    finally:
        db.dispose()
    print(f"{after.id}: {args.action} recorded; state {after.state}")
    return 0


def _providers(args: argparse.Namespace, settings: Settings) -> int:
    tables = provider_tables(
        settings.providers_path(),
        settings.providers,
        missing_ok=settings.providers_dir == DEFAULT_PROVIDERS_DIR,
    )
    public_url = settings.server.public_url
    if args.providers_command == "list":
        for line in provider_commands.listing(tables, public_url):
            print(line)
    else:
        print(provider_commands.show(args.name, tables, public_url), end="")
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

    demo = sub.add_parser(
        "demo", parents=[common], help="run the service with a simulated provider and a batch"
    )
    size = demo.add_mutually_exclusive_group()
    size.add_argument("--operations", type=int, default=50, help="how many (default 50)")
    size.add_argument(
        "--quick",
        action="store_true",
        help="four short operations, one per path the summary checks",
    )
    demo.add_argument("--seed", type=int, default=7, help="scenario mix seed (default 7)")
    demo.add_argument("--timeout", type=float, default=120.0, help="time bound in s (default 120)")
    demo.add_argument("--keep", action="store_true", help="keep the demo directory afterwards")
    demo.add_argument("--dir", default="demo-run", help="demo directory, wiped at start")
    demo.add_argument(
        "--keep-serving",
        action="store_true",
        help="after the summary, keep the service up for the operator console until Ctrl-C",
    )
    demo.set_defaults(handler=_demo)

    mcp = sub.add_parser(
        "mcp", parents=[common], help="the agent tools over stdio, for a running service"
    )
    mcp.add_argument(
        "--url",
        help="the service (default: $RECONCILER_URL, else http://127.0.0.1:8080); "
        "the token is read from $RECONCILER_TOKEN",
    )
    mcp.set_defaults(handler=_mcp)

    db = sub.add_parser("db", parents=[common], help="database schema")
    db_sub = db.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    db_sub.add_parser("upgrade", parents=[common], help="apply migrations").set_defaults(
        handler=_db_upgrade
    )

    tokens = sub.add_parser("tokens", parents=[common], help="API tokens")
    tokens_sub = tokens.add_subparsers(dest="tokens_command", required=True, metavar="ACTION")
    create = tokens_sub.add_parser("create", parents=[common], help="make a token (printed once)")
    create.add_argument("--name", required=True)
    create.add_argument("--scope", required=True, choices=[s.value for s in Scope])
    create.add_argument("--expires-in", help="refuse the token after this long (e.g. 90d, 12h)")
    create.set_defaults(handler=_tokens_create)
    rotate = tokens_sub.add_parser(
        "rotate-callback-secret",
        parents=[common],
        help="give an agent a new callback secret (printed once); the old one verifies a while",
    )
    rotate.add_argument("--name", required=True)
    rotate.add_argument(
        "--window",
        default=DEFAULT_ROTATION_WINDOW,
        help=f"how long the old secret still verifies (default {DEFAULT_ROTATION_WINDOW})",
    )
    rotate.set_defaults(handler=_tokens_rotate)
    tokens_sub.add_parser(
        "list",
        parents=[common],
        help="names, scopes, expiry and whether revoked (never the tokens or secrets)",
    ).set_defaults(handler=_tokens_list)
    revoke = tokens_sub.add_parser("revoke", parents=[common], help="stop a token from working")
    revoke.add_argument("--name", required=True)
    revoke.set_defaults(handler=_tokens_revoke)

    ops = sub.add_parser("ops", parents=[common], help="inspect operations")
    ops_sub = ops.add_subparsers(dest="ops_command", required=True, metavar="ACTION")
    listing = ops_sub.add_parser("list", parents=[common], help="newest first")
    listing.add_argument("--state", choices=[s.value for s in State])
    listing.add_argument("--provider")
    listing.add_argument(
        "--limit",
        type=int,
        default=50,
        choices=range(1, store.MAX_PAGE + 1),
        metavar=f"1..{store.MAX_PAGE}",
    )
    listing.set_defaults(handler=_ops)
    for name, text in (("show", "the Operation as JSON"), ("history", "the story, oldest first")):
        cmd = ops_sub.add_parser(name, parents=[common], help=text)
        cmd.add_argument("operation")
        cmd.set_defaults(handler=_ops)

    decide = sub.add_parser("decide", parents=[common], help="decide an escalation")
    decide.add_argument("operation")
    decide.add_argument("action", choices=[a.value for a in DecisionAction])
    decide.add_argument("--extra-seconds", type=float, help="extend: more time (default offered)")
    decide.add_argument("--extra-requests", type=int, help="extend: more status requests")
    decide.add_argument("--by", default=getpass.getuser(), help="who decides (recorded)")
    decide.set_defaults(handler=_decide)

    prov = sub.add_parser("providers", parents=[common], help="configured providers and presets")
    prov_sub = prov.add_subparsers(dest="providers_command", required=True, metavar="ACTION")
    prov_sub.add_parser(
        "list",
        parents=[common],
        help="one line each: name, preset or file, base_url, description",
    ).set_defaults(handler=_providers)
    show = prov_sub.add_parser(
        "show",
        parents=[common],
        help="a provider merged over its preset, as TOML (secrets only as their variable names)",
    )
    show.add_argument("name", help="a configured provider, or a shipped preset")
    show.set_defaults(handler=_providers)

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
        require_text_arguments(args)
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
    except BrokenPipeError:
        # The reader went away (`reconciler ops list | head`): not an error of ours.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
