"""Stopping a process tree by PID, including children that left the process group.

Ray's workers move to process groups (and sessions) of their own, so the Ray head's
fixture stops its tree from /proc; these processes do the same in miniature.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.support.proctree import alive, collect, stop_tree
from tests.support.waiting import wait_until

# A parent that starts a child in a new session (as Ray's raylet starts its workers),
# writes both PIDs, and ignores SIGTERM if told to.
PARENT = textwrap.dedent(
    """
    import signal, subprocess, sys, time
    if sys.argv[2] == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True
    )
    with open(sys.argv[1], "w") as fh:
        fh.write(f"{child.pid}\\n")
    time.sleep(120)
    """
)


def start_tree(tmp_path: Path, mode: str) -> tuple[subprocess.Popen[bytes], int]:
    pids = tmp_path / "pids"
    proc = subprocess.Popen([sys.executable, "-c", PARENT, str(pids), mode], start_new_session=True)
    wait_until(lambda: pids.exists() and pids.read_text().endswith("\n"), 20, "the child")
    return proc, int(pids.read_text())


def test_a_child_in_its_own_session_is_stopped_with_its_parent(tmp_path: Path):
    proc, child = start_tree(tmp_path, "polite")
    try:
        assert os.getpgid(child) != os.getpgid(proc.pid)
        tree = collect(proc.pid)
        assert {pid for pid, _ in tree} == {proc.pid, child}
        killed = stop_tree(proc.pid, grace_seconds=10)
        proc.wait(timeout=5)
        assert killed == set()  # SIGTERM was enough for both
        assert alive(tree) == set()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_what_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path):
    proc, _ = start_tree(tmp_path, "stubborn")
    try:
        tree = collect(proc.pid)
        killed = stop_tree(proc.pid, grace_seconds=0.5)
        proc.wait(timeout=5)
        assert proc.returncode == -signal.SIGKILL
        assert proc.pid in {pid for pid, _ in killed}
        assert alive(tree) == set()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_an_orphan_is_found_by_its_marker(tmp_path: Path):
    """A process whose parent already exited has lost its parent link; the unique
    directory on its command line still ties it to the run."""
    marker = str(tmp_path / "unique-run-dir")
    orphan = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; time.sleep(120)", marker],
        start_new_session=True,
    )
    try:
        unrelated_root = os.getpid() + 10_000_000  # no such process
        found = collect(unrelated_root, marker)
        assert {pid for pid, _ in found} == {orphan.pid}
        stop_tree(unrelated_root, marker=marker, grace_seconds=5)
        orphan.wait(timeout=5)
        assert alive(found) == set()
    finally:
        if orphan.poll() is None:
            orphan.kill()
