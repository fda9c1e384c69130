"""The completion callback the service sends to an agent's ``callback_url`` (signed)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from reconciler.wire.answers import Operation

COMPLETED = "operation.completed"


class CallbackEvent(BaseModel):
    """``{"type": "operation.completed", "operation": ...}``: the operation at its end."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    type: Literal["operation.completed"]
    operation: Operation
