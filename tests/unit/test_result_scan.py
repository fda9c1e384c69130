"""The result scan and the bounded decoder: pure, so their answers are checked by property.

However a body is cut into chunks, the scan reports what reading it whole, one line at a
time, reports (the reference below is the reader the service had before it streamed).
However a compressed body is cut, the decoder gives back the bytes, and refuses them
exactly when they are larger than the limit.
"""

from __future__ import annotations

import asyncio
import gzip
import itertools
import json
import zlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.core.errors import InvalidRequest
from reconciler.core.strict_json import parse_json
from reconciler.providers import result_scan
from reconciler.providers.decoding import BoundedDecoder, read_bounded
from reconciler.providers.result_scan import Kind, LineRule, ScanPlan, ScanReport, scan_bytes
from reconciler.providers.state_table import json_equal

RULES = (LineRule(("error",), present=True), LineRule(("code",), expected=(400, "bad", True)))
PLAN = ScanPlan(Kind.LINES, rules=RULES, pointers=("/0", "/1/code", "/x"), max_items=3)

LINES = st.one_of(
    st.sampled_from(
        [
            b"{}",
            b'{"error": {"c": 1}}',
            b'{"error": null}',
            b'{"code": 400}',
            b'{"code": 400.0}',
            b'{"code": true}',
            b'{"code": 1}',
            b'  {"code": "bad"}  ',
            b'{"code": "bad"}\r',
            b"[1, 2, 3]",
            b"",
            b"   ",
            b"\t",
            b"{oops",
            b'{"a": 1} {"b": 2}',
            b"\xff\xfe",
            b'"\\ud800"',
            b"[" * 70 + b"]" * 70,
            b"NaN",
        ]
    ),
    st.dictionaries(st.text(max_size=3), st.integers(-5, 5), max_size=3).map(
        lambda d: json.dumps(d).encode()
    ),
)


def reference(data: bytes, plan: ScanPlan) -> tuple[int, int, list[Any], list[str], list[Any]]:
    """The reader before streaming: split, parse each non-blank line, test it."""
    values: list[Any] = []
    problems: list[str] = []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            values.append(parse_json(raw, f"line {number} of {plan.what}"))
        except InvalidRequest as exc:
            if len(problems) < result_scan.MAX_PROBLEMS:
                problems.append(exc.message)
    failed = [
        {"line": n, "item": v}
        for n, v in enumerate(values, start=1)
        if any(rule.matches(v) for rule in plan.rules)
    ]
    return len(values), len(failed), failed[: plan.max_items], problems, values


def chunked(data: bytes, cuts: list[int]) -> ScanReport:
    scanner = result_scan.Scanner(PLAN)
    start = 0
    for cut in sorted({c % (len(data) + 1) for c in cuts}):
        scanner.feed(data[start:cut])
        start = cut
    scanner.feed(data[start:])
    return scanner.finish()


@settings(max_examples=150, deadline=None)
@given(
    lines=st.lists(LINES, max_size=25), newline=st.booleans(), cuts=st.lists(st.integers(0, 4000))
)
def test_a_chunked_scan_reports_what_a_whole_line_by_line_read_does(
    lines: list[bytes], newline: bool, cuts: list[int]
) -> None:
    data = b"\n".join(lines) + (b"\n" if newline else b"")
    count, failed, items, problems, values = reference(data, PLAN)
    report = chunked(data, cuts)
    assert (report.lines, report.failed, list(report.items)) == (count, failed, items)
    assert list(report.problems) == problems
    assert report.size == len(data) and report.kept and report.document == values
    expected = {p: v for p in PLAN.pointers if (v := _resolve(values, p)) is not _ABSENT}
    assert report.values == expected


_ABSENT = object()


def _resolve(values: list[Any], pointer: str) -> Any:
    from reconciler.providers.pointer import MISSING, resolve

    found = resolve(values, pointer)
    return _ABSENT if found is MISSING else found


def test_past_the_inline_size_the_document_goes_and_line_pointers_stay() -> None:
    data = b'{"id": "first"}\n{"id": "second", "code": 400}\n' + b"{}\n" * 30_000
    report = scan_bytes(PLAN, data)
    assert not report.kept and report.document is None
    assert report.values == {"/0": {"id": "first"}, "/1/code": 400}
    assert report.lines == 30_002 and report.failed == 1


