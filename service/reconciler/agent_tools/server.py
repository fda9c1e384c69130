"""The MCP server of the agent tools (the SDK's low-level ``Server``), over any ``Backend``.

Every tool answers with the Operation (or a page, or the providers) as
``structuredContent`` and its ``message`` as text, worded for the tools
(``wait_job`` where the HTTP API says ``GET .../wait``). Guarantee: a call that
cannot be carried out is a tool error (``isError``) whose text says what to fix;
protocol errors are left for malformed JSON-RPC only. Clients that declare the
tasks extension on a modern (2026-07-28) request get ``start_job`` as a task
(``agent_tools.tasks``), answered by ``tasks/get`` and ``tasks/cancel``.

The one input rule of every door holds here too: an argument or a task id holding
text no database can store (NUL, a lone surrogate) is a tool error, or ``-32602``
for a task request, naming the field, before any lookup. A quota refusal is a tool
error that says when to call again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import Field

from reconciler import __version__
from reconciler.agent_tools.backends import Backend, View
from reconciler.agent_tools.definitions import TASKS, ToolName, ToolSet
from reconciler.agent_tools.request_summary import request_summary
from reconciler.agent_tools.tasks import TASKS_EXTENSION, task_view
from reconciler.commands.agent_actions import operation_id
from reconciler.core import errors
from reconciler.core.operation_view import DECISION_HINT, WAIT_HINT, as_replayed
from reconciler.core.strict_json import require_text, visible
from reconciler.wire import JobId, OperationFilter, StartJob, WaitJob

log = logging.getLogger("reconciler.mcp")

BackendFor = Callable[[ServerRequestContext[Any, Any]], Backend]
# Errors that are the service's state, not the caller's: nothing was half-written.
_TRANSIENT = (errors.StorageError, errors.ServiceError, errors.RemoteError)
_CALLER = (
    errors.InvalidRequest,
    errors.NotFound,
    errors.Conflict,
    errors.AuthenticationFailed,
    errors.PermissionDenied,
    errors.QuotaExceeded,
)


def tool_message(view: Mapping[str, Any]) -> str:
    """The Operation's message, its next step named as a tool call."""
    message = str(view["message"])
    op_id = view["id"]
    return message.replace(
        WAIT_HINT.replace("{id}", op_id),
        f'Wait with wait_job(id="{op_id}"); it waits on the server.',
    ).replace(
        DECISION_HINT.replace("{id}", op_id),
        f'wait_job(id="{op_id}") returns as soon as the decision is made.',
    )


def operation_result(view: Mapping[str, Any]) -> types.CallToolResult:
    view = visible(view)  # stored text no encoder can write is shown escaped, never an error
    text = tool_message(view)
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structured_content={**view, "message": text},
    )


def _scope(query: OperationFilter) -> str:
    if query.awaiting_decision:
        return " that await an operator's decision"
    if query.done is False:
        return " that are not done"
    return " that are done" if query.done else ""


def _line(op: Mapping[str, Any]) -> str:
    line = f"- {op['id']} at {op['provider']}: {op['state']}, done={op['done']}"
    if op.get("awaiting_decision"):
        line += ", awaiting an operator's decision"
    return line


def _page_result(page: View, query: OperationFilter) -> types.CallToolResult:
    page = visible(page)
    ops = [{**op, "message": tool_message(op)} for op in page["operations"]]
    scope = _scope(query)
    if not ops:
        lines = [f"You have no jobs{scope}."]
    else:
        lines = [f"{len(ops)} of your jobs{scope}, newest first:"]
    lines += [_line(op) for op in ops]
    waiting = sum(1 for op in ops if op.get("awaiting_decision"))
    if waiting and not query.awaiting_decision:
        lines.append(
            f"Awaiting an operator's decision: {waiting} of them. Tell your user; wait_job "
            "returns as soon as the decision is made."
        )
    if page.get("next_cursor"):
        lines.append(f'More: call list_jobs with cursor="{page["next_cursor"]}".')
    return types.CallToolResult(
        content=[types.TextContent(type="text", text="\n".join(lines))],
        structured_content={"operations": ops, "next_cursor": page.get("next_cursor")},
    )


