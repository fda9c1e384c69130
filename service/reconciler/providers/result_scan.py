"""Reading a fetched result a chunk at a time: digest, size, lines, and what the check needs.

A result file may be hundreds of megabytes of JSON Lines (an OpenAI batch output of
millions of lines). The scan reads it in ``CHUNK_BYTES`` pieces and keeps only what the
check asks for (``ScanPlan``): the SHA-256 and size; for JSON Lines the counts, the
first ``max_items`` failed lines, the first problems and the values of the summary's
line pointers; for a JSON document the values and presence of the pointers the provider
file names. The document itself is kept only when the whole file is at most
``inline_bytes``: memory does not grow with the file.

A JSON document (not lines) is parsed whole, because its pointers may lead anywhere in
it; it is bounded instead (``MAX_JSON_BYTES``), and a larger one is a named problem. A
line longer than ``MAX_LINE_BYTES`` is a problem naming it, and not held.

Pure: bytes in, a ``ScanReport`` out. ``providers.scan_runner`` runs a scan off the event
loop, a large one in a child process (``main`` below is that process), so the values
cross as JSON; plans and reports say how.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from reconciler.core.errors import InvalidRequest
from reconciler.core.strict_json import MAX_JSON_DEPTH, parse_json, scan_value
from reconciler.providers.pointer import MISSING, Pointer, resolve_tokens
from reconciler.providers.state_table import Scalar

CHUNK_BYTES = 262_144
MAX_LINE_BYTES = 16 * 1_048_576
MAX_JSON_BYTES = 16 * 1_048_576
MAX_PROBLEMS = 5
_BLANK = " \t\r\n\x0b\x0c"  # what bytes.strip() removed: a line of only these is skipped


class Kind(StrEnum):
    LINES = "lines"  # JSON Lines: one value a line
    JSON = "json"  # one JSON document
    BYTES = "bytes"  # not parsed: digest and size only


@dataclass(frozen=True)
class LineRule:
    """One ``failed_lines`` test as plain values (``providers.rules.LineTest``).

    Equality is ``json_equal``'s (``1`` equals ``1.0``, never ``true``), read from sets
    made once: a rule runs on every line of a file of millions.
    """

    tokens: tuple[str, ...]
    present: bool | None = None
    expected: tuple[Scalar, ...] = ()
    _flags: frozenset[bool] = field(init=False, repr=False, compare=False)
    _numbers: frozenset[int | float] = field(init=False, repr=False, compare=False)
    _texts: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        flags = frozenset(e for e in self.expected if isinstance(e, bool))
        numbers = frozenset(
            e for e in self.expected if isinstance(e, int | float) and not isinstance(e, bool)
        )
        texts = frozenset(e for e in self.expected if isinstance(e, str))
        object.__setattr__(self, "_flags", flags)
        object.__setattr__(self, "_numbers", numbers)
        object.__setattr__(self, "_texts", texts)

    def matches(self, line: Any) -> bool:
        value = resolve_tokens(line, self.tokens)
        if self.present is not None:
            return (value is not MISSING and value is not None) is self.present
        if isinstance(value, bool):
            return value in self._flags
        if isinstance(value, int | float):
            return value in self._numbers
        return isinstance(value, str) and value in self._texts


@dataclass(frozen=True)
class ScanPlan:
    """What to keep of a result while reading it."""

    kind: Kind
    what: str = "the result"
    rules: tuple[LineRule, ...] = ()
    every_line_failed: bool = False  # an errors file: each of its lines is a failed item
    pointers: tuple[str, ...] = ()  # result pointers whose values the check reads
    presence: tuple[str, ...] = ()  # result pointers whose presence the check reads
    items_pointer: str | None = None  # JSON: the list of failed items
    inline_bytes: int = 65_536
    max_items: int = 50

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "what": self.what,
            "rules": [[list(r.tokens), r.present, list(r.expected)] for r in self.rules],
            "every_line_failed": self.every_line_failed,
            "pointers": list(self.pointers),
            "presence": list(self.presence),
            "items_pointer": self.items_pointer,
            "inline_bytes": self.inline_bytes,
            "max_items": self.max_items,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ScanPlan:
        rules = tuple(LineRule(tuple(t), p, tuple(e)) for t, p, e in data["rules"])
        return cls(
            Kind(data["kind"]),
            data["what"],
            rules,
            data["every_line_failed"],
            tuple(data["pointers"]),
            tuple(data["presence"]),
            data["items_pointer"],
            data["inline_bytes"],
            data["max_items"],
        )


@dataclass(frozen=True)
class ScanReport:
    """What the check reads of a result; ``values`` holds only pointers that lead somewhere."""

    size: int
    sha256: str
    problems: tuple[str, ...] = ()
    kept: bool = False  # ``document`` is the whole result
    document: Any = None
    values: dict[str, Any] = field(default_factory=dict)
    present: tuple[str, ...] = ()
    lines: int = 0  # JSON Lines: values read (blank and malformed lines not counted)
    failed: int = 0  # failed lines, or the length of the failed items list
    items: tuple[Any, ...] = ()  # the first max_items failed items
    items_not_a_list: bool = False  # JSON: the failed items pointer leads to something else

    def to_json(self) -> dict[str, Any]:
        return {
            "size": self.size,
            "sha256": self.sha256,
            "problems": list(self.problems),
            "kept": self.kept,
            "document": self.document,
            "values": self.values,
            "present": list(self.present),
            "lines": self.lines,
            "failed": self.failed,
            "items": list(self.items),
            "items_not_a_list": self.items_not_a_list,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ScanReport:
        return cls(
            data["size"],
            data["sha256"],
            tuple(data["problems"]),
            data["kept"],
            data["document"],
            dict(data["values"]),
            tuple(data["present"]),
            data["lines"],
            data["failed"],
            tuple(data["items"]),
            data["items_not_a_list"],
        )


def _tokens(text: str) -> tuple[str, ...]:
    return Pointer.parse(text).tokens


def _resolved(plan: ScanPlan, document: Any) -> tuple[dict[str, Any], tuple[str, ...]]:
    values = {}
    for text in plan.pointers:
        value = resolve_tokens(document, _tokens(text))
        if value is not MISSING:
            values[text] = value
    present = tuple(
        t for t in plan.presence if resolve_tokens(document, _tokens(t)) not in (MISSING, None)
    )
    return values, present


def inspect_document(plan: ScanPlan, document: Any, size: int, sha256: str) -> ScanReport:
    """The report on a parsed JSON document (a fetched one, or one inside the status)."""
    values, present = _resolved(plan, document)
    items: tuple[Any, ...] = ()
    failed = 0
    items_not_a_list = False
    if plan.items_pointer is not None:
        found = resolve_tokens(document, _tokens(plan.items_pointer))
        if isinstance(found, list):
            items, failed = tuple(found[: plan.max_items]), len(found)
        else:
            items_not_a_list = found is not MISSING and found is not None
    kept = size <= plan.inline_bytes
    return ScanReport(
        size,
        sha256,
        (),
        kept,
        document if kept else None,
        values,
        present,
        failed=failed,
        items=items,
        items_not_a_list=items_not_a_list,
    )


class Scanner:
    """Feed the body in order (``feed``), then ``finish`` for the report."""

    def __init__(self, plan: ScanPlan) -> None:
        self.plan = plan
        self._digest = hashlib.sha256()
        self._size = 0
        self._json = bytearray()  # Kind.JSON: the document, while within MAX_JSON_BYTES
        self._lines = _Lines(plan) if plan.kind is Kind.LINES else None

    def feed(self, chunk: bytes) -> None:
        self._digest.update(chunk)
        self._size += len(chunk)
        if self._lines is not None:
            self._lines.feed(chunk, self._size)
        elif self.plan.kind is Kind.JSON and self._size <= MAX_JSON_BYTES:
            self._json.extend(chunk)

    def finish(self) -> ScanReport:
        digest = self._digest.hexdigest()
        if self._lines is not None:
            return self._lines.finish(self._size, digest)
        if self.plan.kind is Kind.BYTES or self._size == 0:
            return ScanReport(self._size, digest, kept=self._size <= self.plan.inline_bytes)
        if self._size > MAX_JSON_BYTES:
            problem = (
                f"{self.plan.what} is a JSON document of {self._size} bytes; one document is "
                f"checked whole, up to {MAX_JSON_BYTES} bytes (a larger result must be JSON "
                'Lines: content_type = "application/jsonl")'
            )
            return ScanReport(self._size, digest, (problem,))
        try:
            document = parse_json(bytes(self._json), "the response body")
        except InvalidRequest as exc:
            return ScanReport(self._size, digest, (exc.message,))
        finally:
            self._json = bytearray()
        return inspect_document(self.plan, document, self._size, digest)


class _Lines:
    """JSON Lines, a line at a time; a line that is not JSON is a problem naming it."""

    def __init__(self, plan: ScanPlan) -> None:
        self.plan = plan
        self.tail = bytearray()
        self.overlong = False  # the line in ``tail`` passed MAX_LINE_BYTES: not held
        self.number = 0  # lines seen, blank ones too (for messages)
        self.count = 0  # values read
        self.failed = 0
        self.items: list[Any] = []
        self.problems: list[str] = []
        self.values: list[Any] | None = []  # the document, while it may still be kept
        self.found: dict[str, Any] = {}
        # Pointers into one line ("/3/id": the fourth value), read as that line passes.
        self.by_line: dict[int, list[tuple[str, tuple[str, ...]]]] = {}
        for text in plan.pointers:
            tokens = _tokens(text)
            if tokens and tokens[0].isdigit() and (tokens[0] == "0" or tokens[0][0] != "0"):
                self.by_line.setdefault(int(tokens[0]), []).append((text, tokens[1:]))

    def feed(self, chunk: bytes, size: int) -> None:
        if self.values is not None and size > self.plan.inline_bytes:
            self.values = None
        cut = chunk.rfind(b"\n")
        if cut < 0:
            self._hold(chunk)
            return
        first = chunk.find(b"\n")
        if self.overlong:
            self._line_too_long()
            block = chunk[first + 1 : cut]
            if first == cut:
                self._hold(chunk[cut + 1 :])
                return
        elif self.tail:
            self.tail += chunk[:cut]
            block = bytes(self.tail)
            self.tail = bytearray()
        else:
            block = chunk[:cut]
        self._block(block)
        self._hold(chunk[cut + 1 :])

    def _hold(self, rest: bytes) -> None:
        if self.overlong:
            return
        if len(self.tail) + len(rest) > MAX_LINE_BYTES:
            self.overlong, self.tail = True, bytearray()
            return
        self.tail += rest

    def _line_too_long(self) -> None:
        self.number += 1
        self.overlong = False
        what = self.plan.what
        self._problem(f"line {self.number} of {what} is longer than {MAX_LINE_BYTES} bytes")

    def _problem(self, text: str) -> None:
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(text)

    def _block(self, block: bytes) -> None:
        """Whole lines (no newline at the end): a fast path, and the exact reader for the
        lines it does not take (whitespace around a value, bad UTF-8, malformed JSON)."""
        if len(block) > MAX_LINE_BYTES:  # rare: chunks are far smaller than the limit
            for raw in block.split(b"\n"):
                if len(raw) > MAX_LINE_BYTES:
                    self._line_too_long()
                else:
                    self._block(raw)
            return
        try:
            lines = block.decode("utf-8").split("\n")
        except UnicodeDecodeError:
            for raw in block.split(b"\n"):
                self.number += 1
                self._slow(raw)
            return
        scan = scan_value
        for line in lines:
            self.number += 1
            if not line:
                continue
            try:
                if line.count("[") + line.count("{") > MAX_JSON_DEPTH:
                    raise ValueError("maybe too deep: the exact reader decides")
                value, end = scan(line, 0)
                if end != len(line) and line[end:].strip(" \t\r\n"):
                    raise ValueError("more after the value")
            except (StopIteration, ValueError, RecursionError):
                self._slow(line.encode("utf-8", "surrogatepass"))
                continue
            self._value(value)

    def _slow(self, raw: bytes) -> None:
        if not raw.strip(_BLANK.encode()):
            return
        try:
            value = parse_json(raw, f"line {self.number} of {self.plan.what}")
        except InvalidRequest as exc:
            self._problem(exc.message)
            return
        self._value(value)

    def _value(self, value: Any) -> None:
        plan = self.plan
        index = self.count
        self.count += 1
        failed = plan.every_line_failed
        for rule in plan.rules:
            if failed:
                break
            failed = rule.matches(value)
        if failed:
            self.failed += 1
            if len(self.items) < plan.max_items:
                key = "errors_line" if plan.every_line_failed else "line"
                self.items.append({key: index + 1, "item": value})
        if self.values is not None:
            self.values.append(value)
        wanted = self.by_line.get(index)
        if wanted:
            for text, rest in wanted:
                found = resolve_tokens(value, rest)
                if found is not MISSING:
                    self.found[text] = found

    def finish(self, size: int, digest: str) -> ScanReport:
        if self.overlong:
            self._line_too_long()
        elif self.tail:
            self.number += 1
            self._slow(bytes(self.tail))
            self.tail = bytearray()
        kept = self.values is not None and size <= self.plan.inline_bytes
        found = self.found
        if kept:
            found, _ = _resolved(self.plan, self.values)
        return ScanReport(
            size,
            digest,
            tuple(self.problems),
            kept,
            self.values if kept else None,
            found,
            lines=self.count,
            failed=self.failed,
            items=tuple(self.items),
        )


def scan_bytes(plan: ScanPlan, data: bytes) -> ScanReport:
    scanner = Scanner(plan)
    for start in range(0, len(data), CHUNK_BYTES):
        scanner.feed(data[start : start + CHUNK_BYTES])
    return scanner.finish()


def scan_descriptor(plan: ScanPlan, fd: int) -> ScanReport:
    """Scan an open file from its start (``pread``: its offset is left alone)."""
    scanner = Scanner(plan)
    offset = 0
    while chunk := os.pread(fd, CHUNK_BYTES, offset):
        scanner.feed(chunk)
        offset += len(chunk)
    return scanner.finish()


def main() -> None:
    """The child process: the plan on stdin, the file as descriptor ``argv[1]``, the report
    on stdout as JSON (ASCII, so a lone surrogate in a value crosses intact)."""
    plan = ScanPlan.from_json(json.loads(sys.stdin.buffer.read()))
    report = scan_descriptor(plan, int(sys.argv[1]))
    sys.stdout.write(json.dumps(report.to_json(), ensure_ascii=True, allow_nan=False))


if __name__ == "__main__":
    main()
