"""``reconciler providers list|show|check``: what a deployment can reach, and whether a
provider file reads the live API."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from reconciler.commands import providers as provider_commands
from reconciler.commands.provider_check import (
    Check,
    Report,
    Unreadable,
    check_job,
    check_request,
    headline,
    obtain_credential,
    verdict,
)
from reconciler.commands.validation import check_provider_request
from reconciler.config import DEFAULT_PROVIDERS_DIR, Settings
from reconciler.core.errors import InvalidRequest
from reconciler.core.strict_json import parse_request_json
from reconciler.outbound import ssrf
from reconciler.providers.http_adapter import build_adapter
from reconciler.providers.loader import load_providers, provider_tables
from reconciler.providers.result_fetch import URL_NAME
from reconciler.providers.spec import ProviderSpec


def providers_command(args: argparse.Namespace, settings: Settings) -> int:
    if args.providers_command == "check":
        return providers_check(args, settings)
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


def _request(path: str, spec: ProviderSpec, limit: int) -> Any:
    """The create's request from ``path`` (``-``: standard input), checked as intake checks
    an agent's (``limit``: the server's ``max_body_bytes``)."""
    try:
        if path == "-":
            data = sys.stdin.buffer.read(limit + 1)
        else:
            with Path(path).open("rb") as fh:
                data = fh.read(limit + 1)
    except OSError as exc:
        raise InvalidRequest(f"--request: cannot read {path}: {exc.strerror}") from None
    if len(data) > limit:
        raise InvalidRequest(f"--request: {path} is larger than {limit} bytes")
    request = parse_request_json(data, f"--request {path}")
    try:
        check_provider_request(request, spec)
    except InvalidRequest as exc:
        raise InvalidRequest(f"--request: {exc.message}") from None
    return request


def providers_check(args: argparse.Namespace, settings: Settings) -> int:
    specs = load_providers(
        settings.providers_path(),
        settings.providers,
        os.environ,
        missing_ok=settings.providers_dir == DEFAULT_PROVIDERS_DIR,
        public_url=settings.server.public_url,
    )
    if args.cancel and args.request is None:
        raise InvalidRequest("--cancel needs --request: only a job the check started is cancelled")
    spec = specs.get(args.name)
    if spec is None:
        known = ", ".join(sorted(specs)) or "none configured"
        raise InvalidRequest(f"no provider named {args.name!r} here (configured: {known})")
    limit = settings.server.max_body_bytes
    request = _request(args.request, spec, limit) if args.request is not None else None
    allow = settings.callbacks.allow_hosts

    async def guard(url: str) -> Any:
        return await ssrf.resolve_and_check(url, allow, ssrf.system_resolver, URL_NAME)

    report = Report(print)
    report.say(headline(spec))

    async def run() -> None:
        adapter = build_adapter(spec, os.environ, guard=guard)
        check = Check(spec, adapter, report)
        try:
            await obtain_credential(report, getattr(adapter, "credential", None))
            if request is not None:
                reads = args.max_reads or spec.polling.max_status_requests
                await check_request(check, request, cancel=args.cancel, max_reads=reads)
            else:
                await check_job(check, args.job_id)
        except Unreadable:
            pass
        finally:
            await adapter.aclose()

    asyncio.run(run())
    print(verdict(report, spec.name))
    return 1 if report.failed else 0


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    prov = sub.add_parser("providers", parents=[common], help="configured providers and presets")
    prov_sub = prov.add_subparsers(dest="providers_command", required=True, metavar="ACTION")
    prov_sub.add_parser(
        "list",
        parents=[common],
        help="one line each: name, preset or file, base_url, description",
    ).set_defaults(handler=providers_command)
    show = prov_sub.add_parser(
        "show",
        parents=[common],
        help="a provider merged over its preset, as TOML (secrets only as their variable names)",
    )
    show.add_argument("name", help="a configured provider, or a shipped preset")
    show.set_defaults(handler=providers_command)
    check = prov_sub.add_parser(
        "check",
        parents=[common],
        help="try a provider file against the live API: each call, what the file read, a verdict",
    )
    check.add_argument("name", help="a configured provider")
    what = check.add_mutually_exclusive_group(required=True)
    what.add_argument("--job-id", help="read the status (and result) of this existing job")
    what.add_argument(
        "--request",
        metavar="FILE",
        help="start a REAL job with this JSON request (- for stdin): create, lookup, status "
        "reads, result",
    )
    check.add_argument(
        "--cancel", action="store_true", help="with --request: cancel the job after its first read"
    )
    check.add_argument(
        "--max-reads",
        type=int,
        choices=range(1, 10_001),
        metavar="1..10000",
        help="with --request: status reads before giving up (default: the file's budget)",
    )
    check.set_defaults(handler=providers_command)