def _seconds(value: Any) -> str:
    return f"{value:g} s" if isinstance(value, int | float) else "not set"


def _provider_lines(p: Mapping[str, Any]) -> list[str]:
    head = f"- {p['name']}" + (f" (preset {p['preset']})" if p.get("preset") else "")
    lines = [head + f": {p.get('description') or 'no description'}"]
    lines.append("  request: " + request_summary(p.get("request_schema")))
    if p.get("set_by_service"):
        lines.append(
            f"  request must NOT hold (the service sets them): {', '.join(p['set_by_service'])}"
        )
    deadline = _seconds(p.get("max_deadline_seconds"))
    budget = p.get("max_status_requests")
    lines.append(
        f"  deadline_seconds: {deadline} by default, and at most {deadline}; "
        f"max_status_requests: {budget} by default, and at most {budget}; can cancel: "
        + ("yes" if p.get("can_cancel") else "no")
    )
    return lines


def _providers_result(providers: View) -> types.CallToolResult:
    lines = [line for p in providers["providers"] for line in _provider_lines(p)]
    text = (
        "Providers you can start jobs at (start_job's `request` must match the provider's "
        "`request_schema`):\n" + "\n".join(lines)
        if lines
        else "No providers."
    )
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], structured_content=providers
    )


def tool_error(tool: str, exc: errors.ReconcilerError) -> types.CallToolResult:
    if isinstance(exc, _TRANSIENT):
        text = (
            f"{tool} could not be completed right now ({exc.message}); nothing was lost. "
            f"Call {tool} again in a few seconds."
        )
    elif isinstance(exc, errors.Gone):
        text = (
            f"{tool}: {exc.message}. That job ended long ago; nothing was started again. A new "
            "job needs a new idempotency_key."
        )
    elif isinstance(exc, errors.NotFound):
        text = (
            f"{tool}: {exc.message}. Check the id; list_jobs lists your jobs "
            "(another token's jobs are not visible)."
        )
    elif isinstance(exc, errors.InvalidRequest):
        text = f"{tool}: {exc.message}. Fix the arguments and call {tool} again."
    elif isinstance(exc, errors.QuotaExceeded):
        after = exc.retry_after_seconds
        text = f"{tool}: {exc.message}." + (f" Call {tool} again in {after} s." if after else "")
    else:
        text = f"{tool}: {exc.message}"
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


def tasks_declared(ctx: ServerRequestContext[Any, Any]) -> bool:
    """SEP-2663: a task only for a modern request that declared the extension itself."""
    caps = ctx.session.client_capabilities
    return (
        ctx.protocol_version in MODERN_PROTOCOL_VERSIONS
        and caps is not None
        and caps.extensions is not None
        and TASKS_EXTENSION in caps.extensions
    )


def _task(view: View, *, result_type: str) -> dict[str, Any]:
    result = operation_result(view)
    wire = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    return task_view(view, tool_message(view), wire, result_type=result_type)


class TaskIdParams(types.RequestParams):
    task_id: str = Field(alias="taskId")


class TaskUpdateParams(TaskIdParams):
    input_responses: dict[str, Any] = Field(alias="inputResponses", default_factory=dict)


def _task_error(exc: errors.ReconcilerError) -> MCPError:
    if isinstance(exc, errors.InvalidRequest):
        return MCPError(code=INVALID_PARAMS, message=f"Invalid params: {exc.message}")
    if isinstance(exc, errors.NotFound):
        return MCPError(code=INVALID_PARAMS, message="Failed to retrieve task: Task not found")
    if isinstance(exc, errors.Conflict):
        return MCPError(code=INVALID_REQUEST, message=exc.message)
    if isinstance(exc, _TRANSIENT):
        return MCPError(code=INTERNAL_ERROR, message=f"try again shortly: {exc.message}")
    return MCPError(code=INVALID_REQUEST, message=exc.message)


