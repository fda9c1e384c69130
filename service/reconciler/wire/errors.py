"""The error body every refusal carries: ``{"error": {"code", "message"}}``."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

_SHAPE = ConfigDict(strict=True, extra="forbid", frozen=True)


class ErrorDetail(BaseModel):
    model_config = _SHAPE

    code: str = Field(description="Stable and machine-readable (`invalid_request`, ...).")
    message: str = Field(description="What went wrong and what to fix.")


class ErrorBody(BaseModel):
    model_config = _SHAPE

    error: ErrorDetail


class ToolErrorDetail(ErrorDetail):
    """A refused MCP tool call: the HTTP API's error, and whether a job was started."""

    started: bool | None = Field(
        description="false: no job was started; null: not known (call start_job again with "
        "the same idempotency_key: it answers with the job if there is one)."
    )
    retry_after_seconds: int | None = Field(
        default=None, description="When to call again, for a quota refusal."
    )


class ToolErrorBody(BaseModel):
    model_config = _SHAPE

    error: ToolErrorDetail
