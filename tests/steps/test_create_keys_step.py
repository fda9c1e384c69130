"""The create keys of real providers, through the create step on a real database.

``idempotency = "body"`` with ``[create.set]`` (Ray's ``submission_id``), a request that
already holds a set field (400, nothing stored), a ``duplicate`` answer settled by the
lookup, a lookup over list pages (OpenAI's ``metadata`` match), and ``idempotency =
"none"`` without a lookup: a create that may have made a job escalates
``create_unknown`` and goes out again only on an operator's ``resend``, once.
"""

from __future__ import annotations

import copy
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from reconciler.commands import agent_actions
from reconciler.core.errors import InvalidRequest
from reconciler.storage.escalations import open_escalation
from reconciler.storage.models import Operation
from tests.support.provider_mock import BASE_URL, answer, error
from tests.support.stack import sim_provider_table
from tests.support.steps import AGENT, StepRig, step_rig

pytestmark = pytest.mark.anyio


def keyless(**create: Any) -> dict[str, Any]:
    """The sim's table as a provider that takes no idempotency header."""
    table = copy.deepcopy(sim_provider_table(BASE_URL))
    table["create"].pop("idempotency_header")
    table["create"].update(create)
    return table


def body_of(rig: StepRig, index: int = -1) -> Any:
    return json.loads(rig.provider.sent("create")[index].body)


def made_then(rig: StepRig, exc: Exception) -> None:
    """The next create makes its job, then its answer is lost."""

    def lost(request: httpx.Request) -> httpx.Response:
        rig.provider.make_job(None, json.loads(request.content))
        raise exc

    rig.provider.script("create", lost)


def count_operations(rig: StepRig) -> int:
    with rig.runtime.db.read() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(Operation)).scalar() or 0)


async def test_body_idempotency_sends_the_key_in_the_request_and_no_header(
    tmp_path: Path, db_url: str
) -> None:
    table = keyless(
        idempotency="body",
        set={"/submission_id": "{idempotency_key}", "/metadata/op": "{operation_id}"},
    )
    table.pop("lookup")
    async with step_rig(tmp_path, db_url, table=table) as rig:
        op_id = rig.submit({"entrypoint": "echo hi", "metadata": {"team": "a"}})
        op = await rig.step(op_id)
        assert op.state == "observing"
        [sent] = rig.provider.sent("create")
        assert "idempotency-key" not in sent.headers
        assert json.loads(sent.body) == {
            "entrypoint": "echo hi",
            "metadata": {"team": "a", "op": op_id},
            "submission_id": op.idempotency_token,
        }


async def test_body_idempotency_resends_the_same_body_after_a_lost_answer(
    tmp_path: Path, db_url: str
) -> None:
    table = keyless(idempotency="body", set={"/submission_id": "{idempotency_key}"})
    table.pop("lookup")
    async with step_rig(tmp_path, db_url, table=table) as rig:
        op_id = rig.submit({"entrypoint": "echo hi"})
        made_then(rig, httpx.ReadTimeout("timed out"))
        assert (await rig.step(op_id)).state == "create_unknown"
        rig.advance_to_due(op_id)
        assert (await rig.step(op_id)).state == "observing"
        first, second = rig.provider.sent("create")
        assert first.body == second.body


async def test_a_request_holding_a_set_field_is_refused_and_nothing_is_stored(
    tmp_path: Path, db_url: str
) -> None:
    table = keyless(idempotency="body", set={"/submission_id": "{idempotency_key}"})
    async with step_rig(tmp_path, db_url, table=table) as rig:
        body = {"provider": "sim", "request": {"entrypoint": "x", "submission_id": "mine"}}
        with pytest.raises(InvalidRequest, match="/submission_id"):
            await agent_actions.start(rig.runtime, AGENT, body)
        assert count_operations(rig) == 0
        assert rig.provider.requests == []


