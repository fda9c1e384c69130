"""Wheels of distributions already installed here, so a fresh venv installs without a network.

Each installed distribution is packed back into a wheel from its files (its RECORD), and
the set is the closure of a wheel's requirements over what this environment has
installed: the versions the tests run against, whatever index they first came from.
"""

from __future__ import annotations

import base64
import csv
import email
import hashlib
import io
import re
import zipfile
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement

# Written by the installer of this environment, not part of a distribution's wheel.
_INSTALLER_FILES = {"INSTALLER", "REQUESTED", "direct_url.json", "RECORD"}


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _needed(requirements: Iterable[str], extras: frozenset[str]) -> list[Requirement]:
    out = []
    for text in requirements:
        req = Requirement(text)
        marker_extras = extras or frozenset({""})
        if req.marker is None or any(
            req.marker.evaluate({**default_environment(), "extra": e}) for e in marker_extras
        ):
            out.append(req)
    return out


def closure(requirements: Iterable[str]) -> list[metadata.Distribution]:
    """The installed distributions ``requirements`` need, their extras' included."""
    installed = {_key(d.metadata["Name"]): d for d in metadata.distributions()}
    found: dict[str, metadata.Distribution] = {}
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = _needed(requirements, frozenset())
    while todo:
        req = todo.pop()
        name = _key(req.name)
        if (name, frozenset(req.extras)) in seen:
            continue
        seen.add((name, frozenset(req.extras)))
        dist = installed.get(name)
        if dist is None:
            raise LookupError(f"{req} is required but not installed here")
        found[name] = dist
        todo += _needed(dist.requires or (), frozenset(req.extras))
    return list(found.values())


def _record_line(arcname: str, data: bytes) -> list[str]:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [arcname, f"sha256={digest}", str(len(data))]


def repack(dist: metadata.Distribution, directory: Path) -> Path:
    """``dist`` as a wheel in ``directory``, built from its installed files."""
    tags = [
        line.split(":", 1)[1].strip()
        for line in (dist.read_text("WHEEL") or "").splitlines()
        if line.startswith("Tag:")
    ]
    name = re.sub(r"[-_.]+", "_", dist.metadata["Name"])
    path = directory / f"{name}-{dist.version}-{tags[0]}.whl"
    info = next(f.parts[0] for f in dist.files or () if f.parts[0].endswith(".dist-info"))
    records: list[list[str]] = []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as whl:
        for file in dist.files or ():
            parts = file.parts
            if parts[0] == ".." or "__pycache__" in parts or file.suffix == ".pyc":
                continue  # scripts (pip writes them again from the entry points), byte-code
            if parts[0] == info and parts[-1] in _INSTALLER_FILES:
                continue
            data = Path(str(dist.locate_file(file))).read_bytes()
            whl.writestr(file.as_posix(), data)
            records.append(_record_line(file.as_posix(), data))
        out = io.StringIO()
        csv.writer(out, lineterminator="\n").writerows([*records, [f"{info}/RECORD", "", ""]])
        whl.writestr(f"{info}/RECORD", out.getvalue())
    return path


def wheelhouse(wheel: Path, directory: Path) -> list[Path]:
    """Wheels, in ``directory``, of every installed distribution ``wheel`` requires."""
    with zipfile.ZipFile(wheel) as whl:
        name = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
        requires = email.message_from_bytes(whl.read(name)).get_all("Requires-Dist") or []
    directory.mkdir(parents=True, exist_ok=True)
    return [repack(dist, directory) for dist in closure(requires)]
