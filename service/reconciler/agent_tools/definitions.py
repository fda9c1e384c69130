"""The six MCP tools: names, descriptions written for a model, input and output schemas.

Shared by the in-app server (``/mcp``) and the stdio proxy (``reconciler mcp``),
so both offer exactly the same tools. The output schemas are the OpenAPI
document's (``api.openapi``): a tool answers with the same Operation the HTTP
API does. Guarantee: arguments are checked against the advertised input schema
before anything runs, and a mismatch is a message naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import mcp_types as types
from jsonschema import Draft202012Validator
from jsonschema import exceptions as schema_errors

from reconciler.api.openapi import OPERATION, PROVIDER_LIST
from reconciler.api.validation import MAX_KEY_LENGTH
from reconciler.core.errors import InvalidRequest
from reconciler.core.states import State
from reconciler.core.strict_json import shown
from reconciler.storage.operations import MAX_PAGE

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


def _descriptions(cap: float) -> dict[ToolName, str]:
    return {
        ToolName.START_JOB: (
            "Start a long-running job at a provider and return its Operation right away. "
            "A started job is NOT done: " + NOT_DONE + " Next, call wait_job with the returned "
            "`id`: it waits on the server, so one call replaces a polling loop. With "
            f"`wait_seconds` (at most {cap:g}) this call first waits that long for the job to "
            "finish. Give an `idempotency_key` that names this piece of work: calling "
            "start_job again with the same key and request returns the same job instead of "
            "starting a second one, so retrying after an error or a lost answer is safe. "
            "Call list_providers first to see the providers and the `request` each expects."
        ),
        ToolName.GET_JOB: (
            "Read one of your jobs by `id`, without waiting. " + NOT_DONE + " To wait for "
            "the job, call wait_job rather than calling get_job again and again; if you do "
            "check with get_job, leave at least `poll_after_seconds` between calls."
        ),
        ToolName.WAIT_JOB: (
            "Wait on the server for one of your jobs to finish, for up to `timeout_seconds` "
            f"(default {min(DEFAULT_WAIT_SECONDS, cap):g}, at most {cap:g}). Returns the "
            "Operation as soon as `done` is true, or at the timeout. If it returns with "
            "`done: false` the job is still running and NOT finished: do not report success; "
            "call wait_job again with the same `id` right away (the waiting happens on the "
            "server), or keep the `id` and check back later. If `escalation` is set, a person "
            "must decide before the job goes on: say so and stop waiting. When `done` is "
            "true, `state` says what happened: succeeded (the result is in `result`), "
            "completed_with_errors (read result.summary and result.failed_items before "
            "reporting), failed (read `error`), cancelled, or a stop an operator decides."
        ),
        ToolName.CANCEL_JOB: (
            "Ask the provider to cancel one of your jobs. This records the request: the job is "
            "NOT cancelled until the provider confirms it, and it may still finish. The "
            "answer usually shows `cancel_requested: true`; call wait_job to learn the final "
            "state."
        ),
        ToolName.LIST_JOBS: (
            "List your jobs, newest first. With no arguments it lists the jobs that are NOT "
            "done yet: call it at the start of every run to find work started earlier, "
            "because an `id` mentioned long ago in a conversation may be lost. Filter with "
            "`state`, `provider` or `done` (true: finished jobs); for the next page pass "
            "`cursor` = the previous answer's `next_cursor`."
        ),
        ToolName.LIST_PROVIDERS: (
            "List the providers you can start jobs at: each one's `name`, the `preset` it is "
            "configured from (null: none), a `description`, the `request_schema` that "
            "start_job's `request` must match (null: any object), the pointers in "
            "`set_by_service` that your `request` must NOT hold (the service writes them), "
            "whether its jobs can be cancelled, and the longest `deadline_seconds` and most "
            "`max_status_requests` start_job may ask for."
        ),
    }


def _id_schema(extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "id": {
                "type": "string",
                "minLength": 1,
                "description": "The job's id (`op_...`), as start_job or list_jobs gave it.",
            },
            **(extra or {}),
        },
        "required": ["id"],
        "additionalProperties": False,
    }


def _inputs(cap: float) -> dict[ToolName, dict[str, Any]]:
    wait = {
        "type": "number",
        "minimum": 0,
        # 30, not 30.0: the number is quoted back in messages ("greater than the maximum of 30").
        "maximum": int(cap) if float(cap).is_integer() else cap,
    }
    return {
        ToolName.START_JOB: {
            "type": "object",
            "properties": {
                "provider": {
                    "type": "string",
                    "minLength": 1,
                    "description": "A provider's `name` from list_providers.",
                },
                "request": {
                    "type": "object",
                    "description": "The job's parameters, matching the provider's "
                    "`request_schema`; sent to the provider as they are.",
                },
                "idempotency_key": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": MAX_KEY_LENGTH,
                    "description": "Names this piece of work; the same key and request "
                    "always return the same job.",
                },
                "deadline_seconds": {
                    "type": "number",
                    "exclusiveMinimum": 0,
                    "description": "Stop waiting after this long (at most the provider's "
                    "`max_deadline_seconds`).",
                },
                "max_status_requests": {"type": "integer", "minimum": 1},
                "metadata": {
                    "type": "object",
                    "description": "Your own notes, kept with the job (for example the task it "
                    "belongs to).",
                },
                "wait_seconds": {
                    **wait,
                    "description": "Wait this long for the job to finish before answering.",
                },
            },
            "required": ["provider", "request"],
            "additionalProperties": False,
        },
        ToolName.GET_JOB: _id_schema(),
        ToolName.WAIT_JOB: _id_schema(
            {
                "timeout_seconds": {
                    **wait,
                    "description": "How long to wait at most (seconds).",
                }
            }
        ),
        ToolName.CANCEL_JOB: _id_schema(),
        ToolName.LIST_JOBS: {
            "type": "object",
            "properties": {
                "state": {"type": "string", "enum": [s.value for s in State]},
                "provider": {"type": "string"},
                "done": {
                    "type": "boolean",
                    "description": "Default false (jobs still running) unless `state` is given.",
                },
                "limit": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE},
                "cursor": {"type": "string"},
            },
            "additionalProperties": False,
        },
        ToolName.LIST_PROVIDERS: {
            "type": "object",
            "properties": {},
            "additionalProperties": False,
        },
    }


PAGE: dict[str, Any] = {
    "type": "object",
    "required": ["operations", "next_cursor"],
    "properties": {
        "operations": {"type": "array", "items": OPERATION},
        "next_cursor": {"anyOf": [{"type": "string"}, {"type": "null"}]},
    },
}

_OUTPUTS: dict[ToolName, dict[str, Any]] = {
    ToolName.START_JOB: OPERATION,
    ToolName.GET_JOB: OPERATION,
    ToolName.WAIT_JOB: OPERATION,
    ToolName.CANCEL_JOB: OPERATION,
    ToolName.LIST_JOBS: PAGE,
    ToolName.LIST_PROVIDERS: PROVIDER_LIST,
}


def _field(error: schema_errors.ValidationError) -> str:
    if error.validator == "required" or not error.absolute_path:
        return "arguments"
    return "'" + ".".join(str(p) for p in error.absolute_path) + "'"


@dataclass(frozen=True)
class ToolSet:
    """The tools of one server, with their validators; ``wait_max_seconds`` is its cap."""

    wait_max_seconds: float
    tools: tuple[types.Tool, ...]
    _validators: Mapping[ToolName, Any]

    def input_schema(self, name: str) -> Mapping[str, Any] | None:
        for tool in self.tools:
            if tool.name == name:
                return tool.input_schema
        return None

    def check(self, name: str, arguments: Mapping[str, Any]) -> ToolName:
        """The tool, or ``InvalidRequest`` saying what to fix in the call."""
        try:
            tool = ToolName(name)
        except ValueError:
            known = ", ".join(t.value for t in ToolName)
            raise InvalidRequest(
                f"there is no tool {shown(name)!r}; the tools are: {known}"
            ) from None
        error = schema_errors.best_match(self._validators[tool].iter_errors(dict(arguments)))
        if error is not None:
            text = error.message
            text = text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 1] + "…"
            raise InvalidRequest(f"{_field(error)}: {text}")
        return tool

    def default_wait(self) -> float:
        return min(DEFAULT_WAIT_SECONDS, self.wait_max_seconds)


def build_tools(wait_max_seconds: float) -> ToolSet:
    """The tools for a service whose long-polls are capped at ``wait_max_seconds``."""
    descriptions, inputs = _descriptions(wait_max_seconds), _inputs(wait_max_seconds)
    tools = tuple(
        types.Tool(
            name=name.value,
            description=descriptions[name],
            input_schema=inputs[name],
            output_schema=_OUTPUTS[name],
        )
        for name in ToolName
    )
    validators = {name: Draft202012Validator(inputs[name]) for name in ToolName}
    return ToolSet(wait_max_seconds, tools, validators)
