"""Checking a fetched result against ``[result]`` and the final status body.

Guarantee: success is declared only for a result that was fetched and validated
(required fields; content type, size and checksum where the provider gives them). The
body is read by a scan (``providers.result_scan``): ``scan_plan`` says what the check
needs of it, ``check_off_loop`` runs the scans where they cannot stall the service
(``providers.scan_runner``), and ``check_result`` reads the reports. Given no report,
``check_result`` scans an in-memory body itself (a custom adapter's, a test's). Pure
but for that scan; never raises.

JSON Lines (``content_type = "application/jsonl"``): each line is parsed on its own, a
line that is not JSON makes the result invalid (its number is named), and a line is
failed when any ``failed_lines`` test matches it; every line of the separate errors
file (``errors_path``) is failed. A summary pointer into the lines (``/0/id``) reads
that line; other result pointers need the whole document, kept only when it is small.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from reconciler.core.collect import INLINE_RESULT_BYTES, MAX_FAILED_ITEMS
from reconciler.core.provider_calls import CallResult, ResultCheck
from reconciler.providers.exchange import is_json
from reconciler.providers.fields import SourcedPointer
from reconciler.providers.pointer import MISSING
from reconciler.providers.result_scan import (
    Kind,
    LineRule,
    ScanPlan,
    ScanReport,
    inspect_document,
    scan_bytes,
)
from reconciler.providers.scan_runner import scan
from reconciler.providers.spec import JSONL, LineTest, ProviderSpec, ResultSpec

_SHA256_HEX_CHARS = 64
ERRORS_FILE = "the errors file"


def _media_type(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


def is_jsonl(content_type: str | None) -> bool:
    return _media_type(content_type) in (JSONL, "application/x-ndjson", "application/x-jsonlines")


def _of_result(pointers: Iterable[SourcedPointer]) -> tuple[str, ...]:
    return tuple(p.pointer.text for p in pointers if p.source == "result")


def _lines(result: ResultSpec) -> bool:
    return is_jsonl(result.content_type) and result.from_status is None


def line_rule(test: LineTest) -> LineRule:
    expected = (test.equals,) if test.equals is not None else test.in_ or ()
    return LineRule(test.pointer.tokens, test.present, expected)


def _plan(kind: Kind, **what: Any) -> ScanPlan:
    return ScanPlan(kind, inline_bytes=INLINE_RESULT_BYTES, max_items=MAX_FAILED_ITEMS, **what)


def scan_plan(result: ResultSpec, content_type: str | None, *, errors: bool = False) -> ScanPlan:
    """What the check needs of a fetched body (``content_type``: the answer's)."""
    if errors:
        return _plan(Kind.LINES, what=ERRORS_FILE, every_line_failed=True)
    summary = _of_result(p for _, p in result.summary)
    if _lines(result):
        rules = tuple(line_rule(t) for t in result.failed_lines)
        return _plan(Kind.LINES, rules=rules, pointers=summary)
    if content_type is not None and not is_json(content_type):
        return _plan(Kind.BYTES)
    items = result.failed_items
    of_result = items is not None and items.source == "result"
    return _plan(
        Kind.JSON,
        pointers=summary,
        presence=_of_result(result.required),
        items_pointer=items.pointer.text if items is not None and of_result else None,
    )


def _fetch_problems(result: ResultSpec, call: CallResult) -> list[str]:
    if call.refused:
        return [f"not fetched: {call.refused}"]
    if call.transport_error is not None:
        return [f"not fetched: {call.transport_error.value}"]
    if not call.ok:
        return [f"the result fetch answered HTTP {call.http_status}"]
    if call.too_large:
        return [f"the result is larger than {result.max_bytes} bytes"]
    if call.parse_error and call.body_bytes is None and call.body_file is None:
        return [call.parse_error]  # not read at all (a stack of encodings too deep)
    if is_jsonl(result.content_type):
        # The file says what the bytes are: storage hosts serve JSONL under many types.
        return []
    expected = _media_type(result.content_type)
    if expected and result.from_status is None and _media_type(call.content_type) != expected:
        return [f"the result content type is {call.content_type!r}, expected {expected!r}"]
    if call.parse_error:
        return [call.parse_error]
    return []


def _integrity_problems(result: ResultSpec, report: ScanReport, status_body: Any) -> list[str]:
    problems: list[str] = []
    if result.checksum is not None:
        expected = result.checksum.resolve(status_body)
        if not isinstance(expected, str) or len(expected) != _SHA256_HEX_CHARS:
            problems.append(f"no SHA-256 hex checksum at {result.checksum} in the status")
        elif expected.lower() != report.sha256:
            problems.append("the result's SHA-256 does not match the checksum in the status")
    if result.size is not None:
        expected_size = result.size.resolve(status_body)
        if isinstance(expected_size, bool) or not isinstance(expected_size, int):
            problems.append(f"no integer size at {result.size} in the status")
        elif expected_size != report.size:
            problems.append(f"the result has {report.size} bytes, the status says {expected_size}")
    return problems


def _value(pointer: SourcedPointer, report: ScanReport, status_body: Any) -> Any:
    if pointer.source == "status":
        value = pointer.pointer.resolve(status_body)
        return None if value is MISSING else value
    return report.values.get(pointer.pointer.text)


def _summary(result: ResultSpec, report: ScanReport, status_body: Any) -> dict[str, Any]:
    return {name: _value(pointer, report, status_body) for name, pointer in result.summary}


def _lines_check(
    result: ResultSpec,
    report: ScanReport,
    errors: CallResult | None,
    errors_report: ScanReport | None,
    status_body: Any,
) -> ResultCheck:
    problems = list(report.problems)
    total, failed, items = report.lines, report.failed, report.items
    if errors is not None:
        fetched = _fetch_problems(result, errors)
        if fetched or errors_report is None:
            problems.extend(f"errors file: {p}" for p in fetched)
        else:
            problems.extend(f"errors file: {p}" for p in errors_report.problems)
            total, failed = total + errors_report.lines, failed + errors_report.failed
            items = (items + errors_report.items)[:MAX_FAILED_ITEMS]
    problems.extend(_integrity_problems(result, report, status_body))
    summary: dict[str, Any] = {"total_lines": total, "failed_lines": failed}
    summary.update(_summary(result, report, status_body))
    document = report.document if report.kept else None
    return ResultCheck(
        document, tuple(problems), summary, items, report.sha256, report.size, failed_total=failed
    )


def _document_check(
    result: ResultSpec, report: ScanReport, status_body: Any, integrity: bool
) -> ResultCheck:
    problems = list(report.problems)
    if integrity:
        problems.extend(_integrity_problems(result, report, status_body))
    for required in result.required:
        if required.source == "status":
            present = required.pointer.resolve(status_body) not in (MISSING, None)
        else:
            present = required.pointer.text in report.present
        if not present:
            problems.append(f"required field {required} is missing")
    items, total = report.items, report.failed
    pointer = result.failed_items
    if pointer is not None and pointer.source == "status":
        found = pointer.pointer.resolve(status_body)
        if isinstance(found, list):
            items, total = tuple(found[:MAX_FAILED_ITEMS]), len(found)
        elif found not in (MISSING, None):
            problems.append(f"failed items at {pointer} is not a list")
    elif pointer is not None and report.items_not_a_list:
        problems.append(f"failed items at {pointer} is not a list")
    document = report.document if report.kept else None
    return ResultCheck(
        document,
        tuple(problems),
        _summary(result, report, status_body),
        items,
        report.sha256 if integrity else None,
        report.size if integrity else None,
        failed_total=total,
    )


def _from_status(result: ResultSpec, call: CallResult, status_body: Any) -> ResultCheck:
    """The result is a value inside the status body, which is already read and parsed."""
    assert result.from_status is not None
    document = result.from_status.resolve(call.body)
    if document is MISSING:
        return ResultCheck(None, (f"the status has no result at {result.from_status}",))
    plan = scan_plan(result, None)
    report = inspect_document(plan, document, len(call.body_bytes or b""), "")
    return _document_check(result, report, status_body, integrity=False)


def check_result(
    spec: ProviderSpec,
    call: CallResult,
    status_body: Any,
    errors: CallResult | None = None,
    *,
    report: ScanReport | None = None,
    errors_report: ScanReport | None = None,
) -> ResultCheck:
    """Validate a fetched result (``report``: its scan) against ``[result]`` and the status.

    ``errors``: the fetched errors file of a JSONL result (``errors_path``), if any.
    """
    result = spec.result or ResultSpec()
    problems = _fetch_problems(result, call)
    if problems:
        return ResultCheck(None, tuple(problems))
    if result.from_status is not None:
        return _from_status(result, call, status_body)
    if report is None:
        report = scan_bytes(scan_plan(result, call.content_type), call.body_bytes or b"")
    if _lines(result):
        if errors is not None and errors_report is None and errors.ok and not errors.too_large:
            plan = scan_plan(result, errors.content_type, errors=True)
            errors_report = scan_bytes(plan, errors.body_bytes or b"")
        return _lines_check(result, report, errors, errors_report, status_body)
    return _document_check(result, report, status_body, integrity=True)


def _needs_scan(result: ResultSpec, call: CallResult | None) -> bool:
    return call is not None and result.from_status is None and not _fetch_problems(result, call)


async def check_off_loop(
    spec: ProviderSpec, call: CallResult, status_body: Any, errors: CallResult | None = None
) -> ResultCheck:
    """``check_result``, with the bodies scanned off the event loop first."""
    result = spec.result or ResultSpec()
    report = errors_report = None
    if _needs_scan(result, call):
        plan = scan_plan(result, call.content_type)
        report = await scan(plan, call.body_bytes, call.body_file)
    if _lines(result) and errors is not None and _needs_scan(result, errors):
        plan = scan_plan(result, errors.content_type, errors=True)
        errors_report = await scan(plan, errors.body_bytes, errors.body_file)
    return check_result(spec, call, status_body, errors, report=report, errors_report=errors_report)


def release(*calls: CallResult | None) -> None:
    """Close the spooled bodies of these calls (the files go with them)."""
    for call in calls:
        if call is not None and call.body_file is not None:
            call.body_file.close()
