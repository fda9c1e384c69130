"""What the service answers: the Operation and its parts, pages, the history, the providers.

The Operation's key set is stated here once: ``core.operation_view`` builds it, the OpenAPI
document and the MCP tools' output schemas are generated from it, and the client's
typed ``Operation`` is tested against it.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from reconciler.core.signatures import WebhookScheme
from reconciler.core.states import State
from reconciler.core.vocabulary import DecisionAction, DelaySource, EscalationReason, HistoryKind
from reconciler.wire.fields import JsonObject, Timestamp

# Answers are read from JSON, where an enum is its value: not strict about the enum type.
ANSWER = ConfigDict(strict=True, extra="forbid", frozen=True, use_enum_values=True)


def _word(enum: Any) -> Any:
    return Annotated[enum, Field(strict=False)]


class Budget(BaseModel):
    """Status requests spent on the job so far, and the most it may spend."""

    model_config = ANSWER

    status_requests_used: int
    max_status_requests: int


class EscalationOption(BaseModel):
    """One decision an operator may take; amounts only for `extend`."""

    model_config = ANSWER

    action: _word(DecisionAction)  # type: ignore[valid-type]
    description: str
    extra_seconds: float | None = None
    extra_status_requests: int | None = None


class Escalation(BaseModel):
    """Why waiting stopped and what an operator may decide; `decided` once they did."""

    model_config = ANSWER

    reason: _word(EscalationReason)  # type: ignore[valid-type]
    message: str
    options: list[EscalationOption]
    created_at: Timestamp
    decided: bool
    decision: JsonObject | None


Count = float | int | None


class Progress(BaseModel):
    """How far the job got, as the provider reports it."""

    model_config = ANSWER

    completed: Count = Field(description="Items finished, when the provider counts them.")
    total: Count = Field(description="Items in all, when the provider counts them.")
    detail: Any = Field(description="The provider's own progress value, as it sent it.")


class OperationError(BaseModel):
    """Why the job did not succeed, in one shape whatever the provider sent."""

    model_config = ANSWER

    code: str = Field(
        description="Machine-readable: `request_rejected` (the provider refused the request; "
        "nothing ran), `provider_failed`, `expired`, `result_unavailable`, `result_invalid`, "
        "`abandoned_<reason>`, ..."
    )
    message: str = Field(description="What happened, in plain words.")
    http_status: int | None = Field(
        description="The provider's HTTP status, when one of its answers is the reason."
    )
    provider_message: str | None = Field(description="The provider's own words, one line.")
    detail: JsonObject | None = Field(
        description="Everything else that was kept (the provider's error body, ...)."
    )


class CancelRefusal(BaseModel):
    """The provider's refusal of the last cancel: the job was NOT cancelled and goes on."""

    model_config = ANSWER

    http_status: int | None = Field(description="The provider's HTTP status for the cancel.")
    provider_message: str | None = Field(description="The provider's own words, one line.")
    at: Timestamp


class Operation(BaseModel):
    """One job: where it stands, whether it is done, and what to do next."""

    model_config = ANSWER

    id: str = Field(pattern="^op_")
    provider: str
    state: _word(State) = Field(  # type: ignore[valid-type]
        description="Where the job stands. `result_timed_out` and `cancellation_unconfirmed` "
        "are final only when `done` is true: while `awaiting_decision` is true an operator "
        "may still reopen them."
    )
    done: bool = Field(
        description="True only when nothing more will happen without a new request. False "
        "while the job runs and while an operator's decision is pending."
    )
    awaiting_decision: bool = Field(
        description="True while waiting has stopped and an operator of this service must "
        "decide (see `escalation`); the job is then NOT done."
    )
    replayed: bool = Field(
        description="True when a start named an earlier job's `idempotency_key` and request: "
        "this is that job, and no new one was started."
    )
    remote_job_id: str | None
    remote_state: str | None
    message: str = Field(description="What the state means and what to do next.")
    poll_after_seconds: float | None
    progress: Progress | None
    deadline_at: Timestamp
    budget: Budget
    result: JsonObject | None
    error: OperationError | None
    escalation: Escalation | None
    idempotency_key: str | None
    trace_id: str
    callback_url: str | None
    metadata: JsonObject | None
    created_at: Timestamp
    updated_at: Timestamp
    done_at: Timestamp | None = Field(
        description="When the job ended; null while it runs and while an operator's decision "
        "is pending."
    )
    cancel_requested: bool
    cancel_refused: CancelRefusal | None = Field(
        description="Set when the provider refused the last cancel (the job was NOT "
        "cancelled); a new cancel may be asked for."
    )


