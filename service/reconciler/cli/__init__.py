"""The ``reconciler`` command line.

Every command takes ``--config``; a problem with input is one line on
stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import gc
import getpass
import os
import sys
from collections.abc import Callable, Sequence

# This module parses and dispatches (its docstring is the --help text); the commands on
# the database, the tokens and the operations have a module each.
from reconciler.cli.database import audit_verify, db_prune, db_upgrade
from reconciler.cli.operations import decide_command, ops_command
from reconciler.cli.providers import add_parser as add_providers_parser
from reconciler.cli.tokens import (
    DEFAULT_ROTATION_WINDOW,
    tokens_create,
    tokens_list,
    tokens_revoke,
    tokens_rotate,
)
from reconciler.config import Settings, load_settings
from reconciler.core.errors import ConfigError, ReconcilerError
from reconciler.core.states import State
from reconciler.core.strict_json import require_field_text
from reconciler.core.vocabulary import DecisionAction, Scope
from reconciler.wire import MAX_PAGE

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


_PATH_ARGUMENTS = {"config", "dir"}
_POSITIONAL = {"operation", "action", "command"}


def require_text_arguments(args: argparse.Namespace) -> None:
    """The input rule of every door: an argument the database cannot store is refused by name.

    Python hands undecodable argv bytes over as lone surrogates (``surrogateescape``);
    file paths may hold them (the file system stores bytes), so they are left alone.
    """
    for name, value in vars(args).items():
        if isinstance(value, str) and name not in _PATH_ARGUMENTS:
            shown_as = name if name in _POSITIONAL else "--" + name.replace("_", "-")
            require_field_text(shown_as, value)


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

    db = sub.add_parser("db", parents=[common], help="database schema and retention")
    db_sub = db.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    db_sub.add_parser("upgrade", parents=[common], help="apply migrations").set_defaults(
        handler=db_upgrade
    )
    prune = db_sub.add_parser(
        "prune",
        parents=[common],
        help="remove finished operations older than a duration (what the sweep does)",
    )
    prune.add_argument(
        "--older-than",
        required=True,
        help="finished longer ago than this, with a unit: 30d, 12h, 90m, 45s",
    )
    prune.add_argument(
        "--dry-run", action="store_true", help="count what would be removed; remove nothing"
    )
    prune.set_defaults(handler=db_prune)

    tokens = sub.add_parser("tokens", parents=[common], help="API tokens")
    tokens_sub = tokens.add_subparsers(dest="tokens_command", required=True, metavar="ACTION")
    create = tokens_sub.add_parser("create", parents=[common], help="make a token (printed once)")
    create.add_argument("--name", required=True)
    create.add_argument("--scope", required=True, choices=[s.value for s in Scope])
    create.add_argument("--expires-in", help="refuse the token after this long (e.g. 90d, 12h)")
    create.set_defaults(handler=tokens_create)
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
    rotate.set_defaults(handler=tokens_rotate)
    tokens_sub.add_parser(
        "list",
        parents=[common],
        help="names, scopes, expiry and whether revoked (never the tokens or secrets)",
    ).set_defaults(handler=tokens_list)
    revoke = tokens_sub.add_parser("revoke", parents=[common], help="stop a token from working")
    revoke.add_argument("--name", required=True)
    revoke.set_defaults(handler=tokens_revoke)

    ops = sub.add_parser("ops", parents=[common], help="inspect operations")
    ops_sub = ops.add_subparsers(dest="ops_command", required=True, metavar="ACTION")
    listing = ops_sub.add_parser("list", parents=[common], help="newest first")
    listing.add_argument("--state", choices=[s.value for s in State])
    listing.add_argument("--provider")
    listing.add_argument(
        "--limit",
        type=int,
        default=50,
        choices=range(1, MAX_PAGE + 1),
        metavar=f"1..{MAX_PAGE}",
    )
    listing.set_defaults(handler=ops_command)
    for name, text in (("show", "the Operation as JSON"), ("history", "the story, oldest first")):
        cmd = ops_sub.add_parser(name, parents=[common], help=text)
        cmd.add_argument("operation")
        cmd.set_defaults(handler=ops_command)

    decide = sub.add_parser("decide", parents=[common], help="decide an escalation")
    decide.add_argument("operation")
    decide.add_argument("action", choices=[a.value for a in DecisionAction])
    decide.add_argument("--extra-seconds", type=float, help="extend: more time (default offered)")
    decide.add_argument("--extra-requests", type=int, help="extend: more status requests")
    decide.add_argument("--by", default=getpass.getuser(), help="who decides (recorded)")
    decide.add_argument("--note", help="why you decide so (kept with the decision, at most 500)")
    decide.set_defaults(handler=decide_command)

    add_providers_parser(sub, common)

    aud = sub.add_parser("audit", parents=[common], help="history integrity")
    aud_sub = aud.add_subparsers(dest="audit_command", required=True, metavar="ACTION")
    aud_sub.add_parser("verify", parents=[common], help="check every hash chain").set_defaults(
        handler=audit_verify
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
