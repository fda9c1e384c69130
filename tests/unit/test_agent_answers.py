"""What an MCP agent reads, without a server: the text of an answer, a list's summaries, a
refusal and its error object, all in MCP's own terms."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

import pytest

from reconciler.agent_tools.answer_text import TEXT_RESULT_BYTES, no_outcome, operation_text
from reconciler.agent_tools.job_summary import job_summary, page_text
from reconciler.agent_tools.refusals import task_error, tool_error
from reconciler.agent_tools.server import _providers_result, operation_result, tool_message
from reconciler.agent_tools.wording import Door, in_mcp_terms, said_for
from reconciler.core import errors
from reconciler.core.clock import utc
from reconciler.core.operation_view import operation_view
from reconciler.core.quotas import Quota, check_quota
from reconciler.core.records import EscalationRecord
from reconciler.core.states import END_STATES, State
from reconciler.wire import JobSummary, OperationFilter, ToolErrorBody
from tests.support.factories import new_operation

NOW = utc(datetime(2026, 3, 8, 14, 22, 11))
ROWS = {"job_id": "job_1", "rows": [{"item": f"item-{i:05d}", "status": "ok"} for i in range(100)]}
BIG = {
    "ref": "https://sim.example/v1/jobs/job_1/result",
    "sha256": "ab" * 32,
    "size": 3412,
    "content_type": "application/json",
    "summary": {"processed": 100, "failed": 0},
    "data": ROWS,
}
SMALL = {"ref": None, "size": 40, "summary": {"processed": 2, "failed": 0}, "data": {"n": 2}}
FAILED = {"code": "provider_failed", "remote_state": "failed", "provider_error": "item 42 broke"}


def view_of(state: State, **overrides: Any) -> dict[str, Any]:
    escalation = overrides.pop("escalation", None)
    op = new_operation(NOW, state=state.value, **overrides)
    return operation_view(op, NOW, escalation)


def shown(view: dict[str, Any]) -> str:
    return operation_text({**view, "message": tool_message(view)})


def test_a_small_result_is_in_the_text_whole() -> None:
    text = shown(view_of(State.SUCCEEDED, result=SMALL, done_at=NOW))
    lines = text.splitlines()
    assert lines[0].startswith("The job SUCCEEDED and its result was verified.")
    assert "; state: succeeded; done: true" in lines[1]
    assert lines[2] == f"result: {json.dumps(SMALL, separators=(', ', ': '))}"


def test_a_large_result_is_its_size_reference_and_summary_never_its_rows() -> None:
    assert len(json.dumps(BIG)) > TEXT_RESULT_BYTES
    text = shown(view_of(State.SUCCEEDED, result=BIG, done_at=NOW))
    (line,) = [t for t in text.splitlines() if t.startswith("result:")]
    assert line.startswith("result: 3,412 bytes of application/json at https://sim.example/")
    assert 'summary: {"processed": 100, "failed": 0}' in line and "abab" not in line
    assert "item-00001" not in text and "too large for this text" in line


def test_a_failure_says_its_code_and_message_and_is_a_tool_error() -> None:
    view = view_of(State.FAILED, error=FAILED, done_at=NOW)
    result = operation_result(view)
    text = result.content[0].text  # type: ignore[union-attr]
    assert result.is_error is True
    assert "error: provider_failed: the provider reports the job failed" in text
    assert "item 42 broke" in text
    assert result.structured_content is not None
    assert result.structured_content["error"]["code"] == "provider_failed"


@pytest.mark.parametrize("state", sorted(END_STATES, key=lambda s: s.value), ids=str)
def test_only_an_end_without_a_usable_outcome_is_a_tool_error(state: State) -> None:
    useful = {State.SUCCEEDED, State.COMPLETED_WITH_ERRORS, State.CANCELLED}
    assert no_outcome(view_of(state, done_at=NOW)) is (state not in useful)


def test_while_a_person_decides_nothing_reads_as_final() -> None:
    escalation = EscalationRecord(
        id=3,
        operation_id="op_x",
        reason="deadline_exceeded",
        message="External job needs a decision",
        options=[{"action": "abandon", "description": "abandon (stop waiting)"}],
        resume_state=None,
        created_at=NOW,
        decided_at=None,
        decided_by=None,
        decision=None,
    )
    view = view_of(
        State.RESULT_TIMED_OUT,
        escalation_id=3,
        escalation_open=True,
        done_at=NOW,
        escalation=escalation,
    )
    assert view["done_at"] is None and view["done"] is False
    result = operation_result(view)
    text = result.content[0].text  # type: ignore[union-attr]
    assert result.is_error is False
    assert "state: awaiting an operator's decision (result_timed_out is not final until" in text
    assert "you cannot decide it" in text and "Tell your user" in text
    assert f'wait_job(id="{view["id"]}") returns as soon as the decision is made' in text
    task = said_for(Door.TASK, view["message"], view["id"])
    assert "The task stays working until the decision is made" in task and "/v1/" not in task


@pytest.mark.parametrize("state", list(State), ids=str)
def test_no_answer_names_an_http_path(state: State) -> None:
    view = view_of(state, next_poll_at=NOW + timedelta(seconds=3))
    for text in (shown(view), said_for(Door.TASK, view["message"], view["id"])):
        assert "/v1/" not in text and "GET " not in text, text


def test_the_next_step_is_a_tool_call_or_for_a_task_tasks_get() -> None:
    view = view_of(State.OBSERVING)
    op_id = view["id"]
    assert f'Wait with wait_job(id="{op_id}"); it waits on the server.' in tool_message(view)
    task = said_for(Door.TASK, view["message"], op_id)
    assert f'Poll tasks/get(taskId="{op_id}") at its pollIntervalMs' in task


def test_a_list_is_summaries_without_result_rows() -> None:
    views = [
        view_of(State.SUCCEEDED, result=BIG, done_at=NOW, idempotency_key="report-q3"),
        view_of(State.FAILED, error=FAILED, done_at=NOW),
        view_of(State.OBSERVING),
    ]
    jobs = [job_summary(v) for v in views]
    for job in jobs:
        JobSummary.model_validate(job)
    assert jobs[0]["result"] == {"size": 3412, "summary": {"processed": 100, "failed": 0}}
    assert jobs[1]["error_code"] == "provider_failed" and jobs[2]["result"] is None
    text = page_text(jobs, "cur", OperationFilter())
    assert "rows" not in json.dumps(jobs) and "item-0" not in text
    lines = text.splitlines()
    assert lines[0] == "3 of your jobs, newest first:"
    assert "succeeded, done=True, idempotency_key 'report-q3'" in lines[1]
    assert 'result 3,412 bytes (summary {"processed": 100, "failed": 0})' in lines[1]
    assert lines[2].endswith("error provider_failed")
    assert lines[-1] == 'More: call list_jobs with cursor="cur".'
    assert len(json.dumps(jobs)) < len(json.dumps(views)) / 3


def _quota() -> errors.QuotaExceeded:
    with pytest.raises(errors.QuotaExceeded) as caught:
        check_quota(Quota(max_in_flight=1, max_per_minute=0), "agent-1", 1, [], NOW)
    return caught.value


REFUSALS: list[tuple[str, errors.ReconcilerError, bool | None, str]] = [
    ("start_job", errors.InvalidRequest("unknown provider 'simm'"), False, "Nothing was started."),
    (
        "start_job",
        errors.InvalidRequest(
            "'request.scenario' does not match the request_schema of provider 'sim': 'x' is "
            "not one of ['a'] (list_providers or GET /v1/providers shows the schema); nothing "
            "was stored"
        ),
        False,
        "(list_providers shows the schema); nothing was stored.",
    ),
    ("start_job", errors.StorageUnavailable("database busy"), None, "It is not known whether"),
    ("start_job", _quota(), False, "wait for some to finish (wait_job)"),
    ("start_job", errors.IdempotencyConflict("key already used"), False, "Nothing was started."),
    ("get_job", errors.NotFound("operation op_x does not exist"), False, "Check the id"),
    ("list_jobs", errors.InvalidRequest("unknown provider 'simm' in the filter"), False, "changed"),
    ("wait_job", errors.StorageUnavailable("database busy"), False, "nothing was lost"),
]


@pytest.mark.parametrize(("tool", "exc", "started", "words"), REFUSALS)
def test_a_refusal_has_a_code_says_whether_anything_started_and_names_no_path(
    tool: str, exc: errors.ReconcilerError, started: bool | None, words: str
) -> None:
    result = tool_error(tool, exc)
    text = result.content[0].text  # type: ignore[union-attr]
    assert result.is_error is True and words in text
    body = ToolErrorBody.model_validate(result.structured_content)
    assert (body.error.code, body.error.message, body.error.started) == (exc.code, text, started)
    assert "/v1/" not in text and "GET " not in text
    assert "started" in text.lower() or "nothing was stored" in text
    if isinstance(exc, errors.QuotaExceeded):
        assert body.error.retry_after_seconds == exc.retry_after_seconds


def test_a_task_request_for_an_id_that_does_not_resolve_reads_as_get_job_does() -> None:
    gone = errors.Gone("operation op_1 ended succeeded at T and was removed by retention at U")
    refused = task_error("tasks/get", gone)
    assert refused.code == -32602
    assert refused.message.startswith("Failed to retrieve task: tasks/get: operation op_1 ended")
    assert "call start_job with a new idempotency_key" in refused.message
    assert refused.data["error"]["code"] == "operation_pruned"
    assert refused.data["error"]["started"] is False


def test_paths_become_tools() -> None:
    assert in_mcp_terms("see GET /v1/operations/op_1/wait or POST /v1/operations") == (
        "see wait_job or start_job"
    )
    assert in_mcp_terms("(GET /v1/operations/{id}/wait)") == "(wait_job)"


def test_providers_with_one_schema_list_its_fields_once() -> None:
    schema = {"type": "object", "properties": {"mode": {"enum": ["a"], "description": "How."}}}
    base = {"set_by_service": [], "max_deadline_seconds": 60, "max_status_requests": 5}
    providers = {
        "providers": [
            {**base, "name": "sim", "description": "Webhooks arrive.", "request_schema": schema},
            {**base, "name": "sim-lossy", "description": "Lost.", "request_schema": schema},
            {**base, "name": "other", "description": None, "request_schema": None},
        ]
    }
    text = _providers_result(providers).content[0].text  # type: ignore[union-attr]
    assert text.count("mode (one of: a): How.") == 1
    assert "- sim-lossy: Lost.\n  request: the same request_schema as sim" in text
    assert "- other: no description\n  request: any JSON object (no request_schema)" in text
