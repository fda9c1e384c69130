"""A lookup over a paged list cannot loop, and one that cannot read the list to its end
settles nothing, whatever the provider's pages say.

The provider takes no idempotency key and its lookup searches a list of jobs page by
page (the ``openai_batch`` shape). The create's answer is lost, so only the lookup can
tell whether a job was made. Whatever the pages do (a cursor that comes back, a list
that never ends, one that says it has more but gives no cursor, a later page refused
or missing, a page too large or a gzip bomb), the lookup is never taken for "not made":
the create is never sent again, and at the end of the create window the operation
escalates ``create_unknown`` for a person (docs/design.md#create_unknown). A lookup
stops at the first cursor it has seen before.
"""

from __future__ import annotations

import copy
import functools
import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import httpx
import pytest

from tests.security.test_provider_answers import Streamed
from tests.support.provider_mock import BASE_URL, answer, error
from tests.support.stack import sim_provider_table
from tests.support.steps import step_rig

pytestmark = pytest.mark.anyio

PAGES = 5


def keyless_list_lookup() -> dict[str, Any]:
    table = copy.deepcopy(sim_provider_table(BASE_URL))
    create = table["create"]
    del create["idempotency_header"]
    create["idempotency"] = "none"
    create["set"] = {"/metadata/reconciler_key": "{idempotency_key}"}
    create["create_deadline_seconds"] = 8
    table["lookup"] = {
        "path": "/v1/jobs?limit=100",
        "items": "/data",
        "match": {"/metadata/reconciler_key": "{idempotency_key}"},
        "job_id": "/id",
        "pages": PAGES,
        "next": "/last_id",
        "next_param": "after",
        "has_more": "/has_more",
    }
    return table


def page(last_id: str | None, *, more: bool = True, items: int = 1) -> httpx.Response:
    data = [{"id": f"b{i}", "metadata": {"reconciler_key": "someone else"}} for i in range(items)]
    body: dict[str, Any] = {"data": data, "has_more": more}
    if last_id is not None:
        body["last_id"] = last_id
    return answer(200, body)


def after(request: httpx.Request) -> str | None:
    return parse_qs(request.url.query.decode()).get("after", [None])[0]


def cursor_repeats(request: httpx.Request) -> httpx.Response:
    return page("b1")


def cursor_cycles(request: httpx.Request) -> httpx.Response:
    return page("b2" if after(request) == "b1" else "b1")


def endless(request: httpx.Request) -> httpx.Response:
    return page(f"c{int((after(request) or 'c0')[1:]) + 1}")


def more_without_cursor(request: httpx.Request) -> httpx.Response:
    return page(None)


def later_page(status: int) -> Callable[[httpx.Request], httpx.Response]:
    def answered(request: httpx.Request) -> httpx.Response:
        return page("b1") if after(request) is None else error(status)

    return answered


def too_many_items(request: httpx.Request) -> httpx.Response:
    return page("b1", items=20_000)


@functools.cache
def _bomb() -> bytes:
    return gzip.compress(json.dumps({"data": [], "pad": "x" * (32 << 20)}).encode())


def gzip_bomb(request: httpx.Request) -> httpx.Response:
    headers = {"content-type": "application/json", "content-encoding": "gzip"}
    return httpx.Response(200, headers=headers, stream=Streamed([_bomb()]))


UNREAD = "the list was not read to its end"
TOO_LARGE = "larger than the limit"
# The pages, the most requests one lookup may make, and what its history entry says.
SCENARIOS = {
    "cursor_repeats": (cursor_repeats, 2, "cursor 'b1' came back on page 2"),
    "cursor_cycles": (cursor_cycles, 3, "cursor 'b1' came back on page 3"),
    "endless": (endless, PAGES, f"no match in the {PAGES} lookup page(s) read"),
    "more_without_cursor": (more_without_cursor, 1, "has more but gives no cursor"),
    "later_page_404": (later_page(404), 2, "page 2 of the lookup answered HTTP 404"),
    "later_page_400": (later_page(400), 2, "page 2 of the lookup answered HTTP 400"),
    "too_many_items": (too_many_items, 1, TOO_LARGE),
    "gzip_bomb": (gzip_bomb, 1, TOO_LARGE),
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
async def test_a_lookup_that_cannot_read_the_list_to_its_end_settles_nothing(
    tmp_path: Path, db_url: str, scenario: str
) -> None:
    pages, most, why = SCENARIOS[scenario]
    async with step_rig(tmp_path, db_url, table=keyless_list_lookup()) as rig:
        op_id = rig.submit()
        rig.provider.script("create", rig.provider.made_then(httpx.ReadTimeout("lost")))
        rig.provider.script("lookup", *[pages] * 10_000)
        op = await rig.run(op_id, ["escalated", "failed", "observing"], max_rounds=2000)
        view = rig.view(op_id)
        lookups = op.create_lookups + 1  # and the look at the window's end, not counted
        sent = rig.provider.sent("lookup")
        creates = rig.provider.sent("create")
        problems = [
            e.detail.get("job_id_problem")
            for e in rig.history(op_id)
            if e.cause == "lookup_response" and isinstance(e.detail, dict)
        ]
    assert view["escalation"]["reason"] == "create_unknown", view["escalation"]
    assert len(creates) == 1  # never sent again: a job may exist
    assert op.create_lookups >= 3 and len(sent) <= most * lookups
    assert problems and all(why in str(p) for p in problems), problems
    assert why == TOO_LARGE or all(UNREAD in str(p) for p in problems)
