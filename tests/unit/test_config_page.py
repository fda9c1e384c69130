"""docs/configuration.md documents every setting with the default and the bound the models hold.

The tables are written by hand (their "what" column is prose); this test reads
their key, default and bound columns and compares them with the settings' models,
so a setting added, renamed, re-defaulted or re-bounded fails here until the page
says so. A failure prints the rows the page should hold.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from reconciler.config import Settings, sections, setting_keys
from reconciler.core.file_values import bound_of

PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
ROW = re.compile(r"^\| `([a-z_.]+)` \| `([^`]*)` \| ([^|]+) \|")


def as_toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, tuple):
        return json.dumps(list(value))
    return json.dumps(value)


def expected() -> dict[str, tuple[str, str | None]]:
    """Each setting's key, with its default as TOML and its bound if it is a number."""
    defaults = Settings()
    rows = {}
    for key, field in setting_keys():
        value: Any = defaults
        for part in key:
            value = getattr(value, part)
        bound = bound_of(field.metadata)
        rows[".".join(key)] = (as_toml(value), None if bound is None else str(bound))
    return rows


def documented() -> dict[str, tuple[str, str]]:
    rows = {}
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        match = ROW.match(line)
        if match:
            key, default, bound = match.groups()
            assert key not in rows, f"{key} is documented twice"
            rows[key] = (default, bound.strip())
    return rows


def _row(key: str, default: str, bound: str | None) -> str:
    return f"| `{key}` | `{default}` | `{bound}` | ... |" if bound else f"| `{key}` | `{default}` |"


def test_the_page_is_read() -> None:
    # A misread page would hold no rows and every comparison below would pass.
    assert len(documented()) >= 40


def test_every_setting_is_documented_and_nothing_else() -> None:
    want, have = expected(), documented()
    missing = [_row(key, *want[key]) for key in want if key not in have]
    assert not missing, "docs/configuration.md lacks:\n" + "\n".join(missing)
    assert not set(have) - set(want), f"not settings: {sorted(set(have) - set(want))}"


def test_every_default_is_the_models() -> None:
    want, have = expected(), documented()
    wrong = [_row(k, *want[k]) for k in want if k in have and have[k][0] != want[k][0]]
    assert not wrong, "docs/configuration.md should say:\n" + "\n".join(wrong)


def test_every_bound_is_the_models() -> None:
    want, have = expected(), documented()
    wrong = [
        _row(key, default, bound)
        for key, (default, bound) in want.items()
        if bound is not None and key in have and not have[key][1].startswith(f"`{bound}`")
    ]
    assert not wrong, "docs/configuration.md should say:\n" + "\n".join(wrong)
    assert all(bound for _, bound in have.values()), "every setting says what it may be"


def test_every_section_has_its_heading() -> None:
    text = PAGE.read_text(encoding="utf-8")
    missing = [name for name in sections() if f"### `[{name}]`" not in text]
    assert not missing, f"docs/configuration.md has no heading for {missing}"
