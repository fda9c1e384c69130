"""``reconciler demo``: the whole system on loopback, with a mixed batch of operations.

Two simulated providers (``reconciler.demo.sim``, shipped in the package) run as
subprocesses: ``sim``, whose webhooks arrive, and ``sim-lossy``, which loses or lies
about them; each earns or loses its own webhook trust, and the
summary shows each on its own. The service runs in this process on a fresh
SQLite file in the demo directory, next to a callback receiver that verifies
and counts every delivery. The batch goes through the real agent API; the run
exits 0 only when every operation ended or escalated with a reason within the
time bound, each finished operation's callback arrived exactly once and
``audit verify`` passes. The batch is planned by ``demo.plan`` and driven by
``demo.driver``; the summary is drawn by ``demo.report``.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import dataclasses
import importlib.resources
import logging
import os
import random
import secrets
import shutil
import signal
import threading
import time
import tomllib
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reconciler import logs
from reconciler.app import create_app
from reconciler.commands import database
from reconciler.commands.tokens import create as create_token
from reconciler.config import CallbackSettings, SchedulerSettings, ServerSettings, Settings
from reconciler.core.callback_secrets import agent_key, as_whsec
from reconciler.core.errors import DemoFailed
from reconciler.core.vocabulary import Scope
from reconciler.demo.driver import run_batch
from reconciler.demo.mcp_walk import McpWalk, walk
from reconciler.demo.plan import (
    DEMO_POLLING,
    EXPECTED_ENDS,
    LOSSY_DESCRIPTION,
    LOSSY_PROVIDER,
    PROVIDER,
    PROVIDERS,
    pick_repeats,
    plan_batch,
    plan_quick,
)
from reconciler.demo.processes import (
    HOST,
    CallbackReceiver,
    bound_socket,
    run_sim,
    serve_in_thread,
    url_of,
)
from reconciler.demo.report import RunReport, render_report
from reconciler.runtime import Runtime

MARKER = ".reconciler-demo"


@dataclass(frozen=True)
class DemoOptions:
    operations: int = 50
    seed: int = 7
    timeout: float = 120.0
    keep: bool = False
    quick: bool = False
    directory: Path = Path("demo-run")
    keep_serving: bool = False  # after the summary, serve the console until Ctrl-C


# --- where things live -----------------------------------------------------------------


def prepare_directory(path: Path) -> Path:
    """A fresh demo directory; an existing one is wiped only if an earlier demo made it."""
    path = path.resolve()
    if path.exists():
        if not (path / MARKER).exists() and any(path.iterdir()):
            raise DemoFailed(f"{path} exists and was not made by the demo; refusing to wipe it")
        shutil.rmtree(path)
    path.mkdir(parents=True)
    (path / MARKER).write_text("made by reconciler demo; wiped at every run\n")
    (path / "providers").mkdir()
    return path


def _whsec() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode("ascii")


# --- the service -----------------------------------------------------------------------


def demo_settings(base: Settings, workdir: Path, sim_urls: dict[str, str]) -> Settings:
    """The service's settings: one provider table (the sim's) per simulated provider."""
    sim_toml = importlib.resources.files("reconciler.demo") / "sim" / "sim.toml"
    with sim_toml.open("rb") as fh:
        template = tomllib.load(fh)["providers"]["sim"]
    providers = {}
    for name, url in sim_urls.items():
        table = copy.deepcopy(template)
        table["base_url"] = url
        table["polling"] = {**table.get("polling", {}), **DEMO_POLLING}
        if name == LOSSY_PROVIDER:
            table["description"] = LOSSY_DESCRIPTION
        providers[name] = table
    return base.model_copy(
        update={
            "database_url": f"sqlite:///{workdir / 'reconciler.db'}",
            "providers_dir": str(workdir / "providers"),
            "providers": providers,
            "hooks": (),
            "server": ServerSettings(wait_max_seconds=30.0),
            "scheduler": SchedulerSettings(tick_seconds=0.5, lease_seconds=10.0),
            "callbacks": CallbackSettings(
                allow_hosts=(HOST,),
                max_attempts=5,
                timeout_seconds=5.0,
                base_delay_seconds=0.5,
                max_delay_seconds=5.0,
            ),
        }
    )


@contextmanager
def service_logs(path: Path, level: str) -> Iterator[None]:
    """The service's log lines go to a file in the demo directory, not the terminal."""
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logs.JsonFormatter())
    root = logging.getLogger()
    handlers_before, level_before = root.handlers[:], root.level
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("httpx", "apscheduler"):
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        yield
    finally:
        root.handlers[:] = handlers_before
        root.setLevel(level_before)
        handler.close()


def _make_tokens(runtime: Runtime) -> tuple[str, str, str]:
    """The agent's and the operator's tokens, and the agent's own callback secret."""
    now = runtime.clock.now()
    agent, salt = create_token(runtime.db, "demo-agent", Scope.AGENT.value, now)
    operator, _ = create_token(runtime.db, "demo-operator", Scope.OPERATOR.value, now)
    assert runtime.callback_key is not None and salt is not None
    return agent, operator, as_whsec(agent_key(runtime.callback_key, salt))


def _audit(url: str, key: bytes | None) -> tuple[bool, str]:
    with database.opened(url) as db:
        report = database.audit(db, key)
    if report.fault is not None:
        return False, f"audit FAILED: {report.fault.describe()}"
    entries = f"{report.operations} operations, {report.entries} history entries intact"
    return True, f"audit ok: {entries}"


