"""What agents and operators send: the create, cancel and decision bodies, the list filter,
and the MCP tools' arguments.

Each model is the one description of its shape: the API validates with it, the OpenAPI
document and the MCP tools' input schemas are generated from it. What depends on the
running service (its providers, its wait cap, the callback URL's address) is checked
after validation by the caller, with the service's settings.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from reconciler.core.states import State
from reconciler.core.vocabulary import DecisionAction
from reconciler.wire.fields import (
    CallbackUrl,
    CancelReason,
    DecisionNote,
    IdempotencyKey,
    JsonObject,
    Metadata,
    PositiveCount,
    PositiveSeconds,
    ProviderName,
    problem,
)

MAX_PAGE = 200  # the most operations one page holds (``reconciler ops list`` too)
DEFAULT_PAGE = 50
WAIT_CAP = "wait_max_seconds"  # validation context: the service's long-poll cap

STRICT = ConfigDict(strict=True, extra="forbid", frozen=True)


def _absent_not_null(schema: dict[str, Any]) -> None:
    """An optional field is left out, never sent as null: its schema says only what it is
    (null would read as its default, which is the provider's value, not null)."""
    branch = next(b for b in schema.pop("anyOf") if b.get("type") != "null")
    schema.pop("default", None)
    schema.update(branch)


OPTIONAL = _absent_not_null


class _CreateFields(BaseModel):
    model_config = STRICT

    provider: ProviderName = Field(
        description="The `name` of a provider, as the list of providers gives it."
    )
    request: JsonObject = Field(
        description="The job's parameters, matching the provider's `request_schema` (a "
        "request that does not is refused, naming the field); sent to the provider as they "
        "are."
    )
    idempotency_key: IdempotencyKey | None = Field(
        default=None,
        json_schema_extra=OPTIONAL,
        description="Names this piece of work; the same key and request always return the "
        "same job (marked `replayed`), so a retry never starts a second one.",
    )
    deadline_seconds: PositiveSeconds | None = Field(
        default=None,
        json_schema_extra=OPTIONAL,
        description="How long to wait for the job, in seconds. Default: the provider's "
        "`max_deadline_seconds`, which is also the most allowed. When it passes, waiting "
        "stops and an operator decides (extend, cancel or abandon); until then the job is "
        "NOT done and `awaiting_decision` is true.",
    )
    max_status_requests: PositiveCount | None = Field(
        default=None,
        json_schema_extra=OPTIONAL,
        description="The most status requests to spend on the job. Default: the provider's "
        "`max_status_requests`, which is also the most allowed. When they run out, an "
        "operator decides, as at the deadline.",
    )
    metadata: Metadata | None = Field(
        default=None,
        json_schema_extra=OPTIONAL,
        description="Your own notes, kept with the job (for example the task it belongs to).",
    )


# POST /v1/operations.
class CreateOperation(_CreateFields):
    """Start a job at a provider (idempotent with `idempotency_key`)."""

    callback_url: CallbackUrl | None = Field(
        default=None,
        json_schema_extra=OPTIONAL,
        description="Where the signed completion callback is sent (an http(s) URL the "
        "service's address rules allow).",
    )


# POST /v1/operations/{id}/cancel; the body is optional.
class CancelOperation(BaseModel):
    """Ask for a job to be cancelled."""

    model_config = STRICT

    reason: CancelReason | None = Field(default=None, description="Why; kept in the history.")


# POST /v1/operations/{id}/decisions (operators).
class OperatorDecision(BaseModel):
    """One of the options the open escalation offers."""

    model_config = STRICT

    action: Annotated[DecisionAction, Field(strict=False)]
    extra_seconds: PositiveSeconds | None = None
    extra_status_requests: PositiveCount | None = None
    note: DecisionNote | None = Field(
        default=None,
        json_schema_extra=OPTIONAL,
        description="Why the operator decided so; kept with the decision in the history.",
    )

    @model_validator(mode="after")
    def _amounts_only_for_extend(self) -> OperatorDecision:
        if self.action is not DecisionAction.EXTEND and (
            self.extra_seconds or self.extra_status_requests
        ):
            raise problem("'extra_seconds' and 'extra_status_requests' apply only to 'extend'")
        return self


class OperationFilter(BaseModel):
    """Which of your jobs to list, newest first, a page at a time."""

    model_config = STRICT

    state: Annotated[State, Field(strict=False)] | None = Field(
        default=None, description="Only jobs in this state.", json_schema_extra=OPTIONAL
    )
    provider: str | None = Field(
        default=None, description="Only jobs at this provider.", json_schema_extra=OPTIONAL
    )
    done: bool | None = Field(
        default=None,
        json_schema_extra=OPTIONAL,
        description="false: jobs that are not done (running, or awaiting an operator's "
        "decision); true: finished jobs. Default false unless `state` or "
        "`awaiting_decision` is given.",
    )
    awaiting_decision: bool | None = Field(
        default=None,
        description="true: only the jobs waiting for an operator's decision.",
        json_schema_extra=OPTIONAL,
    )
    limit: Annotated[int, Field(ge=1, le=MAX_PAGE)] = Field(
        default=DEFAULT_PAGE, description="How many jobs a page holds at most."
    )
    cursor: str | None = Field(
        default=None,
        description="The `next_cursor` of the previous page, for the next one.",
        json_schema_extra=OPTIONAL,
    )


# --- the MCP tools' arguments ------------------------------------------------------------


def _within_cap(value: float | None, info: ValidationInfo) -> float | None:
    cap = (info.context or {}).get(WAIT_CAP)
    if value is not None and cap is not None and value > cap:
        raise problem(f"must be at most {cap:g}")
    return value


WaitSeconds = Annotated[float, Field(ge=0)]


# start_job: the create body without callback_url (a tool call is answered directly),
# and a wait before the answer.
class StartJob(_CreateFields):
    """Start a job at a provider, and wait a little for its answer if asked to."""

    wait_seconds: WaitSeconds | None = Field(
        default=None,
        description="Wait up to this long (seconds) for the job to be done before answering; "
        "the answer comes sooner when it is done, refused, or awaiting a decision.",
        json_schema_extra=OPTIONAL,
    )

    _cap = field_validator("wait_seconds")(_within_cap)

    def create(self) -> CreateOperation:
        """The create body this call stands for (its fields are validated already)."""
        return CreateOperation.model_construct(**self.model_dump(exclude={"wait_seconds"}))


# get_job, cancel_job.
class JobId(BaseModel):
    """One of your jobs."""

    model_config = STRICT

    id: str = Field(
        min_length=1, description="The job's id (`op_...`), as start_job or list_jobs gave it."
    )


class WaitJob(JobId):
    """One of your jobs, waited on for up to `timeout_seconds`."""

    timeout_seconds: WaitSeconds | None = Field(
        default=None,
        description="How long to wait at most (seconds). The answer comes sooner when the "
        "job is done, when a decision becomes pending, or when a pending decision is made.",
        json_schema_extra=OPTIONAL,
    )

    _cap = field_validator("timeout_seconds")(_within_cap)


# list_providers.
class NoArguments(BaseModel):
    """No arguments."""

    model_config = STRICT
