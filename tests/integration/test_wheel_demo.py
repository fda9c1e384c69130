"""``reconciler demo`` from an installed wheel, with nothing of the repository beside it.

The wheel is built from a copy of the sources (so no ``build/`` left in the clone can add
files the tree no longer has), installed in a fresh venv made without
``--system-site-packages``, with its dependencies from wheels packed from this
environment's installed distributions (``tests/support/wheelhouse.py``) and ``--no-index``:
no network, the versions the rest of the suite runs against. The demo then runs from a
directory outside the repository, as a user who ran ``pip install`` would run it.

The simulated provider ships in the package, but stays apart from the service: it
imports nothing of ours but itself, and the service never imports it (the demo starts it
as a process).
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.support.imports import modules_after
from tests.support.wheelhouse import wheelhouse

REPO = Path(__file__).resolve().parents[2]
SERVICE = REPO / "service"


def _clean_env(**extra: str) -> dict[str, str]:
    """This environment without what could point Python or pip at the repository or an index."""
    drop = ("PYTHON", "PIP_", "RECONCILER_", "VIRTUAL_ENV", "SIM_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    # No pip configuration file either: it may name indexes and find-links.
    return {**env, "PIP_CONFIG_FILE": os.devnull, **extra}


def _run(args: list[str | Path], cwd: Path, timeout: float, env: dict[str, str]) -> str:
    done = subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, f"{args[:4]} exited {done.returncode}:\n{done.stdout}{done.stderr}"
    return done.stdout


def test_the_sim_imports_nothing_of_the_service_nor_of_the_tests(tmp_path: Path) -> None:
    modules = modules_after("import reconciler.demo.sim.__main__", tmp_path)
    ours = {m for m in modules if m.split(".")[0] in {"reconciler", "tests", "fixtures"}}
    stray = {m for m in ours if not m.startswith("reconciler.demo.sim")}
    # Its parent packages are imported with it; they hold a docstring and a version.
    assert stray == {"reconciler", "reconciler.demo"}
    # A test dependency (the wheel does not carry it) and the service's own stack.
    assert not modules & {"standardwebhooks", "sqlalchemy", "sqlmodel", "jsonschema", "mcp"}


def _imported(path: Path, package: str) -> set[str]:
    """The modules ``path`` (a module of ``package``) names in its import statements."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def test_no_module_of_the_service_imports_the_sim() -> None:
    # By its import statements (the demo starts the sim as a process, by name).
    sim = SERVICE / "reconciler" / "demo" / "sim"
    offenders = {}
    for path in (SERVICE / "reconciler").rglob("*.py"):
        if path.is_relative_to(sim):
            continue
        package = ".".join(path.parent.relative_to(SERVICE).parts)
        found = {n for n in _imported(path, package) if n.startswith("reconciler.demo.sim")}
        if found:
            offenders[str(path.relative_to(SERVICE))] = found
    assert offenders == {}


def _copy_sources(dest: Path) -> Path:
    dest.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, dest / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc")
    shutil.copytree(SERVICE, dest / "service", ignore=ignore)
    return dest


def _build_wheel(tmp_path: Path) -> Path:
    """The wheel, by pyproject's build backend from this venv (as ``pip wheel
    --no-build-isolation`` calls it, without pip's two extra processes)."""
    dist = tmp_path / "dist"
    source = _copy_sources(tmp_path / "source")
    backend = tomllib.loads((source / "pyproject.toml").read_text())["build-system"]
    code = f"import {backend['build-backend']} as b; b.build_wheel({str(dist)!r})"
    _run([sys.executable, "-c", code], source, 120, _clean_env())
    (wheel,) = dist.glob("reconciler-*.whl")
    return wheel


def _install(wheel: Path, tmp_path: Path) -> Path:
    venv = tmp_path / "venv"
    house = tmp_path / "wheelhouse"
    wheelhouse(wheel, house)
    env = _clean_env()
    # Without pip of its own: this environment's pip installs into it (--python).
    _run([sys.executable, "-m", "venv", "--without-pip", venv], tmp_path, 60, env)
    pip = [sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install", "-q"]
    _run([*pip, "--no-compile", "--no-index", "--find-links", house, wheel], tmp_path, 180, env)
    return venv


@pytest.mark.slow
def test_an_installed_wheel_runs_the_quick_demo_to_a_clean_summary(tmp_path: Path) -> None:
    venv = _install(_build_wheel(tmp_path), tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = _clean_env()
    assert "include-system-site-packages = false" in (venv / "pyvenv.cfg").read_text()
    show = "import reconciler; print(reconciler.__file__)"
    where = _run([venv / "bin" / "python", "-c", show], elsewhere, 30, env)
    assert Path(where.strip()).is_relative_to(venv / "lib"), where

    command = [venv / "bin" / "reconciler", "demo", "--quick", "--dir", elsewhere / "demo-run"]
    out = _run(command, elsewhere, 120, env)

    assert "RESULT: OK: every operation ended or escalated with a reason" in out
    assert "Summary: 4 operations" in out
    ends = dict(re.findall(r"^  (succeeded|cancelled|escalated) +(\d+)", out, re.MULTILINE))
    assert ends == {"succeeded": "2", "cancelled": "1", "escalated": "1"}
    # The escalation with its reason and message; the lost webhook found by polling.
    assert "  unknown_state: 1 operation(s)" in out
    assert "External job needs a decision" in out
    assert re.search(r"^  webhooks_lost +1  succeeded 1$", out, re.MULTILINE)
    # Both simulated providers, each with its own webhook trust.
    assert "Webhook trust (provider sim)" in out and "Webhook trust (provider sim-lossy)" in out
    assert "exactly once each: 3 of 3  -> ok" in out
    assert "1 returned the existing operation  -> ok" in out
    # The batch and the job started through MCP, in an intact history.
    assert re.search(r"^  audit ok: 5 operations, \d+ history entries intact$", out, re.MULTILINE)
    assert "-> succeeded, done=true" in out[out.index("One job through MCP") :]
    assert not (elsewhere / "demo-run").exists()  # removed without --keep
