"""Every call's shape from the provider file: a body and headers on lookup, status, cancel
and result, and answers that mean "no such job" without a 404.

The provider here is ``fixtures/runs_api.py``, whose every call is a POST naming its run
in the body (``fixtures/providers/runs.toml``), through the real adapter and steps.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fixtures.runs_api import TOKEN, RunsApi

from reconciler.core.story import text_of
from tests.support.provider_mock import answer, error
from tests.support.runs_rig import runs_table, with_token
from tests.support.steps import StepRig, step_rig

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]


@pytest.fixture
def api() -> RunsApi:
    return RunsApi()


def rig_for(tmp_path: Path, db_url: str, api: RunsApi, **changes: dict[str, Any]) -> Any:
    return step_rig(tmp_path, db_url, table=runs_table(**changes), handler=_as_token(api))


_as_token = with_token


def bodies(api: RunsApi, route: str) -> list[Any]:
    return [body for seen, body in api.bodies if seen == route]


async def started(rig: StepRig, api: RunsApi) -> tuple[str, str]:
    op_id = rig.submit({"task": "export"})
    op = await rig.step(op_id)
    assert op.state == "observing" and op.remote_job_id is not None
    return op_id, op.remote_job_id


async def test_every_call_carries_the_body_and_headers_its_table_gives(
    tmp_path: Path, db_url: str, api: RunsApi
) -> None:
    async with rig_for(tmp_path, db_url, api) as rig:
        op_id, run_id = await started(rig, api)
        token = rig.row(op_id).idempotency_token
        assert bodies(api, "submit") == [{"task": "export", "client_token": token}]
        rig.advance_to_due(op_id)
        await rig.tick()
        assert bodies(api, "get") == [{"run_id": run_id}]
        api.finish(run_id)
        op = await rig.run(op_id, ["succeeded"])
        assert op.result["summary"] == {"processed": 2}
        assert bodies(api, "output") == [{"run_id": run_id}]
        # Status, cancel and result calls are POSTs naming the run in their body; none of
        # them needed a path of its own.
        assert api.calls["rest_get"] == api.calls["rest_output"] == 0


async def test_a_lost_create_is_found_by_a_filter_in_the_body_paged_in_the_body(
    tmp_path: Path, db_url: str, api: RunsApi
) -> None:
    """1,008 runs exist; the filter finds ours on the first page. Without the filter the
    list pages by an offset in the body until the run is found."""
    for n in range(1008):
        api.add(f"someone-else-{n}")
    async with rig_for(tmp_path, db_url, api) as rig:
        op_id = rig.submit({"task": "export"})
        api.submit_mode = "lose"
        op = await rig.step(op_id)
        assert op.state == "create_unknown"
        api.submit_mode = "run"
        await rig.run(op_id, ["observing"])
        [looked] = bodies(api, "list")
        token = rig.row(op_id).idempotency_token
        assert looked == {"filter": {"client_token": token}, "limit": 200}
        assert api.calls["submit"] == 1 and len(api.runs) == 1009  # one run: never resent
        assert rig.row(op_id).remote_job_id == "r-001009"


async def test_a_lookup_pages_with_its_offset_in_the_body(
    tmp_path: Path, db_url: str, api: RunsApi
) -> None:
    unfiltered = {"set": {"/limit": 200}}
    for n in range(450):
        api.add(f"someone-else-{n}")
    async with rig_for(tmp_path, db_url, api, lookup=unfiltered) as rig:
        op_id = rig.submit({"task": "export"})
        api.submit_mode = "lose"
        await rig.step(op_id)
        api.submit_mode = "run"
        await rig.run(op_id, ["observing"])
        pages = bodies(api, "list")
        assert pages == [
            {"limit": 200},
            {"limit": 200, "offset": 200},
            {"limit": 200, "offset": 400},
        ]
        assert rig.row(op_id).remote_job_id == "r-000451" and api.calls["submit"] == 1


async def test_no_such_job_said_with_a_400_waits_out_the_grace_then_escalates(
    tmp_path: Path, db_url: str, api: RunsApi
) -> None:
    async with rig_for(tmp_path, db_url, api) as rig:
        op_id, run_id = await started(rig, api)
        api.hidden.add(run_id)
        rig.advance_to_due(op_id)
        await rig.tick()
        op = rig.row(op_id)
        assert op.state == "observing"  # within the grace: eventual consistency
        [note] = [e for e in rig.history(op_id) if "grace window" in json.dumps(e.detail)]
        assert "HTTP 400 (no such job)" in json.dumps(note.detail)
        rig.advance(60)
        op = await rig.run(op_id, ["escalated"])
        assert rig.view(op_id)["escalation"]["reason"] == "contract_violation"
        assert "job not found (HTTP 400)" in rig.view(op_id)["escalation"]["message"]


async def test_a_cancel_posts_its_state_and_the_provider_confirms_it(
    tmp_path: Path, db_url: str, api: RunsApi
) -> None:
    async with rig_for(tmp_path, db_url, api) as rig:
        op_id, run_id = await started(rig, api)
        rig.cancel(op_id)
        op = await rig.step(op_id)
        assert op.state == "cancelling"
        assert bodies(api, "set_state") == [{"run_id": run_id, "state": {"type": "CANCELLING"}}]
        assert rig.causes(op_id)[-1] == "cancel_accepted"
        await rig.run(op_id, ["cancelled"])


async def test_a_refused_cancel_is_never_reported_as_sent(
    tmp_path: Path, db_url: str, api: RunsApi
) -> None:
    """The file's cancel without the state in its body: the API answers 422. The job goes
    on, the answer says the provider refused the cancel and why, and a new cancel may be
    asked for."""
    without_body = runs_table()
    without_body["cancel"]["set"] = {"/run_id": "{job_id}"}
    async with step_rig(tmp_path, db_url, table=without_body, handler=_as_token(api)) as rig:
        op_id, run_id = await started(rig, api)
        rig.cancel(op_id, "not needed")
        op = await rig.step(op_id)
        assert op.state == "observing" and op.cancel_sent_at is None
        assert op.cancel_requested_at is None  # the intent is spent: ask again if wanted
        view = rig.view(op_id)
        refused = view["cancel_refused"]
        assert refused["http_status"] == 422
        assert refused["provider_message"] == "state.type is required and must be CANCELLING"
        assert view["message"].startswith("The provider REFUSED the cancel (HTTP 422: state.type")
        assert "NOT cancelled" in view["message"] and "was sent" not in view["message"]
        assert view["cancel_requested"] is False and view["done"] is False
        assert "cancel_refused" in rig.causes(op_id) and "cancel_sent" not in rig.causes(op_id)
        [told] = [text_of(e) for e in rig.history(op_id) if e.cause == "cancel_refused"]
        assert told == (
            "the provider refused the cancel (HTTP 422: state.type is required and must be "
            "CANCELLING); the job goes on, observed"
        )
        # The job is watched on, and ends as it really ends.
        api.finish(run_id)
        op = await rig.run(op_id, ["succeeded"])
        view = rig.view(op_id)
        assert view["cancel_refused"]["http_status"] == 422  # kept: it happened
        assert "REFUSED" not in view["message"] and view["done"] is True


async def test_a_cancel_of_a_run_that_ended_is_refused_with_a_409(
    tmp_path: Path, db_url: str, api: RunsApi
) -> None:
    async with rig_for(tmp_path, db_url, api) as rig:
        op_id, run_id = await started(rig, api)
        api.finish(run_id)  # ended at the provider before the cancel reached it
        rig.cancel(op_id)
        op = await rig.step(op_id)
        assert op.state == "observing"
        assert op.cancel_refusal["provider_message"] == f"run {run_id} has already ended"
        await rig.run(op_id, ["succeeded"])


async def test_a_cancel_not_taken_is_sent_again_within_its_window(
    tmp_path: Path, db_url: str, api: RunsApi
) -> None:
    """A 429 is "not now": the cancel stays requested and is sent again later."""
    answers = [error(429, {"Retry-After": "3"})]

    def limited(request: Any) -> Any:
        request.headers["authorization"] = f"Bearer {TOKEN}"
        if request.url.path.endswith("/set_state") and answers:
            return answers.pop(0)
        return api.handle(request)

    async with step_rig(tmp_path, db_url, table=runs_table(), handler=limited) as rig:
        op_id, _ = await started(rig, api)
        rig.cancel(op_id)
        asked = rig.clock.now()
        op = await rig.step(op_id)
        assert op.state == "cancel_requested" and op.cancel_sent_at is None
        assert op.delay_source == "provider_retry_after"
        assert op.next_poll_at is not None and (op.next_poll_at - asked).total_seconds() >= 3
        await rig.run(op_id, ["cancelled"])
        assert api.calls["set_state"] == 1  # the one that got through


async def test_a_cancel_never_taken_escalates_at_its_window_saying_so(
    tmp_path: Path, db_url: str, api: RunsApi
) -> None:
    def limited(request: Any) -> Any:
        request.headers["authorization"] = f"Bearer {TOKEN}"
        if request.url.path.endswith("/set_state"):
            return error(429)
        return api.handle(request)

    async with step_rig(tmp_path, db_url, table=runs_table(), handler=limited) as rig:
        op_id, _ = await started(rig, api)
        rig.cancel(op_id)
        op = await rig.run(op_id, ["cancellation_unconfirmed"])
        escalation = rig.view(op_id)["escalation"]
        assert "did not take the cancel" in escalation["message"]
        assert "never confirmed sent" in escalation["message"]
        tries = [e for e in rig.history(op_id) if e.cause == "cancel_call"]
        assert 2 <= len(tries) <= 8  # thinned out over the 60 s window, never a loop
        assert op.cancel_sent_at is None


async def test_a_cancel_refused_for_the_credential_asks_a_person(
    tmp_path: Path, db_url: str, api: RunsApi
) -> None:
    def denied(request: Any) -> Any:
        request.headers["authorization"] = f"Bearer {TOKEN}"
        if request.url.path.endswith("/set_state"):
            return error(403)
        return api.handle(request)

    async with step_rig(tmp_path, db_url, table=runs_table(), handler=denied) as rig:
        op_id, _ = await started(rig, api)
        rig.cancel(op_id)
        op = await rig.step(op_id)
        assert op.state == "escalated" and op.cancel_sent_at is None
        assert rig.view(op_id)["escalation"]["reason"] == "authorization_denied"


async def test_what_the_file_says_is_a_refusal_is_one_whatever_its_status(
    tmp_path: Path, db_url: str, api: RunsApi
) -> None:
    """Some APIs answer a cancel they did not take with a 200 (Ray: ``"stopped": false``)."""

    def no_op(request: Any) -> Any:
        request.headers["authorization"] = f"Bearer {TOKEN}"
        if request.url.path.endswith("/set_state"):
            return answer(200, {"stopped": False, "message": "nothing to stop"})
        return api.handle(request)

    refused = {"refused": {"status": [200], "body_contains": '"stopped":false'}}
    table = runs_table(cancel=refused)
    async with step_rig(tmp_path, db_url, table=table, handler=no_op) as rig:
        op_id, _ = await started(rig, api)
        rig.cancel(op_id)
        op = await rig.step(op_id)
        assert op.state == "observing"
        assert op.cancel_refusal == {
            "http_status": 200,
            "provider_message": "nothing to stop",
            "at": op.cancel_refusal["at"],
        }


async def test_a_refused_lookup_settles_nothing_and_never_resends(
    tmp_path: Path, db_url: str, api: RunsApi
) -> None:
    """A lookup the API refuses (its filter is not one the API takes) is not "not found":
    the create is never sent again on it, and the window's end asks a person."""

    def refusing(request: Any) -> Any:
        request.headers["authorization"] = f"Bearer {TOKEN}"
        if request.url.path.endswith("/runs/list"):
            return answer(422, {"message": "filter.client_token is not a filter"})
        return api.handle(request)

    async with step_rig(tmp_path, db_url, table=runs_table(), handler=refusing) as rig:
        op_id = rig.submit({"task": "export"})
        api.submit_mode = "lose"
        await rig.step(op_id)
        api.submit_mode = "run"
        op = await rig.run(op_id, ["escalated"])
        assert api.calls["submit"] == 1 and len(api.runs) == 1  # the run the lost answer made
        looks = [e for e in rig.history(op_id) if e.cause == "lookup_response"]
        assert looks and all(e.detail["http_status"] == 422 for e in looks)
        assert op.remote_job_id is None
        said = "the lookup settled nothing: HTTP 422 (filter.client_token is not a filter)"
        assert said in rig.view(op_id)["escalation"]["message"]


