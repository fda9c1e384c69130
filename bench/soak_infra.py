"""The soak's moving parts: databases, service replicas, the callback receiver, webhook routing.

Everything here starts processes or servers and stops only what it started, by PID.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from tests.support import forked, loopback
from tests.support.process import ServiceProcess, cli, provider_file, service_env, toml_value
from tests.support.servers import unused_port
from tests.support.stack import ROOT

PG_BIN_DIRS = ("/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/16/bin")


# --- PostgreSQL -----------------------------------------------------------------------


def _pg_binary(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    for directory in PG_BIN_DIRS:
        candidate = Path(directory) / name
        if candidate.exists():
            return str(candidate)
    raise RuntimeError(f"{name} not found on PATH or in {', '.join(PG_BIN_DIRS)}")


class ThrowawayPostgres:
    """initdb + pg_ctl in a temporary directory on a loopback port; removed on stop."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="soak-pg-"))
        self.data = self.dir / "data"
        self.port = unused_port()
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            shutil.chown(self.dir, "postgres", "postgres")

    def _run(self, *args: str) -> None:
        cmd = list(args)
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{args[0]} failed: {done.stderr.strip() or done.stdout.strip()}")

    def start(self, settings: str = "") -> str:
        """Start the cluster; ``settings`` are further ``-c`` options. Its admin URL."""
        self._run(
            _pg_binary("initdb"),
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--no-sync",
        )
        self._pg_ctl_start(f"-c max_connections=200 -c shared_buffers=128MB {settings}".rstrip())
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _pg_ctl_start(self, settings: str = "") -> None:
        """Start the server of the existing data directory on its loopback port and socket
        directory; ``settings`` are further ``-c`` options."""
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 {settings}".rstrip()
        self._run(
            _pg_binary("pg_ctl"),
            "-D",
            str(self.data),
            "-o",
            options,
            "-l",
            str(self.dir / "server.log"),
            "-w",
            "-t",
            "60",
            "start",
        )

    def _pg_ctl_stop(self, mode: str) -> None:
        self._run(_pg_binary("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def stop(self, keep: bool = False) -> None:
        """Stop the server; the data directory goes too unless ``keep`` (for a post-mortem:
        ``pg_ctl -D <dir>/data -o "-p PORT -k <dir>" start``)."""
        try:
            if (self.data / "postmaster.pid").exists():
                self._pg_ctl_stop("fast")
        finally:
            if not keep:
                shutil.rmtree(self.dir, ignore_errors=True)


def create_database(admin_url: str, prefix: str = "reconciler_soak") -> str:
    name = f"{prefix}_{secrets.token_hex(4)}"
    engine = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    finally:
        engine.dispose()
    return str(sa.make_url(admin_url).set(database=name).render_as_string(hide_password=False))


def drop_database(admin_url: str, url: str) -> None:
    name = sa.make_url(url).database
    engine = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        engine.dispose()


# --- service replicas -----------------------------------------------------------------


@dataclass(frozen=True)
class ServiceSettings:
    lease_seconds: float = 8.0
    tick_seconds: float = 0.25
    deadline_seconds: float = 60.0
    cancel_deadline_seconds: float = 20.0
    create_deadline_seconds: float = 30.0
    status_timeout_seconds: float = 5.0
    callback_base_delay: float = 0.3
    callback_max_delay: float = 3.0
    callback_max_attempts: int = 8
    callback_timeout: float = 4.0
    hooks: tuple[str, ...] = ()
    # Webhook trust on, and quick to earn: the soak's random webhook loss then keeps
    # trusting and distrusting the provider, which is the outage case over and over.
    trust_after: int = 5
    webhook_grace_seconds: float = 2.0


def _add_keys(path: Path, section: str, keys: dict[str, object]) -> None:
    """Add keys (absent from sim.toml) at the top of ``[providers.sim.<section>]``."""
    text = path.read_text("utf-8")
    added = "".join(f"\n{key} = {toml_value(value)}" for key, value in keys.items())
    text, count = re.subn(
        rf"(?m)^\[providers\.sim\.{section}\]$", f"[providers.sim.{section}]{added}", text
    )
    if count != 1:
        raise RuntimeError(f"sim.toml has no [providers.sim.{section}] section")
    path.write_text(text, "utf-8")


def write_config(directory: Path, db_url: str, sim_url: str, port: int, s: ServiceSettings) -> Path:
    """reconciler.toml and the sim's provider file for one replica."""
    providers = directory / "providers"
    path = provider_file(
        providers,
        sim_url,
        deadline_seconds=s.deadline_seconds,
        cancel_deadline_seconds=s.cancel_deadline_seconds,
        create_deadline_seconds=s.create_deadline_seconds,
    )
    _add_keys(path, "status", {"timeout_seconds": s.status_timeout_seconds})
    _add_keys(
        path,
        "polling",
        {"trust_after": s.trust_after, "webhook_grace_seconds": s.webhook_grace_seconds},
    )
    lines = [
        f"database_url = {toml_value(db_url)}",
        f"providers_dir = {toml_value(str(providers))}",
        f"hooks = {toml_value(list(s.hooks))}",
        'log_level = "WARNING"',
        "[server]",
        'host = "127.0.0.1"',
        f"port = {port}",
        "[scheduler]",
        f"tick_seconds = {s.tick_seconds!r}",
        f"lease_seconds = {s.lease_seconds!r}",
        "[callbacks]",
        'allow_hosts = ["127.0.0.1"]',
        f"base_delay_seconds = {s.callback_base_delay!r}",
        f"max_delay_seconds = {s.callback_max_delay!r}",
        f"max_attempts = {s.callback_max_attempts}",
        f"timeout_seconds = {s.callback_timeout!r}",
    ]
    config = directory / "reconciler.toml"
    config.write_text("\n".join(lines) + "\n", "utf-8")
    return config


@dataclass
class Replica:
    index: int
    port: int
    config: Path
    log: Path
    env: dict[str, str]
    process: ServiceProcess | None = None
    starts: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def start(self) -> None:
        with self.log.open("ab") as out:
            out.write(f"--- start {self.starts + 1} at {time.time():.3f}\n".encode())
        proc = forked.reconciler(["serve", "--config", str(self.config)], self.env, ROOT, self.log)
        self.process = ServiceProcess(proc, self.url, self.log)
        self.starts += 1

    def wait_ready(self, timeout: float = 90.0) -> None:
        assert self.process is not None
        self.process.wait_ready(timeout)

    def alive(self) -> bool:
        return self.process is not None and self.process.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL by PID: no shutdown handlers run."""
        if self.process is not None:
            self.process.kill()

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


class Fleet:
    """The service replicas on one database; knows which are up for routing."""

    def __init__(self, replicas: Sequence[Replica]) -> None:
        self.replicas = list(replicas)
        self._up: set[int] = set()
        self._lock = threading.Lock()

    def start_all(self) -> None:
        for replica in self.replicas:
            replica.start()
        for replica in self.replicas:
            replica.wait_ready()
            self.mark_up(replica.index)

    def mark_up(self, index: int) -> None:
        with self._lock:
            self._up.add(index)

    def mark_down(self, index: int) -> None:
        with self._lock:
            self._up.discard(index)

    def up_urls(self) -> list[str]:
        with self._lock:
            up = sorted(self._up)
        return [self.replicas[i].url for i in up] or [r.url for r in self.replicas]

    def pick(self, rng: random.Random) -> str:
        return rng.choice(self.up_urls())

    def ensure_up(self) -> None:
        """Start any replica that is not running (after an interrupted kill) and wait for all."""
        for replica in self.replicas:
            if not replica.alive():
                replica.start()
        for replica in self.replicas:
            replica.wait_ready()
            self.mark_up(replica.index)

    def stop_all(self) -> None:
        for replica in self.replicas:
            replica.stop()
            self.mark_down(replica.index)


def make_fleet(
    workdir: Path,
    db_url: str,
    sim_url: str,
    ports: Sequence[int],
    settings: ServiceSettings,
    env_extra: Mapping[str, str],
) -> Fleet:
    replicas = []
    for index, port in enumerate(ports):
        directory = workdir / f"replica{index}"
        directory.mkdir(parents=True, exist_ok=True)
        config = write_config(directory, db_url, sim_url, port, settings)
        replicas.append(
            Replica(index, port, config, directory / "service.log", service_env(env_extra))
        )
    return Fleet(replicas)


def make_token(config: Path, env: Mapping[str, str], name: str, scope: str) -> str:
    made = cli(config, "tokens", "create", "--name", name, "--scope", scope, env=env)
    if made.returncode != 0:
        raise RuntimeError(f"tokens create failed: {made.stderr.strip()}")
    return made.stdout.strip()


def upgrade(config: Path, env: Mapping[str, str]) -> None:
    done = cli(config, "db", "upgrade", env=env, timeout=180)
    if done.returncode != 0:
        raise RuntimeError(f"db upgrade failed: {done.stderr.strip()}")


def audit_verify(config: Path, env: Mapping[str, str]) -> tuple[int, str]:
    done = cli(config, "audit", "verify", env=env, timeout=600)
    return done.returncode, (done.stdout + done.stderr).strip()


# --- the simulated provider's process ------------------------------------------------------


@dataclass
class SimProcess:
    """``python -m bench.soak_sim``: the provider, its chaos and its webhook router."""

    port: int
    seed: int
    replicas: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        args = [sys.executable, "-m", "bench.soak_sim", "--port", str(self.port)]
        args += ["--seed", str(self.seed)]
        for replica in self.replicas:
            args += ["--replica", replica]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(args, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the simulated provider exited; see {self.log}")
            try:
                if loopback.get(f"{self.url}/_sim/stats", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"the simulated provider did not start; see {self.log}")

    def get(self, path: str) -> Any:
        response = loopback.get(f"{self.url}/_sim/{path}", timeout=600)
        response.raise_for_status()
        return response.json()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


# --- the agent's callback receiver -------------------------------------------------------


@dataclass(frozen=True)
class Delivery:
    webhook_id: str
    name: str
    arrived: float  # wall-clock seconds when the request arrived
    answered: float  # wall-clock seconds when the answer was handed back
    status: int
    hung: bool  # answered only after the service's callback timeout


@dataclass
class Receiver:
    """Answers callbacks at random (seeded): mostly 2xx, some 5xx/429, some slow or hanging."""

    rng: random.Random
    hang_seconds: float = 6.0
    deliveries: list[Delivery] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self.app = Starlette(routes=[Route("/cb/{name}", self._handle, methods=["POST"])])

    def _draw(self) -> tuple[int, float, bool]:
        with self._lock:
            roll = self.rng.random()
        if roll < 0.07:
            return 500, 0.0, False
        if roll < 0.10:
            return 429, 0.0, False
        if roll < 0.13:
            return 204, 1.0, False
        if roll < 0.145:
            return 204, self.hang_seconds, True
        return 204, 0.0, False

    async def _handle(self, request: Request) -> Response:
        arrived = time.time()
        try:
            await request.body()
        except ClientDisconnect:
            # The service gave up before the body arrived: a delivery all the same.
            with self._lock:
                now = time.time()
                self.deliveries.append(
                    Delivery(request.headers.get("webhook-id", ""), "", arrived, now, 499, True)
                )
            return Response(status_code=499)
        status, delay, hung = self._draw()
        if delay:
            await asyncio.sleep(delay)
        headers = {"Retry-After": "1"} if status == 429 else {}
        with self._lock:
            self.deliveries.append(
                Delivery(
                    request.headers.get("webhook-id", ""),
                    request.path_params["name"],
                    arrived,
                    time.time(),
                    status,
                    hung,
                )
            )
        return Response(status_code=status, headers=headers)

    def snapshot(self) -> list[Delivery]:
        with self._lock:
            return list(self.deliveries)