async def test_a_duplicate_answer_is_settled_by_the_lookup_never_an_error_or_a_resend(
    tmp_path: Path, db_url: str
) -> None:
    provider = {"create": {"duplicate": {"status": [500], "body_contains": "already exists"}}}
    async with step_rig(tmp_path, db_url, provider=provider) as rig:
        op_id = rig.submit()
        token = rig.row(op_id).idempotency_token

        def exists(request: httpx.Request) -> httpx.Response:
            rig.provider.make_job(token, json.loads(request.content))
            return answer(500, {"error": f"Job with submission_id {token} already exists"})

        rig.provider.script("create", exists)
        op = await rig.step(op_id)
        assert op.state == "observing" and op.remote_job_id == rig.provider.by_key[token]
        assert len(rig.provider.sent("create")) == 1
        assert len(rig.provider.sent("lookup")) == 1
        assert op.error is None
        decisions = [
            (e.detail or {}).get("decision")
            for e in rig.history(op_id)
            if e.cause == "create_response"
        ]
        assert decisions == ["duplicate"]


LIST_LOOKUP = {
    "path": "/v1/jobs",
    "items": "/data",
    "match": {"/metadata/reconciler_key": "{idempotency_key}"},
    "job_id": "/job_id",
    "pages": 3,
    "next": "/last_id",
    "next_param": "after",
    "has_more": "/has_more",
}


def list_pages(
    rig: StepRig, *, ours_on_page: int | None, last_page: int = 5, slow_seconds: float = 0
) -> list[str | None]:
    """Lookup answers as OpenAI lists batches: newest first, a cursor, ``has_more``; each
    page takes ``slow_seconds`` of the test's clock.

    Returns the list of cursors the lookups carried, filled as they arrive."""
    cursors: list[str | None] = []

    def page(request: httpx.Request) -> httpx.Response:
        rig.advance(slow_seconds)
        after = request.url.params.get("after")
        cursors.append(after)
        number = 1 if after is None else int(after.removeprefix("p")) + 1
        data = [{"job_id": f"other-{number}", "metadata": {"reconciler_key": "not-ours"}}]
        if number == ours_on_page:
            data += [
                {"job_id": job.id, "metadata": job.request["metadata"]}
                for job in rig.provider.jobs.values()
            ]
        return answer(200, {"data": data, "has_more": number < last_page, "last_id": f"p{number}"})

    rig.provider.script("lookup", *([page] * 3))
    return cursors


def key_in_metadata_found_by_listing() -> dict[str, Any]:
    """Keyless: the key set in the job's metadata, a lost create looked up in the list."""
    table = keyless(idempotency="none", set={"/metadata/reconciler_key": "{idempotency_key}"})
    table["lookup"] = LIST_LOOKUP
    return table


async def test_a_list_lookup_follows_the_cursor_to_the_matching_item(
    tmp_path: Path, db_url: str
) -> None:
    table = key_in_metadata_found_by_listing()
    async with step_rig(tmp_path, db_url, table=table) as rig:
        op_id = rig.submit({"input_file_id": "file-1"})
        made_then(rig, httpx.ReadTimeout("timed out"))
        assert (await rig.step(op_id)).state == "create_unknown"
        cursors = list_pages(rig, ours_on_page=2)
        rig.advance_to_due(op_id)
        op = await rig.step(op_id)
        assert op.state == "observing" and op.remote_job_id == "job-1"
        assert cursors == [None, "p1"]
        assert len(rig.provider.sent("create")) == 1


async def test_a_list_lookup_may_match_on_the_operation_id_the_create_set(
    tmp_path: Path, db_url: str
) -> None:
    table = keyless(idempotency="none", set={"/metadata/reconciler_key": "{operation_id}"})
    table["lookup"] = {**LIST_LOOKUP, "match": {"/metadata/reconciler_key": "{operation_id}"}}
    async with step_rig(tmp_path, db_url, table=table) as rig:
        op_id = rig.submit({"input_file_id": "file-1"})
        made_then(rig, httpx.ReadTimeout("timed out"))
        assert (await rig.step(op_id)).state == "create_unknown"
        assert body_of(rig)["metadata"]["reconciler_key"] == op_id
        list_pages(rig, ours_on_page=1)
        rig.advance_to_due(op_id)
        op = await rig.step(op_id)
        assert op.state == "observing" and op.remote_job_id == "job-1"
        assert len(rig.provider.sent("create")) == 1


