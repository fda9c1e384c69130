"""A refused tool call or task request: its text, and the same as ``{error: {...}}``.

Pure. Every refusal says in its words whether a job was started (an agent that is not
told may start the work again, or report work that never ran) and carries
``structuredContent = {"error": {code, message, started, ...}}`` (``wire.ToolErrorBody``),
``code`` being the HTTP API's error code. ``started`` is false, or null when a start
failed in a way that leaves it unknown; the text then says how to find out safely.
The task requests answer the same words as a JSON-RPC error (``-32602`` for an id that
does not resolve, with the error object as ``data``), so a pruned task reads as a
pruned job does through ``get_job``.
"""

from __future__ import annotations

import re
from typing import Any

import mcp_types as types
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST

from reconciler.agent_tools.wording import in_mcp_terms
from reconciler.core import errors

START = "start_job"
# Errors that are the service's state, not the caller's: nothing was half-written.
TRANSIENT = (errors.StorageError, errors.ServiceError, errors.RemoteError)
CALLER = (
    errors.InvalidRequest,
    errors.NotFound,
    errors.Conflict,
    errors.AuthenticationFailed,
    errors.PermissionDenied,
    errors.QuotaExceeded,
)
_SAID = re.compile(r"nothing was (stored|started)|no new job was started", re.IGNORECASE)
UNKNOWN_START = (
    "It is not known whether the job was started: call start_job again with the same "
    "idempotency_key and request, which answers with the job if it was started and starts "
    "it if not (without an idempotency_key, look for it with list_jobs first)."
)


def _advice(tool: str, exc: errors.ReconcilerError) -> str:
    if isinstance(exc, errors.Gone):
        if tool == START:
            return ""  # the refusal itself says that nothing started and to use a new key
        return "To run the work again, call start_job with a new idempotency_key."
    if isinstance(exc, errors.NotFound):
        return "Check the id; list_jobs lists your jobs (another token's jobs are not visible)."
    if isinstance(exc, errors.InvalidRequest):
        return f"Fix the arguments and call {tool} again."
    if isinstance(exc, errors.QuotaExceeded) and exc.retry_after_seconds:
        return f"Call {tool} again in {exc.retry_after_seconds} s."
    return ""


def refusal(tool: str, exc: errors.ReconcilerError) -> tuple[str, dict[str, Any]]:
    """The text and the ``{error: ...}`` object of ``tool`` refused with ``exc``."""
    message = in_mcp_terms(exc.message).rstrip(".")
    started: bool | None = False
    if isinstance(exc, TRANSIENT):
        text = f"{tool} could not be completed right now ({message})."
        if tool == START:
            started = None
            text += " " + UNKNOWN_START
        else:
            text += " Nothing was started or changed, and nothing was lost."
        text += f" Call {tool} again in a few seconds."
    else:
        text = " ".join(part for part in (f"{tool}: {message}.", _advice(tool, exc)) if part)
        if not _SAID.search(text):
            text += " Nothing was started." if tool == START else " Nothing was started or changed."
    error: dict[str, Any] = {"code": exc.code, "message": text, "started": started}
    if isinstance(exc, errors.QuotaExceeded) and exc.retry_after_seconds:
        error["retry_after_seconds"] = exc.retry_after_seconds
    return text, {"error": error}


def tool_error(tool: str, exc: errors.ReconcilerError) -> types.CallToolResult:
    text, structured = refusal(tool, exc)
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structured_content=structured,
        is_error=True,
    )


def task_error(request: str, exc: errors.ReconcilerError) -> MCPError:
    """A task request refused: SEP-2663's codes, the tools' words and error object."""
    text, structured = refusal(request, exc)
    if isinstance(exc, errors.NotFound):
        return MCPError(INVALID_PARAMS, f"Failed to retrieve task: {text}", structured)
    if isinstance(exc, errors.InvalidRequest):
        return MCPError(INVALID_PARAMS, f"Invalid params: {text}", structured)
    if isinstance(exc, TRANSIENT):
        return MCPError(INTERNAL_ERROR, text, structured)
    return MCPError(INVALID_REQUEST, text, structured)
