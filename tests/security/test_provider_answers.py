"""A provider's answer is untrusted input: results, compressed bodies and the URLs it hands us.

Each attack runs through the real steps on a real database (both backends), the
provider answering over ``httpx.MockTransport``:

* a JSON Lines result of a million lines is counted exactly while the process holds a
  few megabytes of it at most (the body waits in an unnamed file, a child process
  reads it), measured with ``tracemalloc``;
* a compressed body (a status answer, a result) is refused as soon as what it expands
  to passes the limit, and never expanded whole in memory;
* a URL the provider hands us (``result_ref``, a redirect) is fetched only on its own
  origin or a host its file lists, and a listed host must pass the callback SSRF guard
  at the address it resolves to now; a refused URL ends the collection
  ``result_unavailable`` naming why, without a request.
"""

from __future__ import annotations

import copy
import gzip
import json
import tracemalloc
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import httpx
import pytest

from reconciler.core.collect import MAX_FAILED_ITEMS
from reconciler.providers.spool import MEMORY_BYTES
from tests.support.provider_mock import BASE_URL
from tests.support.stack import sim_provider_table
from tests.support.steps import StepRig, step_rig

pytestmark = pytest.mark.anyio

MIB = 1_048_576


class Streamed(httpx.AsyncByteStream):
    """A body that arrives as it would over the network: raw chunks, read once."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = list(chunks)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self._chunks:
            yield chunk


def gzipped(body: bytes, content_type: str = "application/json") -> httpx.Response:
    headers = {"content-type": content_type, "content-encoding": "gzip"}
    return httpx.Response(200, headers=headers, stream=Streamed([gzip.compress(body, 9)]))


def jsonl_table(**result: Any) -> dict[str, Any]:
    table = copy.deepcopy(sim_provider_table(BASE_URL))
    table["result"] = {
        "path": "/v1/jobs/{job_id}/result",
        "content_type": "application/jsonl",
        "failed_lines": [{"pointer": "/error", "present": True}],
        **result,
    }
    return table


def ref_table(**result: Any) -> dict[str, Any]:
    """The sim's table, the result fetched from the URL the status names (no path)."""
    table = copy.deepcopy(sim_provider_table(BASE_URL))
    del table["result"]["path"]
    table["result"].update(result)
    return table


async def finished_job(rig: StepRig, **values: Any) -> tuple[str, str]:
    op_id = rig.submit()
    op = await rig.step(op_id)
    assert op.remote_job_id is not None
    rig.provider.finish(op.remote_job_id, "succeeded", **values)
    return op_id, op.remote_job_id


async def peak_while(rig: StepRig, op_id: str, states: list[str]) -> int:
    """The most memory Python held (above the start) while the operation ran to ``states``."""
    tracemalloc.start()
    try:
        await rig.run(op_id, states)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# --- results as streams -----------------------------------------------------------------


async def test_a_million_line_result_is_counted_exactly_without_holding_it(
    tmp_path: Path, db_url: str
) -> None:
    lines = 1_100_000
    failed = 120
    data = b"{}\n" * (lines - failed) + b'{"error":{"code":"x"}}\n' * failed
    assert len(data) > 3 * MIB
    async with step_rig(tmp_path, db_url, table=jsonl_table()) as rig:
        op_id, _ = await finished_job(rig)
        rig.provider.script("result", httpx.Response(200, content=data))
        peak = await peak_while(rig, op_id, ["completed_with_errors"])
        result = rig.view(op_id)["result"]
    assert result["summary"] == {"total_lines": lines, "failed_lines": failed}
    assert result["size"] == len(data) and "data" not in result
    assert len(result["failed_items"]) == MAX_FAILED_ITEMS
    assert result["failed_items"][0] == {
        "line": lines - failed + 1,
        "item": {"error": {"code": "x"}},
    }
    assert result["failed_items_truncated"] is True
    # Read whole, the body and its million values took over 70 MB here.
    assert peak < 3 * MEMORY_BYTES, f"{peak} bytes held while collecting"


async def test_a_json_document_larger_than_can_be_checked_whole_is_refused_naming_why(
    tmp_path: Path, db_url: str
) -> None:
    document = json.dumps({"rows": ["x" * 1000] * 17_000, "summary": {}}).encode()
    provider = {"result": {"max_bytes": 64 * MIB, "checksum": None, "size": None}}
    async with step_rig(tmp_path, db_url, provider=provider) as rig:
        op_id, _ = await finished_job(rig)
        response = httpx.Response(
            200, content=document, headers={"content-type": "application/json"}
        )
        rig.provider.script("result", response)
        await rig.run(op_id, ["result_validation_failed"])
        problems = rig.view(op_id)["error"]["detail"]["problems"]
    assert any("one document is checked whole" in p and "JSON Lines" in p for p in problems)


