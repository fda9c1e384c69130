"""Loading provider files: every ``[providers.NAME]`` table, merged over its preset, validated.

Every problem is one ``ConfigError`` line, ``<file>: providers.<name>.<key>: <problem>``,
raised at load time so a bad file stops the service before the first call. The
models of ``providers.spec`` do the checking; ``config_error`` is the one place a
validation failure becomes that line, through ``core.file_values`` (which words the
settings' errors too). Unknown keys are errors (a typo must not pass
silently) and secrets written into a file are refused.

Presets: ``preset = "NAME"`` in a provider table reads ``presets/NAME.toml`` (shipped
with the package; a preset file holds one provider table at top level) and merges
the provider's own keys over it, table by table and key by key; arrays, values and
``request_schema`` replace, and an ``auth`` table of another ``type`` replaces the
preset's whole. The merged table is validated like any other.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from reconciler.core.errors import ConfigError
from reconciler.core.file_values import first_problem
from reconciler.providers.credentials import check_credential
from reconciler.providers.secrets import webhook_secrets
from reconciler.providers.spec import INLINE_SOURCE, ProviderSpec

PRESETS_DIR = Path(__file__).with_name("presets")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
_PRESET_NAME = re.compile(r"[a-z0-9][a-z0-9_]{0,63}")
# A required key's problem when "required" alone would not say what to write.
_MISSING = {
    "token_env": "required (the name of an environment variable)",
    "value_env": "required (the name of an environment variable)",
    "secrets_env": "required (the name of an environment variable)",
    "idempotency": (
        "required: create has no idempotency_header and its path no {idempotency_key}; say "
        '"body" (the key goes into the request through [create.set]) or "none" (the '
        "provider takes no idempotency key)"
    ),
}
_REPLACED = frozenset({"request_schema"})


@dataclass(frozen=True)
class ProviderTable:
    """One provider as written (``own``) and as validated (``merged``, over its preset)."""

    name: str
    source: str
    own: Mapping[str, Any]
    merged: Mapping[str, Any]
    preset: str | None = None


def _written(table: Mapping[str, Any], loc: tuple[int | str, ...]) -> bool:
    node: Any = table
    for part in loc:
        found = (isinstance(part, int) and isinstance(node, list) and part < len(node)) or (
            isinstance(part, str) and isinstance(node, dict) and part in node
        )
        if not found:
            return False
        node = node[part]
    return True


def config_error(exc: ValidationError, table: ProviderTable) -> ConfigError:
    """The first problem of a failed validation as one line naming file, key and problem.

    A pasted secret is reported before anything else wrong in the same table set.
    """
    found = first_problem(exc, _MISSING)
    note = ""
    if table.preset is not None:
        if found.text.startswith("unknown key") and _written(table.own, found.parts):
            note = f"; preset '{table.preset}' has no such key either"
        elif not _written(table.own, found.parts) and _written(table.merged, found.parts):
            note = f" (the value comes from preset '{table.preset}')"
    return found.error(table.source, f"providers.{table.name}", note)


# --- presets -----------------------------------------------------------------------------


def preset_names(presets_dir: Path | None = None) -> list[str]:
    directory = presets_dir or PRESETS_DIR
    return sorted(p.stem for p in directory.glob("*.toml")) if directory.is_dir() else []


def preset_file(name: str, presets_dir: Path | None = None) -> Path:
    return (presets_dir or PRESETS_DIR) / f"{name}.toml"


def read_preset(name: str, presets_dir: Path | None = None) -> dict[str, Any]:
    """A preset's table as written; ``ConfigError`` naming the preset file when unusable."""
    file = preset_file(name, presets_dir)
    data = _read_toml(file)
    if "preset" in data:
        raise ConfigError(f"{file}: preset: a preset cannot name another preset")
    return data


def merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over``'s keys over ``base``'s, table by table; see the module docstring."""
    merged = dict(base)
    for key, value in over.items():
        below = merged.get(key)
        replace = key in _REPLACED or (
            key == "auth"
            and isinstance(below, dict)
            and isinstance(value, dict)
            and value.get("type", below.get("type")) != below.get("type")
        )
        if isinstance(value, dict) and isinstance(below, dict) and not replace:
            merged[key] = merge(below, value)
        else:
            merged[key] = value
    return merged


def provider_table(
    name: str, data: Any, source: str, presets_dir: Path | None = None
) -> ProviderTable:
    """One provider's table merged over its preset (checked to exist), not yet validated."""
    dotted = f"{source}: providers.{name}"
    if not _NAME.fullmatch(name):
        raise ConfigError(f"{dotted}: names use letters, digits, '_', '.', '-'")
    if not isinstance(data, dict):
        raise ConfigError(f"{dotted}: expected a table")
    if "preset" not in data:
        return ProviderTable(name, source, data, data)
    preset = data["preset"]
    known = preset_names(presets_dir)
    listed = ", ".join(known) or "none"
    if not isinstance(preset, str) or not preset:
        raise ConfigError(f"{dotted}.preset: expected the name of a preset (known: {listed})")
    if not _PRESET_NAME.fullmatch(preset) or preset not in known:
        shown = preset if len(preset) <= 64 else preset[:63] + "…"
        raise ConfigError(f"{dotted}.preset: unknown preset {shown!r} (known: {listed})")
    merged = merge(read_preset(preset, presets_dir), data)
    return ProviderTable(name, source, data, merged, preset)


def validate(table: ProviderTable, public_url: str = "") -> ProviderSpec:
    """The spec of a (merged) table; ``ConfigError`` on its first problem."""
    context = {"name": table.name, "source": table.source, "public_url": public_url}
    try:
        return ProviderSpec.model_validate(table.merged, context=context)
    except ValidationError as exc:
        raise config_error(exc, table) from None


def parse_provider(
    name: str,
    data: Any,
    source: str,
    *,
    public_url: str = "",
    presets_dir: Path | None = None,
) -> ProviderSpec:
    """Validate one ``[providers.NAME]`` table; raises ``ConfigError`` on the first problem."""
    return validate(provider_table(name, data, source, presets_dir), public_url)


# --- files -------------------------------------------------------------------------------


def _read_toml(file: Path) -> dict[str, Any]:
    try:
        with file.open("rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: not valid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read: {exc.strerror}") from None


def _file_tables(file: Path) -> Mapping[str, Any]:
    data = _read_toml(file)
    for key in data:
        if key != "providers":
            raise ConfigError(f"{file}: {key}: unknown key; a provider file holds [providers.NAME]")
    tables = data.get("providers")
    if not isinstance(tables, dict) or not tables:
        raise ConfigError(f"{file}: providers: no [providers.NAME] table in the file")
    return tables


def provider_tables(
    directory: Path | None,
    inline: Mapping[str, Any],
    *,
    missing_ok: bool = False,
    presets_dir: Path | None = None,
) -> list[ProviderTable]:
    """Every provider table of ``directory``'s ``*.toml`` files and ``inline``, merged."""
    sources: list[tuple[str, Mapping[str, Any]]] = []
    if directory is not None:
        if directory.is_dir():
            sources.extend((str(f), _file_tables(f)) for f in sorted(directory.glob("*.toml")))
        elif not missing_ok:
            raise ConfigError(f"{directory}: providers directory not found")
    if inline:
        sources.append((INLINE_SOURCE, inline))
    tables: dict[str, ProviderTable] = {}
    for source, found in sources:
        for name, data in found.items():
            if name in tables:
                raise ConfigError(
                    f"{source}: providers.{name}: already defined in {tables[name].source}"
                )
            tables[name] = provider_table(name, data, source, presets_dir)
    return list(tables.values())


def load_providers(
    directory: Path | None,
    inline: Mapping[str, Any],
    environ: Mapping[str, str],
    *,
    missing_ok: bool = False,
    check_secrets: bool = True,
    public_url: str = "",
    presets_dir: Path | None = None,
) -> dict[str, ProviderSpec]:
    """Every ``*.toml`` in ``directory`` plus the inline tables, validated, by name.

    Credentials and webhook secrets must be present in ``environ`` (checked here, so a
    missing variable stops the start), unless ``check_secrets`` is false: a command
    that calls no provider (``reconciler decide``) reads the files for their limits.
    A missing ``directory`` is an error unless ``missing_ok`` (for the default
    directory that nobody created). ``public_url`` is ``server.public_url``, the base
    of ``{webhook_url}``; empty, a provider that uses ``{webhook_url}`` fails to load.
    """
    specs: dict[str, ProviderSpec] = {}
    for table in provider_tables(directory, inline, missing_ok=missing_ok, presets_dir=presets_dir):
        spec = validate(table, public_url)
        if check_secrets:
            check_credential(spec.auth, spec.where, environ)
            webhook_secrets(spec.webhook, spec.where, environ)
        specs[spec.name] = spec
    return specs