async def test_a_refused_result_fetch_is_result_unavailable_with_its_status(
    tmp_path: Path, db_url: str, api: RunsApi
) -> None:
    def no_output(request: Any) -> Any:
        request.headers["authorization"] = f"Bearer {TOKEN}"
        if request.url.path.endswith("/runs/output"):
            return answer(410, {"message": "the output expired"})
        return api.handle(request)

    async with step_rig(tmp_path, db_url, table=runs_table(), handler=no_output) as rig:
        op_id, run_id = await started(rig, api)
        api.finish(run_id)
        await rig.run(op_id, ["result_unavailable"])
        error = rig.view(op_id)["error"]
        assert error["code"] == "result_unavailable" and error["http_status"] == 410
        assert rig.view(op_id)["result"] is None


async def test_a_result_fetch_refused_for_the_credential_asks_a_person_then_collects(
    tmp_path: Path, db_url: str, api: RunsApi
) -> None:
    """A 403 on the fetch is this service's credential, not a missing result: a person
    decides, and once the credential is fixed, extend fetches the result again."""
    refusing = [True]

    def no_output(request: Any) -> Any:
        request.headers["authorization"] = f"Bearer {TOKEN}"
        if request.url.path.endswith("/runs/output") and refusing[0]:
            return answer(403, {"message": "output is not shared with this token"})
        return api.handle(request)

    async with step_rig(tmp_path, db_url, table=runs_table(), handler=no_output) as rig:
        op_id, run_id = await started(rig, api)
        api.finish(run_id)
        op = await rig.run(op_id, ["escalated"])
        assert rig.view(op_id)["escalation"]["reason"] == "authorization_denied"
        assert (
            "result fetch was refused for this service's credential (HTTP 403)"
            in (rig.view(op_id)["escalation"]["message"])
        )
        refusing[0] = False
        rig.decide(op_id, {"action": "extend"})
        assert rig.row(op_id).state == "result_collecting"
        await rig.run(op_id, ["succeeded"])
        assert op.result is None and rig.view(op_id)["result"]["summary"] == {"processed": 2}
