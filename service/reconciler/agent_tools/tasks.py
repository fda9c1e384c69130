"""MCP Tasks (``io.modelcontextprotocol/tasks``, SEP-2663): an operation seen as a task.

Pure: an Operation view in, the task's wire shape out. The task is the
operation (same id, same record), so it exists as soon as the operation is
stored and outlives any restart. Status mapping:

* ``working`` while the operation is not done, and also while a person's
  decision is pending (``escalated``, or an end state that decision may reopen),
  with the escalation message as ``statusMessage``: a task's final status never
  changes afterwards;
* ``cancelled`` for a provider-confirmed cancellation;
* ``completed`` for every other end, failures included, with the tool result
  (the Operation) inline: SEP-2663 keeps ``failed`` for JSON-RPC errors, and a
  job that failed is an answer, not a protocol error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reconciler.core.states import State

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
DEFAULT_POLL_MS = 30_000


def awaiting_decision(view: Mapping[str, Any]) -> bool:
    return bool(view.get("awaiting_decision"))


def task_status(view: Mapping[str, Any]) -> str:
    # ``done`` is false while a decision is pending: the task works on until it is made.
    if not view["done"]:
        return "working"
    return "cancelled" if view["state"] == State.CANCELLED else "completed"


def poll_interval_ms(view: Mapping[str, Any]) -> int:
    hint = view.get("poll_after_seconds")
    return int(hint * 1000) if isinstance(hint, int | float) and hint > 0 else DEFAULT_POLL_MS


def task_view(
    view: Mapping[str, Any], message: str, result: Mapping[str, Any], *, result_type: str
) -> dict[str, Any]:
    """The task for ``view``: ``result_type`` "task" creates it, "complete" answers tasks/get.

    ``message`` is the Operation's message in the tools' words, ``result`` the
    CallToolResult (wire JSON) that get_job would give.
    """
    status = task_status(view)
    escalation = view.get("escalation")
    status_message = message
    if awaiting_decision(view) and isinstance(escalation, dict):
        status_message = escalation["message"]
    task: dict[str, Any] = {
        "resultType": result_type,
        "taskId": view["id"],
        "status": status,
        "statusMessage": status_message,
        "createdAt": view["created_at"],
        "lastUpdatedAt": view["updated_at"],
        "ttlMs": None,  # operations are kept: the task never expires
    }
    if status == "working":
        task["pollIntervalMs"] = poll_interval_ms(view)
    if status == "completed":
        task["result"] = dict(result)
    return task