class ResultBrief(BaseModel):
    """A job's result in brief: its size and the provider's summary, never its rows."""

    model_config = ANSWER

    size: int | None = Field(description="Bytes of the result document (null: not known).")
    summary: Any = Field(description="The provider's summary of the result (null: none).")


class JobSummary(BaseModel):
    """One job in a list: where it stands, without its result rows (get_job has those)."""

    model_config = ANSWER

    id: str = Field(pattern="^op_")
    provider: str
    state: _word(State) = Field(  # type: ignore[valid-type]
        description="Where the job stands; final only when `done` is true."
    )
    done: bool = Field(description="True only when nothing more will happen to the job.")
    awaiting_decision: bool = Field(
        description="True while an operator of this service must decide; the job is NOT done."
    )
    cancel_requested: bool
    idempotency_key: str | None
    created_at: Timestamp
    updated_at: Timestamp
    deadline_at: Timestamp
    done_at: Timestamp | None = Field(
        description="When the job ended; null while it runs or awaits a decision."
    )
    result: ResultBrief | None
    error_code: str | None = Field(description="`error.code` of a job that did not succeed.")


class JobSummaryPage(BaseModel):
    """A page of job summaries, newest first; `next_cursor` continues it (null: the last)."""

    model_config = ANSWER

    operations: list[JobSummary]
    next_cursor: str | None


class OperationPage(BaseModel):
    """A page of jobs, newest first; `next_cursor` continues it (null: the last page)."""

    model_config = ANSWER

    operations: list[Operation]
    next_cursor: str | None


class HistoryEntry(BaseModel):
    """One transition or observation, in the order it was recorded."""

    model_config = ANSWER

    seq: int
    at: Timestamp
    kind: _word(HistoryKind)  # type: ignore[valid-type]
    actor: str
    from_state: str | None = Field(alias="from")
    to_state: str | None = Field(alias="to")
    cause: str
    delay_source: _word(DelaySource) | None  # type: ignore[valid-type]
    detail: JsonObject | None
    hash: str


class History(BaseModel):
    model_config = ANSWER

    operation_id: str
    entries: list[HistoryEntry]
    next_cursor: str | None


class WebhookSettings(BaseModel):
    """Operators only: how a provider's webhooks are verified (never a secret)."""

    model_config = ANSWER

    scheme: _word(WebhookScheme)  # type: ignore[valid-type]
    tolerance_seconds: int
    max_body_bytes: int
    event_id: str
    job_id: str
    secrets_env: str = Field(description="The variable; never its value.")
    secrets_set: bool


class Provider(BaseModel):
    """What may be started at one provider, and within which limits."""

    model_config = ANSWER

    name: str
    preset: str | None = Field(
        description="The shipped preset the provider is configured from (null: none)."
    )
    description: str | None
    request_schema: JsonObject | None = Field(
        description="A JSON Schema that `request` must match (null: any object)."
    )
    set_by_service: list[str] = Field(
        description="JSON pointers the service writes into every `request`; a `request` that "
        "already holds one is refused."
    )
    can_cancel: bool = Field(description="Whether a started job can be asked to cancel.")
    max_deadline_seconds: float = Field(
        description="The `deadline_seconds` a job gets when its start names none, and the "
        "most it may name. At the deadline waiting stops and an operator decides (extend, "
        "cancel or abandon): the job is then NOT done until the decision."
    )
    max_status_requests: int = Field(
        description="The `max_status_requests` a job gets when its start names none, and the "
        "most it may name."
    )
    webhook: WebhookSettings | None = Field(
        default=None, description="Operators only: how this provider's webhooks are verified."
    )
    webhook_trust: JsonObject | None = Field(
        default=None, description="Operators only: the provider's webhook trust."
    )


class ProviderList(BaseModel):
    """The providers jobs can be started at."""

    model_config = ANSWER

    providers: list[Provider]
