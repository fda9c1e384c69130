"""``reconciler.client``: the agent API from Python, for agents and their tools.

Needs only httpx and the standard library (no web server, no database driver)::

    from reconciler.client import Client, Outcome

    with Client("http://127.0.0.1:8080", token) as api:
        run = api.run("acme", {"report": "q3"}, max_wait=600)
        if run.outcome is Outcome.SUCCEEDED:
            ...  # run.result
        else:
            ...  # run.outcome says which of seven things happened; run.operation_id stays

Errors are the package's own families (``reconciler.core.errors``), mapped from the
answer's ``error.code``: ``InvalidRequest`` (bad input), ``NotFound`` (``Gone``: an
operation retention pruned), ``Conflict`` (``IdempotencyConflict``), ``AuthenticationFailed`` /
``PermissionDenied``, and ``ServiceError`` when the service failed or could
not be reached. ``verify_callback`` checks the completion callbacks the service
sends to an agent's receiver.
"""

from reconciler.client.aio import AsyncClient
from reconciler.client.callbacks import (
    CallbackEvent,
    MemorySeenStore,
    ReplayGuard,
    SeenStore,
    verify_callback,
)
from reconciler.client.model import (
    Budget,
    CancelRefusal,
    Escalation,
    EscalationOption,
    HistoryEntry,
    Operation,
    OperationError,
    Outcome,
    Page,
    Progress,
    Provider,
    RunResult,
    outcome_of,
)
from reconciler.client.sync import Client
from reconciler.core.errors import (
    AuthenticationFailed,
    Conflict,
    Gone,
    IdempotencyConflict,
    InvalidRequest,
    NotFound,
    PermissionDenied,
    ReconcilerError,
    ServiceError,
    SignatureRejected,
)

__all__ = [
    "AsyncClient",
    "AuthenticationFailed",
    "Budget",
    "CallbackEvent",
    "CancelRefusal",
    "Client",
    "Conflict",
    "Escalation",
    "EscalationOption",
    "Gone",
    "HistoryEntry",
    "IdempotencyConflict",
    "InvalidRequest",
    "MemorySeenStore",
    "NotFound",
    "Operation",
    "OperationError",
    "Outcome",
    "Page",
    "PermissionDenied",
    "Progress",
    "Provider",
    "ReconcilerError",
    "ReplayGuard",
    "RunResult",
    "SeenStore",
    "ServiceError",
    "SignatureRejected",
    "outcome_of",
    "verify_callback",
]
