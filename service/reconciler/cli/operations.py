"""``reconciler ops`` (list, show, history) and ``reconciler decide``: the operator's
look at operations and decisions on escalations, straight on the database."""

from __future__ import annotations

import argparse
import json
import os
import sys

from reconciler.commands import database, operator_reads
from reconciler.commands.decide import decide
from reconciler.config import DEFAULT_PROVIDERS_DIR, Settings
from reconciler.core import story
from reconciler.core.clock import SystemClock, isoformat
from reconciler.core.principal import Principal
from reconciler.core.states import State
from reconciler.core.strict_json import visible
from reconciler.core.vocabulary import Scope
from reconciler.providers.loader import load_providers
from reconciler.wire import parse_decision

CLI_OPERATOR = Principal(name="cli", scope=Scope.OPERATOR)


def ops_command(args: argparse.Namespace, settings: Settings) -> int:
    with database.current(settings.database_url) as db:
        if args.ops_command == "list":
            state = State(args.state) if args.state else None
            page = operator_reads.operations_page(
                db, CLI_OPERATOR, state, args.provider, args.limit
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
            view = operator_reads.operation_view(db, args.operation, SystemClock().now())
            print(json.dumps(view, indent=2, sort_keys=True))
        else:
            op, entries = operator_reads.operation_story(db, args.operation)
            # Stored text no encoder can write is shown as a visible escape.
            print(visible(story.header(op)))
            for text in story.tell(entries):
                print(visible(text))
    return 0


def decide_command(args: argparse.Namespace, settings: Settings) -> int:
    decision = parse_decision(
        {
            "action": args.action,
            **({"extra_seconds": args.extra_seconds} if args.extra_seconds is not None else {}),
            **(
                {"extra_status_requests": args.extra_requests}
                if args.extra_requests is not None
                else {}
            ),
            **({"note": args.note} if args.note is not None else {}),
        }
    )
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
    with database.current(settings.database_url) as db:
        journal = database.journal(settings)
        after = decide(db, journal, providers, args.operation, who, decision, SystemClock().now())
    print(f"{after.id}: {args.action} recorded; state {after.state}")
    return 0
