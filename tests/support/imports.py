"""What a fresh interpreter holds after one import: the measure of a light import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SERVICE = Path(__file__).resolve().parents[2] / "service"


def modules_after(statement: str, cwd: Path | None = None) -> set[str]:
    """The modules loaded by ``statement`` in a new interpreter on the repository's sources
    (nothing of this process's imports or environment carries over)."""
    code = f"{statement}\nimport sys\nprint('\\n'.join(sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd or SERVICE.parent,
        env={"PYTHONPATH": str(SERVICE), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


def top_level(modules: set[str]) -> set[str]:
    return {m.split(".")[0] for m in modules}
