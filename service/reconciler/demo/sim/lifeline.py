"""A helper process of the demo dies with the demo, however the demo ends (Linux).

The demo stops its simulated providers itself when it stops (Ctrl-C, SIGTERM, the end of
the run). A demo killed with SIGKILL runs no code at all: before, its two simulated
providers then lived on, holding their ports. Each now asks the kernel, as it starts,
for SIGKILL when its parent dies (``PR_SET_PDEATHSIG``), and checks that the parent did
not die before it asked.

The kernel's "parent" is the thread that started the process: the demo starts its
providers from its main thread, which lives as long as the demo.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when its parent dies; exit at once if it has died already."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_PDEATHSIG): {os.strerror(errno)}")
    if os.getppid() != parent_pid:
        os._exit(0)  # the parent died before the request took: nobody will stop us