class ToolServer:
    """The tool calls and task requests of one server, dispatched to a backend per request."""

    def __init__(self, toolset: ToolSet, backend_for: BackendFor) -> None:
        self.toolset, self.backend_for = toolset, backend_for

    async def list_tools(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=list(self.toolset.tools))

    async def call_tool(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> Any:
        arguments = dict(params.arguments or {})
        try:
            require_text(arguments)
            tool, args = self.toolset.check(params.name, arguments)
            return await self._run(ctx, tool, args)
        except _CALLER + _TRANSIENT as exc:
            known = params.name in {t.value for t in ToolName}
            return tool_error(params.name if known else "the tool call", exc)

    async def _run(self, ctx: ServerRequestContext[Any, Any], tool: ToolName, args: Any) -> Any:
        backend = self.backend_for(ctx)
        if isinstance(args, StartJob):
            view = await backend.start(args.create())
            if tasks_declared(ctx):
                # The operation is stored: tasks/get for this id resolves from now on.
                return _task(view, result_type="task")
            if args.wait_seconds and not view["done"] and not view["awaiting_decision"]:
                waited = await backend.wait(view["id"], args.wait_seconds)
                view = as_replayed(waited) if view["replayed"] else waited
            return operation_result(view)
        if isinstance(args, WaitJob):
            timeout = args.timeout_seconds
            wait = self.toolset.default_wait() if timeout is None else timeout
            return operation_result(await backend.wait(args.id, wait))
        if isinstance(args, JobId):
            if tool is ToolName.CANCEL_JOB:
                return operation_result(await backend.cancel(args.id))
            return operation_result(await backend.get(args.id))
        if isinstance(args, OperationFilter):
            query = args
            if not {"done", "state", "awaiting_decision"} & args.model_fields_set:
                # What an agent that lost its context looks for: the jobs not done yet.
                query = args.model_copy(update={"done": False})
            return _page_result(await backend.list(query), query)
        return _providers_result(await backend.providers())

    async def tasks_get(
        self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams
    ) -> dict[str, Any]:
        try:
            view = await self.backend_for(ctx).get(operation_id(params.task_id, "taskId"))
        except errors.ReconcilerError as exc:
            raise _task_error(exc) from None
        return _task(view, result_type="complete")

    async def tasks_cancel(
        self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams
    ) -> dict[str, Any]:
        try:
            await self.backend_for(ctx).cancel(operation_id(params.task_id, "taskId"))
        except errors.ReconcilerError as exc:
            raise _task_error(exc) from None
        return {"resultType": "complete"}

    async def tasks_update(
        self, ctx: ServerRequestContext[Any, Any], params: TaskUpdateParams
    ) -> dict[str, Any]:
        # No task of ours ever asks for input; the id is still checked (and its owner).
        try:
            await self.backend_for(ctx).get(operation_id(params.task_id, "taskId"))
        except errors.ReconcilerError as exc:
            raise _task_error(exc) from None
        return {"resultType": "complete"}


INSTRUCTIONS = (
    "Long-running jobs at remote providers. Call list_providers first: each provider's "
    "`request_schema` says what start_job's `request` must hold. A started job is NOT done "
    "until `done` is true; `awaiting_decision: true` means an operator of this service must "
    "decide (tell your user; wait_job returns as soon as the decision is made). Call "
    "list_jobs at the start of a run to find jobs started earlier. " + TASKS
)


def build_server(toolset: ToolSet, backend_for: BackendFor, name: str = "reconciler") -> Server:
    tools = ToolServer(toolset, backend_for)
    server: Server = Server(
        name,
        version=__version__,
        instructions=INSTRUCTIONS,
        on_list_tools=tools.list_tools,
        on_call_tool=tools.call_tool,
        get_tool_input_schema=toolset.input_schema,
    )
    server.add_request_handler("tasks/get", TaskIdParams, tools.tasks_get)
    server.add_request_handler("tasks/cancel", TaskIdParams, tools.tasks_cancel)
    server.add_request_handler("tasks/update", TaskUpdateParams, tools.tasks_update)
    # tasks/result stays unregistered: SEP-2663 removed it (the SDK answers -32601).
    server.extensions[TASKS_EXTENSION] = {}
    # No tracing exporter is configured; without the default middleware each message
    # skips a span that would be dropped anyway.
    server.middleware = []
    return server
