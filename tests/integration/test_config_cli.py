"""A configuration error through the real command line: one line naming file and key, exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_cli_reports_one_line_and_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[server]\nport = -1\n")
    result = subprocess.run(
        [sys.executable, "-m", "reconciler", "audit", "verify", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert f"{path}: server.port: must be at least 1" in result.stderr
    assert "Traceback" not in result.stderr
