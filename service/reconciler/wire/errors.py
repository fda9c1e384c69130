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
