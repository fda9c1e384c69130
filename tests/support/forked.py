"""``reconciler serve`` (or any ``reconciler`` command) as its own process, forked from an
interpreter that has already imported the service.

A fresh interpreter spends about 3 s of CPU importing the service (the MCP SDK, SQLAlchemy,
Alembic, pydantic models) before it serves anything; the suite starts well over a hundred
service processes, so that import was a third of its CPU. Here multiprocessing's forkserver
imports it once per test process and forks a child for each start. The child is a process of
its own (its own PID, memory, event loop, database connections and sockets) that a test
SIGKILLs or SIGTERMs exactly as before; it runs the same ``main(argv)`` the console script
runs. What it does not prove is that ``python -m reconciler`` starts from nothing: the tests
whose subject is that (the demo, the installed wheel, the deploy files, stdio MCP) still
start an interpreter.

The forkserver holds no threads, connections or event loops when it forks (it only
imported modules), so the child starts clean.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from functools import cache
from multiprocessing.context import ForkServerContext
from pathlib import Path

# What a service start imports: the app and the command line's handlers.
PRELOAD = ["reconciler.cli", "reconciler.app", "reconciler.commands.create", "psycopg"]


@cache
def _context() -> ForkServerContext:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    return context


def _child(argv: list[str], env: dict[str, str], cwd: str, stdout: str, stderr: str) -> None:
    # What the forkserver imported stays out of the collector's sight (a list splice, no
    # write to any object): the full collection a service runs at start would otherwise
    # touch every inherited object and copy each page of them (0.35 s of CPU a start, 0.2 s now).
    gc.freeze()
    for fd, path in ((1, stdout), (2, stderr)):
        opened = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.dup2(opened, fd)
        os.close(opened)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    # A parent that ignores SIGINT (the forkserver does) must not pass that on: ^C and
    # SIGTERM should reach the service's own handlers.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.argv = ["reconciler", *argv]
    from reconciler.cli import main

    sys.exit(main(argv))


class ForkedProcess:
    """The part of ``subprocess.Popen`` the tests use: pid, poll, wait, terminate, kill,
    returncode (negative for a signal, as Popen's). Daemonic, so a test process that ends
    with one still running terminates it rather than waiting for it."""

    def __init__(
        self, argv: Sequence[str], env: Mapping[str, str], cwd: Path, stdout: Path, stderr: Path
    ) -> None:
        self.args = list(argv)
        self._process = _context().Process(
            target=_child,
            args=(self.args, dict(env), str(cwd), str(stdout), str(stderr)),
            daemon=True,
        )
        self._process.start()
        assert self._process.pid is not None
        self.pid: int = self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        code = self._process.exitcode
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return code

    def send_signal(self, signum: int) -> None:
        if self._process.exitcode is None:
            os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def reconciler(argv: Sequence[str], env: Mapping[str, str], cwd: Path, log: Path) -> ForkedProcess:
    """``reconciler *argv`` in a forked process; its stdout and stderr appended to ``log``."""
    return ForkedProcess(argv, env, cwd, log, log)


def run(
    argv: Sequence[str], env: Mapping[str, str], cwd: Path, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``reconciler *argv`` to its end in a forked process, as ``subprocess.run`` with
    ``capture_output=True, text=True`` returns it; stdin is empty."""
    with tempfile.TemporaryDirectory(prefix="reconciler-cli-") as scratch:
        out, err = Path(scratch, "stdout"), Path(scratch, "stderr")
        process = ForkedProcess(argv, env, cwd, out, err)
        try:
            code = process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
            raise
        return subprocess.CompletedProcess(
            list(argv), code, out.read_text("utf-8"), err.read_text("utf-8")
        )
