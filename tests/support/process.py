"""The service as a real process (``python -m reconciler serve``), for crash and leak tests.

Crash tests need a process they can SIGKILL; these helpers write its config
(a copy of the simulated provider's file pointed at the test's provider),
start it, wait for it, and stop only what they started, by PID.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from reconciler.storage import migrate
from reconciler.storage.database import Database
from reconciler.storage.tokens import create_token
from tests.support import forked, loopback
from tests.support.forked import ForkedProcess
from tests.support.servers import unused_port
from tests.support.stack import CALLBACK_SECRET, ROOT, SIM_TOKEN, SIM_TOML, WEBHOOK_SECRET
from tests.support.waiting import wait_until


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {value!r} as TOML here")


def provider_file(directory: Path, sim_url: str, **keys: Any) -> Path:
    """A copy of the sim's sim.toml at ``sim_url``; ``keys`` replace single keys
    (their names are unique in that file, e.g. ``deadline_seconds=5``)."""
    text = SIM_TOML.read_text("utf-8").replace('"http://127.0.0.1:9000"', json.dumps(sim_url))
    for key, value in keys.items():
        text, count = re.subn(rf"(?m)^{key} = .*$", f"{key} = {toml_value(value)}", text)
        if count != 1:
            raise KeyError(f"{key} is not a single key of sim.toml")
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "sim.toml"
    path.write_text(text, "utf-8")
    return path


def service_config(
    tmp_path: Path,
    db_url: str,
    sim_url: str,
    *,
    port: int | None = None,
    hooks: Sequence[str | Mapping[str, Any]] = (),
    scheduler: Mapping[str, Any] | None = None,
    log_level: str = "INFO",
    provider: Mapping[str, Any] | None = None,
    server: Mapping[str, Any] | None = None,
    retention: Mapping[str, Any] | None = None,
) -> tuple[Path, int]:
    """Write reconciler.toml and the provider file; returns the config path and the port."""
    port = port or unused_port()
    providers = tmp_path / "providers"
    provider_file(providers, sim_url, **(provider or {}))
    sched = {"tick_seconds": 0.2, "lease_seconds": 5.0, **(scheduler or {})}
    lines = [
        f"database_url = {json.dumps(db_url)}",
        f"providers_dir = {json.dumps(str(providers))}",
        f"hooks = {toml_value(list(hooks))}",
        f"log_level = {json.dumps(log_level)}",
        "[server]",
        'host = "127.0.0.1"',
        f"port = {port}",
        *(f"{k} = {toml_value(v)}" for k, v in (server or {}).items()),
        "[scheduler]",
        *(f"{k} = {toml_value(v)}" for k, v in sched.items()),
        "[callbacks]",
        'allow_hosts = ["127.0.0.1"]',
        "[retention]",
        *(f"{k} = {toml_value(v)}" for k, v in (retention or {}).items()),
    ]
    config = tmp_path / "reconciler.toml"
    config.write_text("\n".join(lines) + "\n", "utf-8")
    return config, port


def service_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECONCILER_")}
    env.update(
        SIM_TOKEN=SIM_TOKEN,
        SIM_WEBHOOK_SECRETS=WEBHOOK_SECRET,
        RECONCILER_CALLBACK_SECRET=CALLBACK_SECRET,
    )
    env.update(extra or {})
    return env


def cli(
    config: Path, *args: str, env: Mapping[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``reconciler *args --config`` in its own process (``tests.support.forked``)."""
    argv = [*args, "--config", str(config)]
    return forked.run(argv, env or service_env(), ROOT, timeout)


@contextmanager
def _environment(env: Mapping[str, str]) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def cli_here(
    config: Path, *args: str, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``cli`` in this process: the same parser and handlers through ``main(argv)``, with the
    same environment and captured output, without an interpreter start per command. For
    commands a test uses or reads; ``cli`` where the process itself is what is tested."""
    from reconciler.cli import main

    argv = [*args, "--config", str(config)]
    out, err = io.StringIO(), io.StringIO()
    with _environment(env or service_env()), redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse refusing the arguments
            code = exc.code if isinstance(exc.code, int) else 2
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


@dataclass
class ServiceProcess:
    proc: ForkedProcess
    url: str
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, timeout: float = 120) -> None:
        """Bounded generously: an interpreter start on a loaded machine can take a minute."""

        def ready() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the service exited during start-up; see {self.log}")
            try:
                return loopback.get(f"{self.url}/readyz", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(ready, timeout, f"the service to be ready (see {self.log})")

    def kill(self) -> None:
        """SIGKILL: no shutdown handlers, no flushing, exactly like a crash."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()


@contextmanager
def service_process(
    config: Path,
    port: int,
    *,
    env: Mapping[str, str] | None = None,
    log: Path | None = None,
    ready: bool = True,
) -> Iterator[ServiceProcess]:
    """``reconciler serve --config`` in its own process (``tests.support.forked``); stopped
    by its PID on exit."""
    log = log or config.with_suffix(f".{port}.log")
    proc = forked.reconciler(["serve", "--config", str(config)], env or service_env(), ROOT, log)
    service = ServiceProcess(proc, f"http://127.0.0.1:{port}", log)
    try:
        if ready:
            service.wait_ready()
        yield service
    finally:
        service.stop()


def upgrade(db_url: str) -> None:
    """The schema at head, in this process: what ``reconciler db upgrade`` runs, without an
    interpreter start (the command itself is tested where the command is what is tested)."""
    db = Database(db_url)
    try:
        migrate.upgrade(db)
    finally:
        db.dispose()


def make_tokens(db_url: str) -> tuple[str, str]:
    """An agent token ``agent-1`` and an operator token ``ops-1`` on a migrated database."""
    db = Database(db_url)
    try:
        with db.write() as conn:
            now = datetime.now().astimezone()
            agent = create_token(conn, "agent-1", "agent", now)
            operator = create_token(conn, "ops-1", "operator", now)
    finally:
        db.dispose()
    return agent, operator