# --- compressed bodies ------------------------------------------------------------------


async def test_a_gzip_bomb_status_answer_is_refused_without_expanding_it(
    tmp_path: Path, db_url: str
) -> None:
    bomb = b'{"state": "' + b"x" * (64 * MIB) + b'"}'
    async with step_rig(tmp_path, db_url) as rig:
        op_id = rig.submit()
        await rig.step(op_id)
        rig.provider.script("status", gzipped(bomb))
        rig.advance_to_due(op_id)
        tracemalloc.start()
        try:
            op = await rig.step(op_id)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        view = rig.view(op_id)
    assert op.state == "escalated" and view["escalation"]["reason"] == "contract_violation"
    assert "larger than the limit" in view["escalation"]["message"]
    # Expanded at once (httpx's decoder), the 64 KB of gzip took 64 MB.
    assert peak < 4 * MIB, f"{peak} bytes held for one status read"


async def test_a_gzip_bomb_result_is_refused_once_it_expands_past_max_bytes(
    tmp_path: Path, db_url: str
) -> None:
    async with step_rig(tmp_path, db_url, table=jsonl_table(max_bytes=8 * MIB)) as rig:
        op_id, _ = await finished_job(rig)
        rig.provider.script("result", gzipped(b"{}\n" * (24 * MIB), "application/jsonl"))
        peak = await peak_while(rig, op_id, ["result_validation_failed"])
        problems = rig.view(op_id)["error"]["detail"]["problems"]
    assert problems == [f"the result is larger than {8 * MIB} bytes"]
    assert peak < 3 * MEMORY_BYTES, f"{peak} bytes held for one result fetch"


async def test_a_gzipped_result_within_its_limit_is_decoded_and_checked(
    tmp_path: Path, db_url: str
) -> None:
    body = b'{"id": 1}\n{"id": 2, "error": {"code": "e"}}\n'
    async with step_rig(tmp_path, db_url, table=jsonl_table()) as rig:
        op_id, _ = await finished_job(rig)
        rig.provider.script("result", gzipped(body, "application/jsonl"))
        await rig.run(op_id, ["completed_with_errors"])
        result = rig.view(op_id)["result"]
    assert result["size"] == len(body)
    assert result["summary"] == {"total_lines": 2, "failed_lines": 1}


async def test_a_body_in_an_encoding_not_asked_for_is_not_read(tmp_path: Path, db_url: str) -> None:
    async with step_rig(tmp_path, db_url, table=jsonl_table()) as rig:
        op_id, _ = await finished_job(rig)
        brotli = httpx.Response(
            200, headers={"content-encoding": "br"}, stream=Streamed([b"\x8b\x00\x80"])
        )
        rig.provider.script("result", *[brotli] * 5)
        await rig.run(op_id, ["result_unavailable"])
        [sent, *_] = rig.provider.sent("result")
        error = rig.view(op_id)["error"]
    assert sent.headers["accept-encoding"] == "gzip, deflate"
    assert error["detail"]["detail"]["transport_error"] == "other"


async def test_a_result_too_large_to_hold_with_unstorable_text_in_a_failed_line_is_refused(
    tmp_path: Path, db_url: str
) -> None:
    # Over the in-memory limit the body is scanned from a file, apart from the call: what
    # the scan keeps of it (a failed line) is checked as an answer is.
    data = b"{}\n" * (MEMORY_BYTES // 3 + 1) + b'{"error":{"code":"x\\u0000"}}\n'
    assert len(data) > MEMORY_BYTES
    async with step_rig(tmp_path, db_url, table=jsonl_table()) as rig:
        op_id, _ = await finished_job(rig)
        rig.provider.script("result", httpx.Response(200, content=data))
        await rig.run(op_id, ["escalated"])
        escalation = rig.view(op_id)["escalation"]
        assert rig.row(op_id).result is None
    assert escalation["reason"] == "contract_violation"
    assert "x\\u0000" in escalation["message"]


# --- URLs a provider hands us -----------------------------------------------------------


def unavailable_because(rig: StepRig, op_id: str) -> str:
    error = rig.view(op_id)["error"]
    assert error["code"] == "result_unavailable", error
    refused: str = error["detail"]["detail"]["refused"]
    return refused


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8181/metrics",  # the service's own metrics, another loopback port
        "http://127.0.0.1:8080/v1/operations",  # the service's own API
        "http://169.254.169.254/latest/meta-data/",
        "https://files.example/out.jsonl",
    ],
)
async def test_a_result_url_off_the_providers_origin_and_unlisted_is_never_fetched(
    tmp_path: Path, db_url: str, url: str
) -> None:
    async with step_rig(tmp_path, db_url, table=ref_table()) as rig:
        op_id, _ = await finished_job(rig, extra={"result": {"url": url}})
        await rig.run(op_id, ["result_unavailable"])
        why = unavailable_because(rig, op_id)
        assert rig.provider.sent("result") == []
    assert "neither the provider's origin nor listed in [result] hosts" in why


