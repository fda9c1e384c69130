"""The service's words for the HTTP API, said in MCP's terms: tool calls, or task requests.

Pure. The Operation's message and the refusals are written once, for every door, and
name the next step as an HTTP request (``GET /v1/operations/{id}/wait``). An MCP agent
cannot make that request, so everything a tool or a task says passes through here first:
the next step becomes the tool call (``wait_job(id=...)``) or, for a task, the
``tasks/get`` poll. Guarantee: no HTTP path of the service is left in the text.
"""

from __future__ import annotations

import re
from enum import Enum

from reconciler.core.operation_view import DECISION_HINT, WAIT_HINT


class Door(Enum):
    TOOL = "tool"  # a tool call's answer
    TASK = "task"  # a task's status message


def _hints(door: Door, op_id: str) -> dict[str, str]:
    wait = f'wait_job(id="{op_id}")'
    if door is Door.TOOL:
        return {
            WAIT_HINT: f"Wait with {wait}; it waits on the server.",
            DECISION_HINT: f"{wait} returns as soon as the decision is made.",
        }
    return {
        WAIT_HINT: (
            f'Poll tasks/get(taskId="{op_id}") at its pollIntervalMs until the task completes '
            f"(or call {wait}, which waits on the server)."
        ),
        DECISION_HINT: (
            "The task stays working until the decision is made; tasks/get then answers with "
            f"what happened (or call {wait}, which returns as soon as it is made)."
        ),
    }


# Paths a refusal may name, most specific first; the id part is any one path segment.
_PATHS = (
    (re.compile(r"list_providers or GET /v1/providers"), "list_providers"),
    (re.compile(r"GET /v1/providers"), "list_providers"),
    (re.compile(r"GET /v1/operations/[^/\s)]+/wait"), "wait_job"),
    (re.compile(r"POST /v1/operations/[^/\s)]+/cancel"), "cancel_job"),
    (re.compile(r"GET /v1/operations/[^/\s)?]+"), "get_job"),
    (re.compile(r"GET /v1/operations"), "list_jobs"),
    (re.compile(r"POST /v1/operations"), "start_job"),
)


def in_mcp_terms(text: str) -> str:
    """``text`` with every request to the service's API named as the tool that makes it."""
    for pattern, tool in _PATHS:
        text = pattern.sub(tool, text)
    return text


def said_for(door: Door, message: str, op_id: str) -> str:
    """The Operation's ``message`` with its next step named for ``door``."""
    for http, words in _hints(door, op_id).items():
        message = message.replace(http.replace("{id}", op_id), words)
    return in_mcp_terms(message)
