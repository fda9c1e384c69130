"""No file in ``bench/`` is named like a module Python could import instead.

A bench runs as ``python bench/NAME.py``, which puts ``bench/`` first on ``sys.path``:
a ``bench/mcp.py`` then stood for the MCP SDK, and ``bench/faults.py`` failed at start
(``ModuleNotFoundError: 'mcp' is not a package``) as the service imported it.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"


def _installed_top_level() -> set[str]:
    names = set(sys.stdlib_module_names) | set(sys.builtin_module_names)
    names |= set(importlib.metadata.packages_distributions())
    return names


def _importable_elsewhere(name: str) -> bool:
    """Whether ``name`` is found on the path without bench/ and the checkout's root."""
    ours = {BENCH.resolve(), ROOT.resolve()}
    saved = sys.path[:]
    try:
        sys.path[:] = [p for p in saved if Path(p or ".").resolve() not in ours]
        found = importlib.util.find_spec(name) if name not in sys.modules else True
    finally:
        sys.path[:] = saved
    return bool(found)


def test_no_bench_file_shadows_an_installed_or_standard_module() -> None:
    installed = _installed_top_level()
    stems = sorted(p.stem for p in BENCH.glob("*.py"))
    assert stems, "bench/ has no scripts"
    shadowing = [s for s in stems if s in installed or _importable_elsewhere(s)]
    assert not shadowing, f"rename these bench files, they shadow modules: {shadowing}"
