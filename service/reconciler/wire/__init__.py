"""One model per wire shape: what agents send, what the service answers, what it calls back.

Pydantic v2 models, strict and closed (``extra="forbid"``). From them come the
request validation of every door (``problems.validated``: one function words every
refusal), the OpenAPI components and the MCP tools' schemas (``schemas``). Imports
pydantic and ``reconciler.core`` only: the API, the console, the tools and the
commands all import their request types from here.
"""

from reconciler.wire.answers import (
    Budget,
    Escalation,
    EscalationOption,
    History,
    HistoryEntry,
    JobSummary,
    JobSummaryPage,
    Operation,
    OperationPage,
    Provider,
    ProviderList,
    WebhookSettings,
)
from reconciler.wire.decisions import parse_decision
from reconciler.wire.errors import ErrorBody, ErrorDetail, ToolErrorBody, ToolErrorDetail
from reconciler.wire.events import CallbackEvent
from reconciler.wire.fields import (
    MAX_CALLBACK_URL,
    MAX_CANCEL_REASON,
    MAX_KEY_LENGTH,
    MAX_METADATA_BYTES,
    MAX_PROVIDER_NAME,
)
from reconciler.wire.problems import invalid_request, validated
from reconciler.wire.requests import (
    DEFAULT_PAGE,
    MAX_PAGE,
    CancelOperation,
    CreateOperation,
    JobId,
    NoArguments,
    OperationFilter,
    OperatorDecision,
    StartJob,
    WaitJob,
)

__all__ = [
    "DEFAULT_PAGE",
    "MAX_CALLBACK_URL",
    "MAX_CANCEL_REASON",
    "MAX_KEY_LENGTH",
    "MAX_METADATA_BYTES",
    "MAX_PAGE",
    "MAX_PROVIDER_NAME",
    "Budget",
    "CallbackEvent",
    "CancelOperation",
    "CreateOperation",
    "ErrorBody",
    "ErrorDetail",
    "Escalation",
    "EscalationOption",
    "History",
    "HistoryEntry",
    "JobId",
    "JobSummary",
    "JobSummaryPage",
    "NoArguments",
    "Operation",
    "OperationFilter",
    "OperationPage",
    "OperatorDecision",
    "Provider",
    "ProviderList",
    "StartJob",
    "ToolErrorBody",
    "ToolErrorDetail",
    "WaitJob",
    "WebhookSettings",
    "invalid_request",
    "parse_decision",
    "validated",
]
