"""The MCP server of the agent tools (the SDK's low-level ``Server``), over any ``Backend``.

Every tool answers with the Operation (or a page of job summaries, or the providers) as
``structuredContent`` and, as text, what an agent acts on (``agent_tools.answer_text``),
worded for the tools (``wait_job`` where the HTTP API says ``GET .../wait``). Guarantee: a
call that cannot be carried out is a tool error (``isError``) whose text says what to fix
and whether anything was started, with the same as ``{error: ...}`` structured content
(``agent_tools.refusals``); a job that ended without a usable outcome is answered as a tool
error too. Protocol errors are left for malformed JSON-RPC only. Clients that declare the
tasks extension on a modern (2026-07-28) request get ``start_job`` as a task
(``agent_tools.tasks``) unless the job is done by the time it answers, answered by
``tasks/get`` and ``tasks/cancel``.

The one input rule of every door holds here too: an argument or a task id holding
text no database can store (NUL, a lone surrogate) is a tool error, or ``-32602``
for a task request, naming the field, before any lookup. A quota refusal is a tool
error that says when to call again.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import Field

from reconciler import __version__
from reconciler.agent_tools.answer_text import no_outcome, operation_text
from reconciler.agent_tools.backends import Backend, View
from reconciler.agent_tools.definitions import TASKS, ToolName, ToolSet
from reconciler.agent_tools.job_summary import job_summary, page_text
from reconciler.agent_tools.refusals import CALLER, TRANSIENT, task_error, tool_error
from reconciler.agent_tools.request_summary import field_lines, request_summary
from reconciler.agent_tools.tasks import TASKS_EXTENSION, task_status, task_view
from reconciler.agent_tools.wording import Door, said_for
from reconciler.commands.agent_actions import operation_id
from reconciler.core import errors
from reconciler.core.operation_view import as_replayed
from reconciler.core.strict_json import require_text, visible
from reconciler.wire import JobId, OperationFilter, StartJob, WaitJob

log = logging.getLogger("reconciler.mcp")

BackendFor = Callable[[ServerRequestContext[Any, Any]], Backend]


def tool_message(view: Mapping[str, Any]) -> str:
    """The Operation's message, its next step named as a tool call."""
    return said_for(Door.TOOL, str(view["message"]), str(view["id"]))


def operation_result(view: Mapping[str, Any]) -> types.CallToolResult:
    """What wait_job, get_job, start_job and cancel_job answer; also a finished task's result."""
    view = visible(view)  # stored text no encoder can write is shown escaped, never an error
    shown = {**view, "message": tool_message(view)}
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=operation_text(shown))],
        structured_content=shown,
        is_error=no_outcome(view),
    )


def _page_result(page: View, query: OperationFilter) -> types.CallToolResult:
    page = visible(page)
    jobs = [job_summary(op) for op in page["operations"]]
    cursor = page.get("next_cursor")
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=page_text(jobs, cursor, query))],
        structured_content={"operations": jobs, "next_cursor": cursor},
    )


def _seconds(value: Any) -> str:
    return f"{value:g} s" if isinstance(value, int | float) else "not set"


def _provider_lines(p: Mapping[str, Any], same_as: str | None) -> list[str]:
    """``same_as``: an earlier provider whose request fields are these; not listed again."""
    head = f"- {p['name']}" + (f" (preset {p['preset']})" if p.get("preset") else "")
    lines = [head + f": {p.get('description') or 'no description'}"]
    schema = p.get("request_schema")
    if same_as is not None:
        lines.append(f"  request: the same request_schema as {same_as}, fields and all")
    else:
        lines.append("  request: " + request_summary(schema))
        lines += [f"    {line}" for line in field_lines(schema)]
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
    lines: list[str] = []
    described: dict[str, str] = {}  # a schema (as JSON) -> the first provider listing it
    for p in providers["providers"]:
        schema = p.get("request_schema")
        key = json.dumps(schema, sort_keys=True) if isinstance(schema, dict) else None
        lines += _provider_lines(p, described.get(key) if key else None)
        if key:
            described.setdefault(key, str(p["name"]))
    text = (
        "Providers you can start jobs at (start_job's `request` must match the provider's "
        "`request_schema`; each field of it is listed with what it does):\n" + "\n".join(lines)
        if lines
        else "No providers."
    )
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], structured_content=providers
    )


def tasks_declared(ctx: ServerRequestContext[Any, Any]) -> bool:
    """SEP-2663: a task only for a modern request that declared the extension itself."""
    caps = ctx.session.client_capabilities
    return (
        ctx.protocol_version in MODERN_PROTOCOL_VERSIONS
        and caps is not None
        and caps.extensions is not None
        and TASKS_EXTENSION in caps.extensions
    )


def _task(view: View, now: datetime, *, result_type: str) -> dict[str, Any]:
    # A working task carries no result: it is polled every few seconds, and building the
    # whole answer (its result rows included) each time would be work thrown away.
    wire = (
        {}
        if task_status(view) == "working"
        else operation_result(view).model_dump(by_alias=True, mode="json", exclude_none=True)
    )
    said = said_for(Door.TASK, str(visible(str(view["message"]))), str(view["id"]))
    return task_view(view, said, wire, now, result_type=result_type)


class TaskIdParams(types.RequestParams):
    task_id: str = Field(alias="taskId")


class TaskUpdateParams(TaskIdParams):
    input_responses: dict[str, Any] = Field(alias="inputResponses", default_factory=dict)


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
        except CALLER + TRANSIENT as exc:
            known = params.name in {t.value for t in ToolName}
            return tool_error(params.name if known else "the tool call", exc)

    async def _run(self, ctx: ServerRequestContext[Any, Any], tool: ToolName, args: Any) -> Any:
        backend = self.backend_for(ctx)
        if isinstance(args, StartJob):
            view = await backend.start(args.create())
            if args.wait_seconds and not view["done"] and not view["awaiting_decision"]:
                waited = await backend.wait(view["id"], args.wait_seconds)
                view = as_replayed(waited) if view["replayed"] else waited
            if tasks_declared(ctx) and not view["done"]:
                # The operation is stored: tasks/get for this id resolves from now on. A job
                # done already is answered as it is: a task would only cost a tasks/get.
                return _task(view, backend.now(), result_type="task")
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
        backend = self.backend_for(ctx)
        try:
            view = await backend.get(operation_id(params.task_id, "taskId"))
        except errors.ReconcilerError as exc:
            raise task_error("tasks/get", exc) from None
        return _task(view, backend.now(), result_type="complete")

    async def tasks_cancel(
        self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams
    ) -> dict[str, Any]:
        """Records the cancel intent (as cancel_job) and answers with the task as it stands."""
        backend = self.backend_for(ctx)
        try:
            view = await backend.cancel(operation_id(params.task_id, "taskId"))
        except errors.ReconcilerError as exc:
            raise task_error("tasks/cancel", exc) from None
        return _task(view, backend.now(), result_type="complete")

    async def tasks_update(
        self, ctx: ServerRequestContext[Any, Any], params: TaskUpdateParams
    ) -> dict[str, Any]:
        # No task of ours ever asks for input; the id is still checked (and its owner).
        try:
            await self.backend_for(ctx).get(operation_id(params.task_id, "taskId"))
        except errors.ReconcilerError as exc:
            raise task_error("tasks/update", exc) from None
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