async def test_not_found_on_every_page_means_the_create_never_landed(
    tmp_path: Path, db_url: str
) -> None:
    table = key_in_metadata_found_by_listing()
    async with step_rig(tmp_path, db_url, table=table) as rig:
        op_id = rig.submit({"input_file_id": "file-1"})
        rig.provider.script("create", httpx.ReadTimeout("timed out"))  # nothing was made
        assert (await rig.step(op_id)).state == "create_unknown"
        cursors = list_pages(rig, ours_on_page=None, last_page=3)
        rig.advance_to_due(op_id)
        op = await rig.step(op_id)
        assert cursors == [None, "p1", "p2"]  # the whole list, then not found
        assert op.state == "observing" and len(rig.provider.jobs) == 1
        assert len(rig.provider.sent("create")) == 2


async def test_a_list_that_goes_on_past_the_pages_read_does_not_mean_not_made(
    tmp_path: Path, db_url: str
) -> None:
    # Ours is on page 4 of 5 and three pages are read: "not found" would resend a made job.
    table = key_in_metadata_found_by_listing()
    async with step_rig(tmp_path, db_url, table=table) as rig:
        op_id = rig.submit({"input_file_id": "file-1"})
        made_then(rig, httpx.ReadTimeout("timed out"))
        assert (await rig.step(op_id)).state == "create_unknown"
        cursors = list_pages(rig, ours_on_page=4)
        rig.advance_to_due(op_id)
        op = await rig.step(op_id)
        assert cursors == [None, "p1", "p2"]
        assert op.state == "create_unknown" and op.remote_job_id is None
        assert len(rig.provider.sent("create")) == 1 and len(rig.provider.jobs) == 1


async def test_a_lookup_answered_after_the_create_window_still_asks_whether_to_resend(
    tmp_path: Path, db_url: str
) -> None:
    # The window closes while the lookup is out (a slow provider, a loaded machine): the
    # create may still have made a job, so it is the operator's call, not a provider failure.
    table = key_in_metadata_found_by_listing()
    table["create"]["create_deadline_seconds"] = 60
    async with step_rig(tmp_path, db_url, table=table) as rig:
        op_id = rig.submit({"input_file_id": "file-1"})
        made_then(rig, httpx.ReadTimeout("timed out"))
        assert (await rig.step(op_id)).state == "create_unknown"
        list_pages(rig, ours_on_page=4, slow_seconds=30)
        rig.advance_to_due(op_id)
        op = await rig.step(op_id)
        assert op.state == "escalated"
        with rig.runtime.db.read() as conn:
            esc = open_escalation(conn, op)
        assert esc is not None and esc.reason == "create_unknown", esc
        assert len(rig.provider.sent("create")) == 1 and len(rig.provider.jobs) == 1


def no_lookup() -> dict[str, Any]:
    table = keyless(idempotency="none")
    table.pop("lookup")
    return table


@pytest.mark.parametrize(
    "fault",
    ["timeout", "reset", "500"],
)
async def test_a_keyless_create_that_may_have_made_a_job_is_never_resent_on_its_own(
    tmp_path: Path, db_url: str, fault: str
) -> None:
    async with step_rig(tmp_path, db_url, table=no_lookup()) as rig:
        op_id = rig.submit()
        if fault == "500":

            def made_then_500(request: httpx.Request) -> httpx.Response:
                rig.provider.make_job(None, json.loads(request.content))
                return error(500)

            rig.provider.script("create", made_then_500)
        else:
            made_then(
                rig,
                httpx.ReadTimeout("timed out")
                if fault == "timeout"
                else httpx.RemoteProtocolError("peer closed connection"),
            )
        op = await rig.step(op_id)
        assert op.state == "escalated" and op.next_poll_at is None
        with rig.runtime.db.read() as conn:
            esc = open_escalation(conn, op)
        assert esc is not None and esc.reason == "create_unknown"
        options = {o["action"]: o["description"] for o in esc.options}
        assert set(options) == {"abandon", "resend"}
        assert "a duplicate job may result" in options["resend"]
        rig.advance(24 * 3600)
        assert await rig.tick() == 0  # nothing is due: no create goes out by itself
        assert len(rig.provider.sent("create")) == 1


