"""A busy machine, for tests whose subject is behaviour under load: processes that only spin.

Each is started and stopped here, by PID. The tests that use it bound what they check
with a timeout, never with a figure of speed.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

SPIN = "while True: pass"


@contextmanager
def busy(processes: int = 4) -> Iterator[None]:
    """``processes`` spinning processes (more than the cores: every other process waits)."""
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(processes)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
        for spinner in spinners:
            spinner.wait()