async def test_a_listed_host_that_resolves_to_a_metadata_address_is_refused(
    tmp_path: Path, db_url: str
) -> None:
    async def rebound(host: str, port: int) -> list[str]:
        return ["169.254.169.254"]

    table = ref_table(hosts=["files.example"])
    async with step_rig(tmp_path, db_url, table=table, resolver=rebound) as rig:
        op_id, job = await finished_job(rig)
        url = f"http://files.example/v1/jobs/{job}/result"
        rig.provider.jobs[job].extra = {"result": {"url": url}}
        await rig.run(op_id, ["result_unavailable"])
        why = unavailable_because(rig, op_id)
        assert rig.provider.sent("result") == []
    assert "files.example resolves to a cloud metadata address" in why


async def test_a_listed_loopback_host_needs_the_allow_list(tmp_path: Path, db_url: str) -> None:
    table = ref_table(hosts=["127.0.0.1"])
    async with step_rig(tmp_path, db_url, table=table, callbacks={"allow_hosts": ()}) as rig:
        op_id, job = await finished_job(rig)
        url = f"http://127.0.0.1:8181/v1/jobs/{job}/result"
        rig.provider.jobs[job].extra = {"result": {"url": url}}
        await rig.run(op_id, ["result_unavailable"])
        why = unavailable_because(rig, op_id)
        assert rig.provider.sent("result") == []
    assert "points to a loopback address" in why


async def test_a_redirect_off_the_providers_origin_is_not_followed(
    tmp_path: Path, db_url: str
) -> None:
    async with step_rig(tmp_path, db_url) as rig:
        op_id, _ = await finished_job(rig)
        away = httpx.Response(302, headers={"location": "http://127.0.0.1:9/internal"})
        rig.provider.script("result", away)
        await rig.run(op_id, ["result_unavailable"])
        why = unavailable_because(rig, op_id)
        assert len(rig.provider.sent("result")) == 1  # the provider's own, answered 302
    assert "127.0.0.1" in why and "[result] hosts" in why


async def test_a_listed_public_host_is_fetched_at_the_checked_address_without_credentials(
    tmp_path: Path, db_url: str
) -> None:
    async def public(host: str, port: int) -> list[str]:
        assert host == "files.example"
        return ["93.184.216.34"]

    hosts: list[str] = []

    async with step_rig(
        tmp_path, db_url, table=ref_table(hosts=["*.example"]), resolver=public
    ) as rig:
        op_id, job = await finished_job(rig)
        status = rig.provider.status_body(rig.provider.jobs[job])["result"]
        url = f"http://files.example/v1/jobs/{job}/result?X-Signature=s3cr3t"
        rig.provider.jobs[job].extra = {"result": {**status, "url": url}}

        def storage(request: httpx.Request) -> httpx.Response:
            hosts.append(request.url.host)
            return rig.provider.usual(request)

        rig.provider.script("result", storage)
        await rig.run(op_id, ["succeeded"])
        [fetch] = rig.provider.sent("result")
        result = rig.view(op_id)["result"]
    assert hosts == ["93.184.216.34"]  # connected to the address the guard passed
    assert fetch.headers["host"] == "files.example"
    assert "authorization" not in fetch.headers  # the credential stays on its origin
    assert result["ref"] == url and result["sha256"] == status["sha256"]


async def test_a_status_answer_with_1500_stacked_encodings_is_a_contract_violation(
    tmp_path: Path, db_url: str
) -> None:
    """Once a ``RecursionError`` a layer deep each (five failed steps, then
    ``internal_error``); now refused at the first answer, its body unread."""
    body = b'{"state": "running"}'
    for _ in range(1500):
        body = gzip.compress(body, 1)
    stacked = httpx.Response(
        200,
        headers={
            "content-type": "application/json",
            "content-encoding": ", ".join(["gzip"] * 1500),
        },
        stream=Streamed([body]),
    )
    async with step_rig(tmp_path, db_url) as rig:
        op_id = rig.submit()
        await rig.step(op_id)
        rig.provider.script("status", stacked)
        rig.advance_to_due(op_id)
        op = await rig.step(op_id)
        view = rig.view(op_id)
    assert op.state == "escalated" and view["escalation"]["reason"] == "contract_violation"
    assert "stacks 1500 encodings; at most 2 are read" in view["escalation"]["message"]
