"""No module of the package is over 600 lines: read from the source.

A module that grows past that does more than one job, and the next change to it is
made by someone who cannot see all of it at once: split it by what its parts do (the
SQL text apart from the code that runs it, the reads apart from the writes) before it
lands, not after.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "service" / "reconciler"
MOST_LINES = 600


def over_the_limit(root: Path) -> list[str]:
    """Each module under ``root`` with more than ``MOST_LINES`` lines, with its count."""
    found = []
    for path in sorted(root.rglob("*.py")):
        count = len(path.read_text(encoding="utf-8").splitlines())
        if count > MOST_LINES:
            found.append(f"{path.relative_to(root)}: {count}")
    return found


def test_no_module_is_over_the_limit() -> None:
    assert len(list(ROOT.rglob("*.py"))) > 100, "the package was not found"
    over = over_the_limit(ROOT)
    assert not over, f"over {MOST_LINES} lines:\n" + "\n".join(over)


def test_a_long_module_is_found(tmp_path: Path) -> None:
    (tmp_path / "short.py").write_text("x = 1\n" * MOST_LINES)
    (tmp_path / "long.py").write_text("x = 1\n" * (MOST_LINES + 1))
    assert over_the_limit(tmp_path) == [f"long.py: {MOST_LINES + 1}"]
