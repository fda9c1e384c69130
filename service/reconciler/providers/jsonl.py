"""Line-delimited JSON results (``[result] content_type = "application/jsonl"``). Pure.

OpenAI's batch output and error files and Anthropic's ``results_url`` hold one JSON
value per line. The whole file is bounded before it gets here (``max_bytes``); each
line is parsed on its own, and a line that is not JSON makes the result invalid (its
number is named), never a guess. A line is failed when any ``failed_lines`` test
matches it; every line of the separate errors file (``errors_path``) is failed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from reconciler.core.errors import InvalidRequest
from reconciler.core.strict_json import parse_json
from reconciler.providers.spec import LineTest

JSONL = "application/jsonl"
JSONL_TYPES = frozenset({JSONL, "application/x-ndjson", "application/x-jsonlines"})
MAX_PROBLEMS = 5


@dataclass(frozen=True)
class Lines:
    """A parsed JSONL file: its values in order, and the problems (malformed lines)."""

    values: tuple[Any, ...]
    problems: tuple[str, ...] = ()


def is_jsonl(content_type: str | None) -> bool:
    return (content_type or "").split(";", 1)[0].strip().lower() in JSONL_TYPES


def parse_lines(data: bytes, what: str = "the result") -> Lines:
    """Every non-blank line as a JSON value; a malformed one is a named problem."""
    values: list[Any] = []
    problems: list[str] = []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            values.append(parse_json(raw, f"line {number} of {what}"))
        except InvalidRequest as exc:
            if len(problems) < MAX_PROBLEMS:
                problems.append(exc.message)
    return Lines(tuple(values), tuple(problems))


def line_failed(value: Any, tests: Sequence[LineTest]) -> bool:
    """A line is failed when ANY test matches it."""
    return any(test.matches(value) for test in tests)


@dataclass(frozen=True)
class LineCounts:
    total: int
    failed: int
    failed_items: tuple[dict[str, Any], ...]


def count_lines(
    result_lines: Sequence[Any], error_lines: Sequence[Any], tests: Sequence[LineTest]
) -> LineCounts:
    """Totals over the result and the errors file; each failed line kept as a reference
    (``{"line": n, "item": value}``, or ``"errors_line"`` for the errors file)."""
    failed: list[dict[str, Any]] = [
        {"line": n, "item": v} for n, v in enumerate(result_lines, start=1) if line_failed(v, tests)
    ]
    failed.extend({"errors_line": n, "item": v} for n, v in enumerate(error_lines, start=1))
    return LineCounts(len(result_lines) + len(error_lines), len(failed), tuple(failed))
