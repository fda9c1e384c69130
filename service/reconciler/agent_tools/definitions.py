"""The six MCP tools: names, descriptions written for a model, input and output schemas.

Shared by the in-app server (``/mcp``) and the stdio proxy (``reconciler mcp``),
so both offer exactly the same tools. Both schemas are generated from the wire
models (``reconciler.wire``): a tool answers with the same Operation the HTTP API
does, and its arguments are the model its schema is made from. Guarantee: the
arguments are validated once, as that model, before anything runs, and a mismatch
is a message naming the field, in the HTTP API's words.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import mcp_types as types
from pydantic import BaseModel

from reconciler.core.errors import InvalidRequest
from reconciler.core.strict_json import shown
from reconciler.wire import (
    JobId,
    JobSummaryPage,
    NoArguments,
    Operation,
    OperationFilter,
    ProviderList,
    StartJob,
    WaitJob,
    validated,
)
from reconciler.wire.requests import WAIT_CAP
from reconciler.wire.schemas import model_schema, with_values

DEFAULT_WAIT_SECONDS = 30.0
MAX_MESSAGE = 300


class ToolName(StrEnum):
    START_JOB = "start_job"
    GET_JOB = "get_job"
    WAIT_JOB = "wait_job"
    CANCEL_JOB = "cancel_job"
    LIST_JOBS = "list_jobs"
    LIST_PROVIDERS = "list_providers"


NOT_DONE = (
    "`done: false` means the job is NOT finished: never report it as a success and never use "
    "its result."
)
DECISION = (
    "`awaiting_decision: true` means waiting stopped and an operator of this service must "
    "decide (the message names the options); you cannot decide it: tell your user, and call "
    "wait_job to learn the outcome, which it returns as soon as the decision is made."
)
TASKS = (
    "A client that declares the MCP tasks extension (io.modelcontextprotocol/tasks, protocol "
    "2026-07-28) gets start_job answered as a task whose `taskId` is the job's `id` (unless "
    "the job is done by then: that is answered as it is): poll tasks/get at its "
    "`pollIntervalMs` (a few seconds at most) until the task is completed (its result is "
    "what wait_job answers for the job, `isError: true` for one that did not succeed) or "
    "cancelled; tasks/cancel asks the provider to cancel and answers the task as it stands. "
    "A task stays working while an operator's decision is pending, and its status message "
    "says so."
)
REFUSED = (
    "A call that cannot be carried out is a tool error whose text says what to fix; its "
    "`error.code` names the reason and `error.started` says whether a job was started."
)


def _descriptions(cap: float) -> dict[ToolName, str]:
    return {
        ToolName.START_JOB: (
            "Start a long-running job at a provider and return its Operation right away. "
            "A started job is NOT done: " + NOT_DONE + " Next, call wait_job with the returned "
            "`id`: it waits on the server, so one call replaces a polling loop. With "
            f"`wait_seconds` (at most {cap:g}) this call first waits up to that long and "
            "answers as soon as the job is done, refused or awaiting a decision. `request` "
            "must match the provider's `request_schema` (list_providers shows it): a request "
            "that does not is refused at once, naming the field, and nothing is stored. A "
            'request the provider itself refuses ends failed with `error.code` "request_rejected": '
            "nothing ran; fix `request` and start again with a new `idempotency_key`. Give an "
            "`idempotency_key` that names this piece of work: calling start_job again with "
            "the same key and request returns the same job (with `replayed: true`) instead of "
            "starting a second one, so retrying after an error or a lost answer is safe. "
            + REFUSED
            + " "
            + TASKS
        ),
        ToolName.GET_JOB: (
            "Read one of your jobs by `id`, without waiting. "
            + NOT_DONE
            + " "
            + DECISION
            + " To wait for the job, call wait_job rather than calling get_job again and "
            "again; if you do check with get_job, leave at least `poll_after_seconds` between "
            "calls."
        ),
        ToolName.WAIT_JOB: (
            "Wait on the server for one of your jobs, for up to `timeout_seconds` "
            f"(default {min(DEFAULT_WAIT_SECONDS, cap):g}, at most {cap:g}). Returns the "
            "Operation as soon as `done` is true, when the job starts awaiting an operator's "
            "decision, when that decision is made, or at the timeout. "
            + NOT_DONE
            + " "
            + DECISION
            + " Otherwise, with `done: false`, call wait_job again with the same "
            "`id` right away (the waiting happens on the server), or keep the `id` and check "
            "back later. When `done` is true, `state` says what happened: succeeded (the "
            "answer's text holds the result, or its size and summary when large), "
            "completed_with_errors (read the result's summary and failed items before "
            'reporting), failed (read `error`; `error.code` "request_rejected" means the '
            "provider refused the request and nothing ran), cancelled, result_unavailable or "
            "result_validation_failed (the job finished but its result could not be used). "
            "result_timed_out and cancellation_unconfirmed are ends only once an operator "
            "gave up the waiting (`done: true`: the job's outcome is not known); while "
            "`awaiting_decision` is true they are NOT finished. A job that ended without a "
            "usable outcome (failed, result_timed_out, result_unavailable, "
            "result_validation_failed, cancellation_unconfirmed) is answered with "
            "`isError: true`; the answer is still the job."
        ),
        ToolName.CANCEL_JOB: (
            "Ask the provider to cancel one of your jobs. This records the request: the job is "
            "NOT cancelled until the provider confirms it, and it may still finish. The "
            "answer usually shows `cancel_requested: true`; call wait_job to learn the final "
            "state. A job that is done is not changed, and neither is the decision an "
            "operator owes on a job with `awaiting_decision: true`."
        ),
        ToolName.LIST_JOBS: (
            "List your jobs, newest first. With no arguments it lists the jobs that are NOT "
            "done yet (running, or awaiting an operator's decision): call it at the start of "
            "every run to find work started earlier, because an `id` mentioned long ago in a "
            "conversation may be lost. `awaiting_decision: true` lists exactly the jobs an "
            "operator must decide; filter also with `state`, `provider` or `done` (true: "
            "finished jobs). Each job is in brief (its state, times, idempotency_key, result "
            "size and summary, error code; no result rows): get_job gives a job whole. A "
            "`state` or `provider` that does not exist is an error, not an empty list. For "
            "the next page pass `cursor` = the previous answer's `next_cursor`."
        ),
        ToolName.LIST_PROVIDERS: (
            "List the providers you can start jobs at: each one's `name`, a `description`, "
            "the `request_schema` that start_job's `request` must match (null: any object; "
            "the text answer names its required fields and then every field with what it "
            "does), the pointers in `set_by_service` "
            "that your `request` must NOT hold (the service writes them), `can_cancel` "
            "(whether its jobs can be cancelled), `max_deadline_seconds` (the "
            "`deadline_seconds` a job gets when start_job names none, and the most it may "
            "name), `max_status_requests` (the same for the status-request budget) and the "
            "`preset` it is configured from (null: none)."
        ),
    }


def _hints(
    title: str, *, read_only: bool, destructive: bool = False, open_world: bool = False
) -> types.ToolAnnotations:
    return types.ToolAnnotations(
        title=title,
        read_only_hint=read_only,
        destructive_hint=None if read_only else destructive,
        # Cancelling twice is cancelling once; a start is idempotent only with its key.
        idempotent_hint=None if read_only else destructive,
        open_world_hint=open_world,
    )


# start_job and cancel_job reach the provider (an open world); cancel_job may end work.
ANNOTATIONS: dict[ToolName, types.ToolAnnotations] = {
    ToolName.START_JOB: _hints("Start a job", read_only=False, open_world=True),
    ToolName.GET_JOB: _hints("Read a job", read_only=True),
    ToolName.WAIT_JOB: _hints("Wait for a job", read_only=True),
    ToolName.CANCEL_JOB: _hints("Cancel a job", read_only=False, destructive=True, open_world=True),
    ToolName.LIST_JOBS: _hints("List your jobs", read_only=True),
    ToolName.LIST_PROVIDERS: _hints("List the providers", read_only=True),
}


ARGUMENTS: dict[ToolName, type[BaseModel]] = {
    ToolName.START_JOB: StartJob,
    ToolName.GET_JOB: JobId,
    ToolName.WAIT_JOB: WaitJob,
    ToolName.CANCEL_JOB: JobId,
    ToolName.LIST_JOBS: OperationFilter,
    ToolName.LIST_PROVIDERS: NoArguments,
}
ANSWERS: dict[ToolName, type[BaseModel]] = {
    ToolName.START_JOB: Operation,
    ToolName.GET_JOB: Operation,
    ToolName.WAIT_JOB: Operation,
    ToolName.CANCEL_JOB: Operation,
    ToolName.LIST_JOBS: JobSummaryPage,
    ToolName.LIST_PROVIDERS: ProviderList,
}
# The one value the models cannot know: this service's long-poll cap.
_CAPPED = {ToolName.START_JOB: "wait_seconds", ToolName.WAIT_JOB: "timeout_seconds"}


def input_schema(name: ToolName, cap: float) -> dict[str, Any]:
    schema = model_schema(ARGUMENTS[name])
    if name in _CAPPED:
        # 30, not 30.0: the number is quoted back to the model as it reads it.
        maximum = int(cap) if float(cap).is_integer() else cap
        schema = with_values(schema, {_CAPPED[name]: {"maximum": maximum}})
    return schema


@dataclass(frozen=True)
class ToolSet:
    """The tools of one server; ``wait_max_seconds`` is its long-poll cap."""

    wait_max_seconds: float
    tools: tuple[types.Tool, ...]

    def input_schema(self, name: str) -> Mapping[str, Any] | None:
        for tool in self.tools:
            if tool.name == name:
                return tool.input_schema
        return None

    def check(self, name: str, arguments: Mapping[str, Any]) -> tuple[ToolName, BaseModel]:
        """The tool and its arguments as its model, or ``InvalidRequest`` saying what to fix."""
        try:
            tool = ToolName(name)
        except ValueError:
            known = ", ".join(t.value for t in ToolName)
            raise InvalidRequest(
                f"there is no tool {shown(name)!r}; the tools are: {known}"
            ) from None
        try:
            args = validated(
                ARGUMENTS[tool],
                dict(arguments),
                what="the arguments",
                unknown="argument",
                context={WAIT_CAP: self.wait_max_seconds},
            )
        except InvalidRequest as exc:
            text = exc.message
            raise InvalidRequest(
                text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 1] + "…"
            ) from None
        return tool, args

    def default_wait(self) -> float:
        return min(DEFAULT_WAIT_SECONDS, self.wait_max_seconds)


def build_tools(wait_max_seconds: float) -> ToolSet:
    """The tools for a service whose long-polls are capped at ``wait_max_seconds``."""
    descriptions = _descriptions(wait_max_seconds)
    tools = tuple(
        types.Tool(
            name=name.value,
            description=descriptions[name],
            input_schema=input_schema(name, wait_max_seconds),
            output_schema=model_schema(ANSWERS[name]),
            annotations=ANNOTATIONS[name],
        )
        for name in ToolName
    )
    return ToolSet(wait_max_seconds, tools)
