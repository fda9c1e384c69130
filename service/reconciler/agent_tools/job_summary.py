"""``list_jobs``: each job in brief, and the page's text.

Pure. A list is for finding work, not for reading results: a job's result rows can be
kilobytes, and a page of fifty whole Operations would fill an agent's context. Each job is
its ``JobSummary`` (``reconciler.wire``): where it stands, its times, its result's size and
the provider's summary; ``get_job`` gives the whole Operation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reconciler.agent_tools.answer_text import (
    SUMMARY_CHARS,
    clipped,
    compact,
    result_size,
    state_words,
)
from reconciler.wire import OperationFilter


def _brief(result: Any) -> dict[str, Any] | None:
    if not isinstance(result, Mapping):
        return None
    return {"size": result_size(result), "summary": result.get("summary")}


def job_summary(view: Mapping[str, Any]) -> dict[str, Any]:
    """The ``JobSummary`` of an Operation view."""
    error = view.get("error")
    return {
        "id": view["id"],
        "provider": view["provider"],
        "state": view["state"],
        "done": view["done"],
        "awaiting_decision": view["awaiting_decision"],
        "cancel_requested": view["cancel_requested"],
        "idempotency_key": view.get("idempotency_key"),
        "created_at": view["created_at"],
        "updated_at": view["updated_at"],
        "deadline_at": view["deadline_at"],
        "done_at": view.get("done_at"),
        "result": _brief(view.get("result")),
        "error_code": error.get("code") if isinstance(error, Mapping) else None,
    }


def _scope(query: OperationFilter) -> str:
    if query.awaiting_decision:
        return " that await an operator's decision"
    if query.done is False:
        return " that are not done"
    return " that are done" if query.done else ""


def summary_line(job: Mapping[str, Any]) -> str:
    line = f"- {job['id']} at {job['provider']}: {state_words(job)}, done={job['done']}"
    if job.get("idempotency_key"):
        line += f", idempotency_key {job['idempotency_key']!r}"
    line += f", started {job['created_at']}"
    if job.get("done_at"):
        line += f", ended {job['done_at']}"
    brief = job.get("result")
    if isinstance(brief, Mapping):
        line += f", result {brief['size']:,} bytes"
        if brief.get("summary") is not None:
            line += f" (summary {clipped(compact(brief['summary']), SUMMARY_CHARS)})"
    if job.get("error_code"):
        line += f", error {job['error_code']}"
    return line


def page_text(jobs: list[dict[str, Any]], next_cursor: str | None, query: OperationFilter) -> str:
    scope = _scope(query)
    head = f"{len(jobs)} of your jobs{scope}, newest first:"
    lines = [head if jobs else f"You have no jobs{scope}."]
    lines += [summary_line(job) for job in jobs]
    waiting = sum(1 for job in jobs if job.get("awaiting_decision"))
    if waiting and not query.awaiting_decision:
        lines.append(
            f"Awaiting an operator's decision: {waiting} of them. Tell your user; wait_job "
            "returns as soon as the decision is made."
        )
    if jobs:
        lines.append("get_job(id=...) gives a job's whole answer, its result included.")
    if next_cursor:
        lines.append(f'More: call list_jobs with cursor="{next_cursor}".')
    return "\n".join(lines)
