"""Stop a process and everything it started, by PID, read from /proc.

A process group is not enough for servers such as Ray whose workers move to groups
of their own: the tree is collected from parent links first, together with the
processes whose command line names a directory unique to this run (a child whose
parent already exited has been handed to init and has lost its parent link). Each
PID is kept with its start time, so a PID the kernel has reused is never signalled.
"""

from __future__ import annotations

import os
import signal
import time
from contextlib import suppress
from pathlib import Path

PROC = Path("/proc")

# (pid, start time in clock ticks since boot): a PID alone may be reused.
Proc = tuple[int, int]


def _stat(pid: int) -> tuple[int, int, str] | None:
    """(parent pid, start time, state) of ``pid``, or None once it is gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: the fields follow the last ")".
    fields = text.rsplit(")", 1)[1].split()
    return int(fields[1]), int(fields[19]), fields[0]


def _cmdline(pid: int) -> str:
    try:
        return (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _all_pids() -> list[int]:
    return [int(entry.name) for entry in PROC.iterdir() if entry.name.isdigit()]


def collect(root: int, marker: str | None = None) -> set[Proc]:
    """``root``, its descendants, and (when ``marker`` is given) every process whose
    command line contains ``marker``; zombies are left out (they are already dead)."""
    stats = {pid: stat for pid in _all_pids() if (stat := _stat(pid)) is not None}
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    todo = [root] if root in stats else []
    if marker:
        todo += [pid for pid in stats if pid != os.getpid() and marker in _cmdline(pid)]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return {(pid, stats[pid][1]) for pid in found if stats[pid][2] != "Z"}


def alive(procs: set[Proc]) -> set[Proc]:
    """Those of ``procs`` still running as the same process (not exited, not a zombie)."""
    left = set()
    for pid, started in procs:
        stat = _stat(pid)
        if stat is not None and stat[1] == started and stat[2] != "Z":
            left.add((pid, started))
    return left


def _signal(procs: set[Proc], signum: int) -> None:
    for pid, _ in alive(procs):
        with suppress(ProcessLookupError):
            os.kill(pid, signum)


def stop_tree(root: int, *, marker: str | None = None, grace_seconds: float = 10.0) -> set[Proc]:
    """Stop the tree of ``root`` (see ``collect``); returns the processes that had to
    be SIGKILLed.

    SIGTERM goes to the root alone first, so that a supervisor stops its children in
    its own order (signalled together, a child may wait on a sibling that is already
    gone); once the root has exited, the rest of the tree gets SIGTERM too; whatever
    still runs when ``grace_seconds`` are over gets SIGKILL.
    """
    procs = collect(root, marker)
    head = {proc for proc in procs if proc[0] == root}
    _signal(head, signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    rest_signalled: set[Proc] = set()
    while alive(procs) and time.monotonic() < deadline:
        time.sleep(0.1)
        # A process that was starting as the signal went out may have forked since.
        procs |= collect(root, marker)
        if not alive(head):
            _signal(procs - rest_signalled, signal.SIGTERM)
            rest_signalled |= procs
    killed = alive(procs)
    _signal(killed, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while alive(killed) and time.monotonic() < deadline:
        time.sleep(0.05)
    return killed
