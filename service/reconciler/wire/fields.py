"""The value types of the wire models, each refusing with the words ``problems`` reports.

A refusal the plain pydantic types cannot word as we want is a ``problem``: a custom
error whose text is the message's tail ("must be greater than 0"), so the one mapping
function (``problems.invalid_request``) never needs to know which type raised it.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field
from pydantic_core import PydanticCustomError

from reconciler.core.canonical import canonical_json

PROBLEM = "wire_problem"  # ctx problem: the tail of the message, after the field's name
MAX_PROVIDER_NAME = 100
MAX_KEY_LENGTH = 200
MAX_CALLBACK_URL = 2048
MAX_CANCEL_REASON = 500
MAX_DECISION_NOTE = 500
MAX_METADATA_BYTES = 16_384


def problem(text: str) -> PydanticCustomError:
    return PydanticCustomError(PROBLEM, "{problem}", {"problem": text})


def _not_blank(value: str) -> str:
    if not value.strip():
        raise problem("must not be empty")
    return value


def _plain_text(value: str) -> str:
    # A note is read on a page and printed in a terminal: no control character but the
    # line break and the tab may ride along (an escape sequence would drive the terminal).
    if any(not c.isprintable() and c not in "\n\t" for c in value):
        raise problem("must be plain text: no control characters but line breaks and tabs")
    return value


def _finite(value: float) -> float:
    # JSON cannot say infinity; a caller in this process can.
    if not math.isfinite(value):
        raise problem("must be greater than 0")
    return value


def _whole(value: Any) -> Any:
    """12.0 is the whole number 12; 2.5 is not one. Anything else is the int type's to refuse."""
    if isinstance(value, float):
        if not value.is_integer():
            raise problem("must be a whole number")
        return int(value)
    return value


def _metadata_size(value: dict[str, Any]) -> dict[str, Any]:
    if len(canonical_json(value).encode()) > MAX_METADATA_BYTES:
        raise problem(f"must be at most {MAX_METADATA_BYTES} bytes as JSON")
    return value


def _text(max_length: int) -> Any:
    # The pattern says "not only whitespace" to other validators; ours is ``_not_blank``.
    return Field(min_length=1, max_length=max_length, pattern=r"\S")


# Text of 1 to N characters, not only whitespace.
_NOT_BLANK = AfterValidator(_not_blank)
ProviderName = Annotated[str, _text(MAX_PROVIDER_NAME), _NOT_BLANK]
IdempotencyKey = Annotated[str, _text(MAX_KEY_LENGTH), _NOT_BLANK]
CallbackUrl = Annotated[str, _text(MAX_CALLBACK_URL), _NOT_BLANK]
CancelReason = Annotated[str, _text(MAX_CANCEL_REASON), _NOT_BLANK]
DecisionNote = Annotated[str, _text(MAX_DECISION_NOTE), _NOT_BLANK, AfterValidator(_plain_text)]
PositiveSeconds = Annotated[float, Field(gt=0), AfterValidator(_finite)]
PositiveCount = Annotated[int, Field(gt=0), BeforeValidator(_whole)]
JsonObject = dict[str, Any]
Metadata = Annotated[JsonObject, AfterValidator(_metadata_size)]


def _instant(value: str) -> str:
    try:
        datetime.fromisoformat(value)
    except ValueError:
        raise problem("must be an ISO 8601 date and time") from None
    return value


# Answers carry times as text (``core.clock.isoformat``); the model checks that they parse.
Timestamp = Annotated[
    str, Field(json_schema_extra={"format": "date-time"}), AfterValidator(_instant)
]