def test_a_line_longer_than_the_limit_is_a_problem_and_is_not_held(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(result_scan, "MAX_LINE_BYTES", 64)
    data = b'{"a": 1}\n' + b'{"pad": "' + b"x" * 500 + b'"}\n{"b": 2}\n'
    for size in (7, 64, 1000):
        scanner = result_scan.Scanner(ScanPlan(Kind.LINES))
        for start in range(0, len(data), size):
            scanner.feed(data[start : start + size])
        report = scanner.finish()
        assert report.lines == 2 and report.document == [{"a": 1}, {"b": 2}]
        assert report.problems == ("line 2 of the result is longer than 64 bytes",)


def test_a_json_document_past_its_bound_is_a_problem_naming_json_lines(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(result_scan, "MAX_JSON_BYTES", 100)
    plan = ScanPlan(Kind.JSON, presence=("/rows",))
    fits = scan_bytes(plan, b'{"rows": [1]}')
    assert fits.present == ("/rows",) and fits.kept and fits.document == {"rows": [1]}
    [problem] = scan_bytes(plan, json.dumps({"rows": list(range(100))}).encode()).problems
    assert "checked whole, up to 100 bytes" in problem and "JSON Lines" in problem


def test_a_plan_and_a_report_cross_a_process_boundary_unchanged() -> None:
    report = scan_bytes(PLAN, b'{"error": "\\ud800"}\n{"code": 400}\n')
    crossed = ScanReport.from_json(json.loads(json.dumps(report.to_json(), ensure_ascii=True)))
    assert crossed == report
    assert ScanPlan.from_json(json.loads(json.dumps(PLAN.to_json()))) == PLAN


SCALARS = st.one_of(
    st.booleans(), st.integers(-3, 3), st.sampled_from([0.0, 1.0, 2.5]), st.text(max_size=2)
)


@given(
    value=st.one_of(SCALARS, st.none(), st.lists(SCALARS, max_size=2)),
    expected=st.lists(SCALARS, max_size=4),
)
def test_a_line_rule_compares_as_json_equal_does(value: Any, expected: list[Any]) -> None:
    rule = LineRule(("v",), expected=tuple(expected))
    assert rule.matches({"v": value}) is any(json_equal(value, e) for e in expected)


# --- the bounded decoder -------------------------------------------------------------------


class Raw(httpx.AsyncByteStream):
    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self._chunks:
            yield chunk


class Sink:
    def __init__(self) -> None:
        self.data = bytearray()
        self.largest = 0

    def write(self, piece: bytes) -> None:
        self.largest = max(self.largest, len(piece))
        self.data += piece


def read(encoding: str, raw: bytes, cuts: list[int], limit: int) -> tuple[bytes, bool, int]:
    edges = sorted({c % (len(raw) + 1) for c in cuts} | {0, len(raw)})
    chunks = [raw[a:b] for a, b in itertools.pairwise(edges)]
    response = httpx.Response(200, headers={"content-encoding": encoding}, stream=Raw(chunks))
    sink = Sink()
    _, too_large = asyncio.run(read_bounded(response, limit, sink))
    return bytes(sink.data), too_large, sink.largest


ENCODERS = {
    "gzip": lambda b: gzip.compress(b),
    "deflate": zlib.compress,
    "identity": lambda b: b,
    "gzip, gzip": lambda b: gzip.compress(gzip.compress(b)),
}


@settings(max_examples=100, deadline=None)
@given(
    body=st.binary(max_size=3000) | st.integers(0, 300_000).map(lambda n: b"a" * n),
    encoding=st.sampled_from(sorted(ENCODERS)),
    cuts=st.lists(st.integers(0, 10_000), max_size=6),
    limit=st.integers(0, 200_000),
)
def test_a_body_decodes_whole_or_is_refused_past_its_limit(
    body: bytes, encoding: str, cuts: list[int], limit: int
) -> None:
    data, too_large, largest = read(encoding, ENCODERS[encoding](body), cuts, limit)
    assert too_large is (len(body) > limit)
    assert data == (body if not too_large else body[: len(data)])
    assert len(data) <= limit and largest <= 65_536


def test_raw_deflate_is_read_as_httpx_reads_it() -> None:
    squeeze = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    raw = squeeze.compress(b"hello " * 100) + squeeze.flush()
    assert read("deflate", raw, [3], 10_000)[0] == b"hello " * 100


@pytest.mark.parametrize("encoding", ["br", "zstd", "compress"])
def test_an_encoding_not_asked_for_is_refused(encoding: str) -> None:
    with pytest.raises(httpx.DecodingError, match="not asked for"):
        BoundedDecoder(encoding)


def test_a_body_that_does_not_decompress_is_a_decoding_error() -> None:
    with pytest.raises(httpx.DecodingError, match="does not decompress"):
        read("gzip", b"\x1f\x8b\x08\x00garbage-garbage", [], 1000)
