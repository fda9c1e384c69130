"""docs/providers.md documents every key of every provider-file table, with the default
the models hold.

The "Every key" tables are written by hand (their "what" column is prose); this test
reads their key and default columns and compares them with the models the loader
validates with, so a key added, renamed or re-defaulted fails here until the page says
so. A failure prints the rows the page should hold.
"""

from __future__ import annotations

import enum
import json
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from reconciler.providers import spec as s
from reconciler.providers.base import FileTable
from reconciler.providers.rules import AnswerRule, LineTest
from reconciler.providers.state_table import LISTABLE, RULE_KEYS

PAGE = Path(__file__).resolve().parents[2] / "docs" / "providers.md"
HEADING = re.compile(r"^### (.+)$")
ROW = re.compile(r"^\| `([a-z_]+)` \| [^|]+ \| `([^`]*)` \| [^|]+ \|$")
# Keys filled in from other keys (``complete``): the page says ``derived`` and how.
DERIVED = {
    ("create", "idempotency"),
    ("webhook", "event_id"),
    ("webhook", "event_type"),
    ("polling", "webhook_trust"),
}
MODELS: dict[str, tuple[str, type[BaseModel]]] = {
    "`[providers.NAME]`": ("", s.ProviderSpec),
    "`[providers.NAME.auth]`": ("auth", s.AuthSpec),
    "`[providers.NAME.http]`": ("http", s.HttpSpec),
    "`[providers.NAME.create]`": ("create", s.CreateSpec),
    "`[providers.NAME.lookup]`": ("lookup", s.LookupSpec),
    "`[providers.NAME.status]`": ("status", s.StatusSpec),
    "`[providers.NAME.cancel]`": ("cancel", s.CancelSpec),
    "`[providers.NAME.result]`": ("result", s.ResultSpec),
    "`[providers.NAME.webhook]`": ("webhook", s.WebhookSpec),
    "`[providers.NAME.polling]`": ("polling", s.PollingSpec),
    "An answer rule (`duplicate`, `not_found`, `refused`)": ("answer", AnswerRule),
    "A line test (`[result] failed_lines`)": ("line", LineTest),
}
STATES = "`[providers.NAME.states]`"
RULES = "A state rule (`[status] rules`)"


def documented() -> dict[str, dict[str, str]]:
    """The rows of each "Every key" table, by heading: key -> default as written."""
    text = PAGE.read_text(encoding="utf-8")
    tables: dict[str, dict[str, str]] = {}
    heading = None
    for line in text.split("## Every key", 1)[1].splitlines():
        found = HEADING.match(line)
        if found:
            heading = found.group(1)
            continue
        row = ROW.match(line)
        if row and heading is not None:
            rows = tables.setdefault(heading, {})
            assert row.group(1) not in rows, f"{heading}: {row.group(1)} is documented twice"
            rows[row.group(1)] = row.group(2)
    return tables


def default_text(table: str, key: str, field: Any) -> str | None:
    """What the page must say as the default; None: any text (a table's default)."""
    if (table, key) in DERIVED:
        return "derived"
    value = field.default
    if value is PydanticUndefined:
        return "required"
    if value is None:
        return "-"
    if isinstance(value, FileTable):
        return None
    if isinstance(value, tuple):
        return "{}" if key in ("set", "headers", "match", "summary") else "[]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return json.dumps(value.value)
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(value)


def expected(table: str, model: type[BaseModel]) -> dict[str, str | None]:
    return {
        field.alias or name: default_text(table, field.alias or name, field)
        for name, field in model.model_fields.items()
        if name not in FileTable.NOT_IN_FILE
    }


def _rows(want: dict[str, str | None], keys: list[str]) -> str:
    return "\n".join(f"| `{k}` | ... | `{want[k] or '...'}` | ... |" for k in keys)


def test_the_page_is_read() -> None:
    # A misread page would hold no rows and every comparison below would pass.
    tables = documented()
    assert set(MODELS) | {STATES, RULES} <= set(tables), sorted(tables)
    assert sum(len(rows) for rows in tables.values()) >= 120


def test_every_key_of_every_table_is_documented_and_nothing_else() -> None:
    tables = documented()
    for heading, (table, model) in MODELS.items():
        want, have = expected(table, model), tables[heading]
        missing = [k for k in want if k not in have]
        assert not missing, f"{heading} lacks:\n" + _rows(want, missing)
        assert not set(have) - set(want), f"{heading}: not keys: {sorted(set(have) - set(want))}"


def test_every_default_is_the_models() -> None:
    tables = documented()
    for heading, (table, model) in MODELS.items():
        want, have = expected(table, model), tables[heading]
        wrong = [k for k, d in want.items() if d is not None and have.get(k, d) != d]
        assert not wrong, f"{heading} should say:\n" + _rows(want, wrong)


def test_the_states_and_the_state_rules_are_documented() -> None:
    tables = documented()
    assert set(tables[STATES]) == {c.value for c in LISTABLE}
    assert tables[STATES]["success"] == "required"
    assert list(tables[RULES]) == list(RULE_KEYS)