@dataclass(frozen=True)
class DemoSecrets:
    webhook: str = dataclasses.field(default_factory=_whsec, repr=False)
    callback: str = dataclasses.field(default_factory=_whsec, repr=False)
    sim_token: str = dataclasses.field(
        default_factory=lambda: secrets.token_urlsafe(24), repr=False
    )

    def service_env(self) -> dict[str, str]:
        return {
            **os.environ,
            "SIM_TOKEN": self.sim_token,
            "SIM_WEBHOOK_SECRETS": self.webhook,
            "RECONCILER_CALLBACK_SECRET": self.callback,
        }

    def sim_env(self) -> dict[str, str]:
        return {**os.environ, "SIM_TOKEN": self.sim_token, "SIM_WEBHOOK_SECRET": self.webhook}


def _run(options: DemoOptions, base: Settings, workdir: Path, started: float) -> RunReport:
    rng = random.Random(options.seed)
    if options.quick:
        planned = plan_quick(rng, options.seed)
    else:
        planned = plan_batch(options.operations, rng, options.seed)
    repeats = pick_repeats(planned, rng)
    keys = DemoSecrets()
    environ = keys.service_env()
    print(f"reconciler demo: {len(planned)} operations, seed {options.seed}, files in {workdir}")
    with ExitStack() as stack:
        stack.enter_context(service_logs(workdir / "service.log", base.log_level))
        receiver = CallbackReceiver(keys.callback)
        receiver_url = stack.enter_context(serve_in_thread(receiver.app, "callback receiver"))
        # The sim needs the service's URL (webhooks) and the service the sim's (base_url):
        # bind the service's socket first.
        service_sock = bound_socket()
        stack.callback(service_sock.close)
        sim_urls = {
            name: stack.enter_context(
                run_sim(
                    workdir / f"{name}.log",
                    keys.sim_env(),
                    f"{url_of(service_sock)}/webhooks/{name}",
                )
            )
            for name in PROVIDERS
        }
        settings = demo_settings(base, workdir, sim_urls)
        runtime = Runtime.build(settings, environ=environ)
        database.upgrade(runtime.db)
        *tokens, agent_secret = _make_tokens(runtime)
        receiver.trust(agent_secret)
        service_url = stack.enter_context(
            serve_in_thread(
                create_app(runtime), "service", service_sock, runtime.notifier.close_waits
            )
        )
        sims_text = ", ".join(f"{name} {url}" for name, url in sim_urls.items())
        print(f"service {service_url}, simulated providers {sims_text}, callbacks {receiver_url}")
        print(f"operator console {service_url}/console", flush=True)
        urls = (service_url, sim_urls, f"{receiver_url}/callbacks")
        deadline = started + options.timeout
        batch = asyncio.run(
            run_batch(
                urls,
                (tokens[0], tokens[1]),
                receiver,
                (planned, repeats),
                started,
                deadline,
                lambda: {n: v for n, v in runtime.trust_views().items() if n in PROVIDERS},
            )
        )
        mcp = _walk_mcp(service_url, tokens[0])
        key = settings.audit_key(environ)
        audit_ok, audit_text = _audit(settings.database_url, key.reveal().encode() if key else None)
        report = RunReport(
            seed=options.seed,
            timeout=options.timeout,
            elapsed=time.monotonic() - started,
            outcomes=batch.outcomes,
            repeats=batch.repeats,
            rejected_callbacks=batch.rejected_callbacks,
            problems=[*batch.problems, *mcp.problems],
            audit_text=audit_text,
            audit_ok=audit_ok,
            mcp_lines=mcp.lines,
            trust=batch.trust,
            expected_ends=EXPECTED_ENDS,
        )
        # Printed while the service still runs: --keep-serving leaves it up after this.
        print(render_report(report), flush=True)
        if options.keep_serving:
            serve_until_interrupted(f"{service_url}/console", tokens[1])
    return report


def _walk_mcp(service_url: str, token: str) -> McpWalk:
    """One job through the agent tools, after the batch; a failure is reported, not raised."""
    try:
        return asyncio.run(walk(service_url, token, PROVIDER))
    except Exception as exc:  # the SDK raises its own (and grouped) errors
        return McpWalk((), (f"the MCP walk-through failed: {exc!r}",))


def serve_until_interrupted(console_url: str, operator_token: str) -> None:
    """Keep the demo's service (and its escalated operations) up for the console, until Ctrl-C."""
    print(
        f"\nThe service keeps running: open {console_url} and sign in with this operator "
        f"token (demo-operator):\n  {operator_token}\nPress Ctrl-C to stop.",
        flush=True,
    )
    stop = threading.Event()
    try:
        while not stop.wait(3600):
            pass
    except KeyboardInterrupt:
        print("stopping the demo's service and simulated provider", flush=True)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def run_demo(options: DemoOptions, base: Settings) -> int:
    """Run the demo end to end; 0 only when the run met every check (see the module doc)."""
    if options.operations < 1 or options.timeout <= 0:
        raise DemoFailed("--operations must be at least 1 and --timeout greater than 0")
    started = time.monotonic()
    workdir = prepare_directory(options.directory)
    # SIGTERM stops the demo as Ctrl-C does: the service, then its providers, in order.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        report = _run(options, base, workdir, started)
    except DemoFailed as exc:
        raise DemoFailed(f"{exc.message} (logs in {workdir})") from None
    except (KeyboardInterrupt, BaseExceptionGroup) as exc:
        # Ctrl-C or SIGTERM raised inside a task group (an agent's connection being
        # opened) arrives wrapped in the group: it is the same interruption.
        if isinstance(exc, BaseExceptionGroup) and exc.subgroup(KeyboardInterrupt) is None:
            raise
        print(f"interrupted; the simulated provider is stopped, files kept in {workdir}")
        raise KeyboardInterrupt from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    failed = bool(report.failures())
    if failed or options.keep:
        print(f"demo files kept in {workdir} (service.log, sim.log, sim-lossy.log, reconciler.db)")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0
