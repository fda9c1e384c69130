"""MCP Tasks (``io.modelcontextprotocol/tasks``, SEP-2663): an operation seen as a task.

Pure. An Operation view in, the task's wire shape out. The task is the
operation (same id, same record), so it exists as soon as the operation is
stored and outlives any restart. Status mapping:

* ``working`` while the operation is not done, and also while a person's
  decision is pending (``escalated``, or an end state that decision may reopen):
  a task's final status never changes afterwards;
* ``cancelled`` for a provider-confirmed cancellation;
* ``completed`` for every other end, failures included, with the tool result
  inline: SEP-2663 keeps ``failed`` for JSON-RPC errors, and a job that failed
  is an answer (a tool result with ``isError: true``), not a protocol error.

The inline result of a finished task (cancelled included) is the very answer
``wait_job`` gives for the job, built by the same function.

``pollIntervalMs`` is when the agent can next expect news. A webhook may end a job at
any moment, so it is never the fallback poller's stretched interval: a quarter of the
job's age, from one second up to five (a job that has run a minute is seen done at
most five seconds late, one of six seconds about a second late), sooner when the next
status read or the deadline comes first.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from reconciler.core.states import State

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
FIRST_POLL_MS = 1_000
MAX_POLL_MS = 5_000
MIN_POLL_MS = 250  # the deadline may be closer than a second: poll then, not much sooner
AGE_SHARE = 0.25


def task_status(view: Mapping[str, Any]) -> str:
    # ``done`` is false while a decision is pending: the task works on until it is made.
    if not view["done"]:
        return "working"
    return "cancelled" if view["state"] == State.CANCELLED else "completed"


def _ms_until(stamp: Any, now: datetime) -> float | None:
    if not isinstance(stamp, str):
        return None
    return (datetime.fromisoformat(stamp) - now).total_seconds() * 1000


def poll_interval_ms(view: Mapping[str, Any], now: datetime) -> int:
    """When to ask again about a working task, at ``now``."""
    age = -(_ms_until(view["created_at"], now) or 0.0)
    candidates = [min(MAX_POLL_MS, max(FIRST_POLL_MS, age * AGE_SHARE))]
    hint = view.get("poll_after_seconds")
    if isinstance(hint, int | float) and hint > 0:
        candidates.append(hint * 1000)  # the next status read, which may bring the end
    deadline = _ms_until(view.get("deadline_at"), now)
    if deadline is not None and deadline > 0:
        candidates.append(deadline)  # at the deadline waiting stops: news either way
    return int(max(MIN_POLL_MS, min(candidates)))


def task_view(
    view: Mapping[str, Any],
    status_message: str,
    result: Mapping[str, Any],
    now: datetime,
    *,
    result_type: str,
) -> dict[str, Any]:
    """The task for ``view``: ``result_type`` "task" creates it, "complete" answers tasks/get
    and tasks/cancel.

    ``status_message`` is the Operation's message in the tasks' words, ``result`` the
    CallToolResult (wire JSON) that wait_job gives for the job.
    """
    status = task_status(view)
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
        task["pollIntervalMs"] = poll_interval_ms(view, now)
    else:
        task["result"] = dict(result)
    return task