async def test_resend_sends_the_same_request_once_recorded_with_the_operator(
    tmp_path: Path, db_url: str
) -> None:
    async with step_rig(tmp_path, db_url, table=no_lookup()) as rig:
        op_id = rig.submit({"report": "q3"})
        made_then(rig, httpx.ReadTimeout("timed out"))
        assert (await rig.step(op_id)).state == "escalated"
        rig.advance(3600)  # long after the create window
        assert rig.decide(op_id, {"action": "resend"}).state == "create_unknown"
        # The resend's answer is lost as well: a second escalation, no third create.
        made_then(rig, httpx.ReadTimeout("timed out"))
        op = await rig.step(op_id)
        assert op.state == "escalated"
        first, second = rig.provider.sent("create")
        assert first.body == second.body == b'{"report":"q3"}'
        notes = [e for e in rig.history(op_id) if e.cause == "create_resend_authorized"]
        assert [n.actor for n in notes] == ["operator:ops-1"]
        decided = [e for e in rig.history(op_id) if e.cause == "decision:resend"]
        assert decided and all(e.actor == "operator:ops-1" for e in decided)
        rig.advance(24 * 3600)
        assert await rig.tick() == 0
        assert len(rig.provider.sent("create")) == 2
        # Decided again, it is answered this time: one job per decision, tracked.
        rig.decide(op_id, {"action": "resend"})
        op = await rig.step(op_id)
        assert op.state == "observing" and op.remote_job_id == "job-3"
        assert len(rig.provider.sent("create")) == 3


async def test_a_keyless_create_that_certainly_made_no_job_is_retried(
    tmp_path: Path, db_url: str
) -> None:
    async with step_rig(tmp_path, db_url, table=no_lookup()) as rig:
        op_id = rig.submit()
        rig.provider.script("create", error(429, {"retry-after-ms": "4500"}))
        op = await rig.step(op_id)
        assert op.state == "create_unknown" and op.next_poll_at is not None
        assert op.next_poll_at >= rig.clock.now() + timedelta(seconds=4.5)
        assert op.delay_source == "provider_retry_after"
        rig.advance_to_due(op_id)
        op = await rig.step(op_id)
        assert op.state == "observing" and len(rig.provider.sent("create")) == 2


async def test_abandon_ends_a_create_unknown_without_another_create(
    tmp_path: Path, db_url: str
) -> None:
    async with step_rig(tmp_path, db_url, table=no_lookup()) as rig:
        op_id = rig.submit()
        made_then(rig, httpx.ReadTimeout("timed out"))
        await rig.step(op_id)
        op = rig.decide(op_id, {"action": "abandon"})
        assert op.state == "failed"
        assert len(rig.provider.sent("create")) == 1


async def test_a_resend_interrupted_after_it_was_counted_is_not_sent_again(
    tmp_path: Path, db_url: str
) -> None:
    """The worker dies between counting the authorized resend and learning its outcome:
    the request may have gone out, so the next worker escalates instead of sending."""
    async with step_rig(tmp_path, db_url, table=no_lookup()) as rig:
        op_id = rig.submit()
        made_then(rig, httpx.ReadTimeout("timed out"))
        await rig.step(op_id)
        rig.decide(op_id, {"action": "resend"})

        def dies(request: httpx.Request) -> httpx.Response:
            rig.provider.make_job(None, json.loads(request.content))
            raise RuntimeError("the worker process died here")

        rig.provider.script("create", dies)
        with pytest.raises(RuntimeError):
            await rig.step(op_id)
        assert rig.row(op_id).create_attempts == 2  # counted before it was sent
        rig.advance_to_due(op_id)
        op = await rig.step(op_id)
        assert op.state == "escalated"
        assert len(rig.provider.sent("create")) == 2 and len(rig.provider.jobs) == 2
        with rig.runtime.db.read() as conn:
            esc = open_escalation(conn, op)
        assert esc is not None and esc.reason == "create_unknown"
