"""An operator's decision as the console, the CLI and the API receive it."""

from __future__ import annotations

from typing import Any

from reconciler.core.operator_decision import DecisionRequest
from reconciler.core.strict_json import require_text
from reconciler.wire.problems import validated
from reconciler.wire.requests import OperatorDecision


def parse_decision(body: Any) -> DecisionRequest:
    if isinstance(body, dict):
        require_text(body)
    decision = validated(OperatorDecision, body)
    return DecisionRequest(
        action=decision.action,
        extra_seconds=decision.extra_seconds,
        extra_status_requests=decision.extra_status_requests,
        note=decision.note,
    )
