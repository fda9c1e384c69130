"""The demo stops when asked, in bounded time under load, and leaves no process behind.

Before: a ``make test`` run found the demo still running 30 s after its Ctrl-C; the test
SIGKILLed it and its two simulated providers lived on. Found with ``py-spy dump``: after
the demo had stopped everything (about 1 s), the interpreter's last full garbage
collections walked the whole heap, 13 of a 14 s stop on a machine with 14 busy processes
on 2 cores; the demo now takes its objects out of the collector's view as it ends. A
SIGTERM killed the demo outright (no handler), its providers with no one to stop them,
and a SIGKILL, which nothing can handle, did the same. Now SIGTERM stops it as Ctrl-C
does, and each provider asks the kernel to kill it with its parent (``demo.sim.lifeline``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.load import busy
from tests.support.proctree import Proc, alive, collect
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
# A bound on a stop, not a figure of its speed: measured 1-3 s under the load below.
STOP_WITHIN = 30.0
PROVIDERS = 2


@contextmanager
def demo(tmp_path: Path, *extra: str) -> Iterator[tuple[subprocess.Popen[str], list[str]]]:
    """``reconciler demo`` as a user starts it; yields it and the lines it printed so far."""
    command = [sys.executable, "-m", "reconciler", "demo", "--operations", "6"]
    command += ["--timeout", "60", "--dir", str(tmp_path / "demo-run"), *extra]
    with (tmp_path / "demo-stderr.txt").open("w") as stderr:
        proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr, text=True)
    # Bounds a hang of the test only; the demo ends itself at its --timeout.
    watchdog = threading.Timer(150, proc.kill)
    watchdog.start()
    lines: list[str] = []
    try:
        yield proc, lines
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _read_until(proc: subprocess.Popen[str], lines: list[str], prefix: str) -> str:
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if line.lstrip().startswith(prefix) or prefix in line:
            return line
    raise AssertionError(f"the demo ended before printing {prefix!r}: {''.join(lines)}")


def _providers(demo_pid: int) -> set[Proc]:
    """The demo's child processes (its two simulated providers), each with its start time."""
    children = collect(demo_pid) - {p for p in collect(demo_pid) if p[0] == demo_pid}
    assert len(children) == PROVIDERS, children
    return children


def _gone(children: set[Proc]) -> None:
    try:
        wait_until(lambda: not alive(children), STOP_WITHIN, "the simulated providers to end")
    finally:
        for pid, _ in alive(children):  # left behind: the test stops them itself
            os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_a_demo_killed_with_sigkill_leaves_no_child_alive(tmp_path: Path) -> None:
    with demo(tmp_path) as (proc, lines):
        _read_until(proc, lines, "service http://")  # both providers answer by now
        children = _providers(proc.pid)
        proc.kill()
        proc.wait()
        _gone(children)


@pytest.mark.slow
def test_sigterm_mid_run_under_load_stops_the_demo_within_a_bound(tmp_path: Path) -> None:
    # Ctrl-C under load: test_demo.py, whose run ends with one.
    with demo(tmp_path) as (proc, lines):
        _read_until(proc, lines, "settled")  # operations in flight
        children = _providers(proc.pid)
        with busy():
            proc.send_signal(signal.SIGTERM)
            try:
                out, _ = proc.communicate(timeout=STOP_WITHIN)
            except subprocess.TimeoutExpired:
                pytest.fail(f"the demo did not stop within {STOP_WITHIN} s of its SIGTERM")
        _gone(children)
    assert proc.returncode == 130, "".join(lines) + out  # interrupted, as the shell says
    assert "interrupted; the simulated provider is stopped" in out
    errors = (tmp_path / "demo-stderr.txt").read_text()
    assert "Traceback" not in errors, errors
