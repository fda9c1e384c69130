"""``reconciler providers list|show``: what a deployment can reach, and from which file.

Guarantee: nothing printed here can hold a secret. A provider is validated before it
is shown (a file with a pasted secret fails to load, naming the key, not the value),
and files hold only the names of the variables that carry credentials.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from reconciler.core.errors import InvalidRequest
from reconciler.providers.loader import (
    ProviderTable,
    preset_file,
    preset_names,
    read_preset,
    validate,
)
from reconciler.providers.toml_text import dumps

UNSET = "-"


def _first_line(text: Any) -> str:
    return text.strip().splitlines()[0] if isinstance(text, str) and text.strip() else ""


def _comment_line(file: Path) -> str:
    """The first line of a preset's opening comment (the API reference it follows)."""
    for line in file.read_text(encoding="utf-8").splitlines():
        if line.startswith("#") and line.lstrip("# ").strip():
            return line.lstrip("# ").strip()
        if line.strip() and not line.startswith("#"):
            break
    return ""


def listing(
    tables: list[ProviderTable], public_url: str, presets_dir: Path | None = None
) -> list[str]:
    """One tab-separated line per configured provider, then per shipped preset:
    name, what it is (``preset NAME`` or ``file``), base_url, first line of its description.
    """
    lines = []
    for table in tables:
        spec = validate(table, public_url)
        what = f"preset {spec.preset}" if spec.preset else "file"
        lines.append("\t".join([spec.name, what, spec.base_url, _first_line(spec.description)]))
    for name in preset_names(presets_dir):
        data = read_preset(name, presets_dir)
        about = _first_line(data.get("description")) or _comment_line(
            preset_file(name, presets_dir)
        )
        base_url = data.get("base_url") if isinstance(data.get("base_url"), str) else UNSET
        lines.append("\t".join([name, "shipped preset", str(base_url), about]))
    return lines


def show(
    name: str,
    tables: list[ProviderTable],
    public_url: str,
    presets_dir: Path | None = None,
) -> str:
    """The provider's table as it is validated (merged over its preset), as TOML."""
    for table in tables:
        if table.name != name:
            continue
        validate(table, public_url)
        origin = f"# {name}: from {table.source}"
        if table.preset is not None:
            origin += (
                f", merged over preset {table.preset} ({preset_file(table.preset, presets_dir)})"
            )
        return origin + "\n" + dumps({"providers": {name: dict(table.merged)}})
    if name in preset_names(presets_dir):
        data: Mapping[str, Any] = read_preset(name, presets_dir)
        head = (
            f"# preset {name} ({preset_file(name, presets_dir)}), not configured here: "
            f'use it with [providers.NAME] preset = "{name}"'
        )
        return head + "\n" + dumps(data)
    configured = ", ".join(t.name for t in tables) or "none"
    presets = ", ".join(preset_names(presets_dir)) or "none"
    raise InvalidRequest(
        f"no provider or preset named {name!r} (configured: {configured}; presets: {presets})"
    )
