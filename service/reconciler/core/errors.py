"""Every error the package raises on purpose: one root, families under it.

```text
ReconcilerError                    root; ``code`` is the stable machine-readable name
├── ConfigError                    a configuration or provider file is unusable (CLI exit 2)
│   └── PointerSyntaxError         a JSON pointer in a provider file is not RFC 6901
├── InvalidRequest                 bad input: the message says what to fix          (400)
│   ├── PayloadTooLarge            a body over its limit                             (413)
│   ├── UnsupportedMediaType       a body that is not declared as JSON               (415)
│   ├── ForbiddenAddress           a callback URL the SSRF guard refuses             (400)
│   ├── UnstorableContent          verified content no database can store (a webhook: 400, so
│   │                              the sender stops retrying what can never succeed)
│   └── UnsafePathValue            a value that cannot be placed in a URL path       (400)
├── AuthenticationFailed           no, or a bad, bearer token                        (401)
│   └── SignatureRejected          a webhook that fails verification; nothing stored (401)
├── PermissionDenied               a valid token without the needed scope            (403)
├── NotFound                       no such record, or not the caller's               (404)
│   └── Gone                       an operation retention pruned: its id, or a retry of its
│                                  key and request inside the tombstone window        (410)
├── Conflict                       contradicts what is already recorded              (409)
│   ├── IdempotencyConflict        the same idempotency key for another request
│   └── DecisionNotAllowed         an option that was not offered, or a second decision
├── QuotaExceeded                  an agent's operations in flight or create rate     (429)
├── ClientDisconnected             the client went away before its body arrived (logged at info)
├── RemoteError                    a provider or an agent's receiver gave no usable answer
│   ├── ResolutionFailed           a callback host did not resolve (a later try may work)
│   ├── CredentialUnavailable      the provider's credential could not be obtained: refused
│   │                              (authorization_denied) or not now (a later try may work)
│   └── UnstorableAnswer           a provider's answer holds text no database can store: the
│                                  operation escalates contract_violation
├── ServiceError                   reconciler.client: the service answered 5xx or was unreachable
├── StorageError                   the database, not the caller                      (503)
│   ├── StorageUnavailable         unreachable, busy past the bound, disk full, read-only
│   └── StaleWrite                 another writer moved the row first; nothing was written
├── DemoFailed                     the demo could not set itself up
└── Bug                            a defect in this program, never the caller's fault (500)
    ├── IllegalTransition          a state change the transition table forbids; nothing written
    └── InvalidObservation         an observation with neither an HTTP status nor an error
```

HTTP answers are decided in one place (``inbound.errors``) from this tree, and
``reconciler.client`` maps them back: an answer's ``error.code`` raises the class
of that code here (``InvalidRequest``, ``NotFound``, ``Conflict``,
``AuthenticationFailed``/``PermissionDenied``), a server failure ``ServiceError``,
so a caller catches the same families on both sides of the wire. A ``Bug``
is logged as an error with the operation it concerns and answered 500; a
client's conflict is decided before any transition is attempted, so a caller
never sees a bug dressed as a 409.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class ReconcilerError(Exception):
    """Root of every error the package raises on purpose."""

    code = "internal"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ConfigError(ReconcilerError):
    """A configuration or provider file is unusable; the message names file, key and problem."""

    code = "config_invalid"


class PointerSyntaxError(ConfigError):
    """The pointer text is not an RFC 6901 pointer; the loader names the file and key."""

    code = "invalid_pointer"


class InvalidRequest(ReconcilerError):
    """The caller sent something we cannot act on; the message says what to fix."""

    code = "invalid_request"


class PayloadTooLarge(InvalidRequest):
    code = "payload_too_large"


class UnsupportedMediaType(InvalidRequest):
    """A body whose Content-Type is not JSON (``application/json`` or ``*/*+json``)."""

    code = "unsupported_media_type"


class ForbiddenAddress(InvalidRequest):
    """The callback URL leads to an address the SSRF guard refuses."""

    code = "callback_url_forbidden"

    def __init__(self, message: str, verdict: Any) -> None:
        super().__init__(message)
        self.verdict = verdict  # an ``outbound.address_classes.Verdict``: which address, and why


class UnstorableContent(InvalidRequest):
    """Content that cannot be stored as text (a lone surrogate, a NUL character)."""

    code = "content_unstorable"


class UnsafePathValue(InvalidRequest):
    """A value cannot be placed in a URL path safely (empty, ``.`` or ``..`` segment)."""


class AuthenticationFailed(ReconcilerError):
    code = "unauthenticated"


class RejectReason(StrEnum):
    """Why a webhook delivery was refused; safe to use as a metric label."""

    MISSING_HEADER = "missing_header"
    MALFORMED_HEADER = "malformed_header"
    TIMESTAMP_OUT_OF_TOLERANCE = "timestamp_out_of_tolerance"
    NO_USABLE_SIGNATURE = "no_usable_signature"
    SIGNATURE_MISMATCH = "signature_mismatch"
    REPLAYED = "replayed"  # a delivery seen before (agents' callback receivers)


class SignatureRejected(AuthenticationFailed):
    """A delivery failed verification; ``reason`` is machine-readable, the message short."""

    code = "signature_invalid"

    def __init__(self, reason: RejectReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class PermissionDenied(ReconcilerError):
    code = "forbidden"


class NotFound(ReconcilerError):
    code = "not_found"


class Gone(NotFound):
    """The operation existed and finished, and retention removed it; its tombstone says so.

    A retry of its idempotency key and request gets this too (never a second job)."""

    code = "operation_pruned"


class Conflict(ReconcilerError):
    """The request contradicts what is already recorded."""

    code = "conflict"


class IdempotencyConflict(Conflict):
    code = "idempotency_key_reused"


class DecisionNotAllowed(Conflict):
    code = "decision_not_allowed"


class QuotaExceeded(ReconcilerError):
    """An agent reached one of its quotas; ``retry_after_seconds`` says when one frees."""

    code = "quota_exceeded"

    def __init__(self, message: str, retry_after_seconds: int | None = None) -> None:
        super().__init__(message)
        self.retry_after_seconds = retry_after_seconds


class ClientDisconnected(ReconcilerError):
    """The client closed the connection before its request body was complete: no answer."""

    code = "client_disconnected"


class RemoteError(ReconcilerError):
    """A provider or an agent's callback receiver could not be used."""

    code = "remote_unavailable"


class ResolutionFailed(RemoteError):
    """The callback host could not be resolved now; a later attempt may succeed."""

    code = "callback_host_unresolved"


class CredentialUnavailable(RemoteError):
    """The provider's credential could not be obtained, so the call was not sent.

    ``refused``: the source said no (a token endpoint's ``invalid_client``, no credential
    anywhere in the chain): the operation escalates ``authorization_denied``. Otherwise a
    later try may work (the endpoint was unreachable) and the call counts as undelivered.
    The message names the source and the cause, never a secret.
    """

    code = "credential_unavailable"

    def __init__(self, message: str, *, refused: bool) -> None:
        super().__init__(message)
        self.refused = refused


class UnstorableAnswer(RemoteError):
    """A provider's answer holds text no database can store (a NUL, a lone surrogate).

    Raised where a step receives the answer (``StepContext.call``), before any of it is
    kept; the worker escalates ``contract_violation`` with ``where`` and ``shown`` (the
    value escaped) and ``call`` (the request's ``CallResult``) as evidence.
    """

    code = "provider_answer_unstorable"

    def __init__(self, call_name: str, where: str, shown: str, call: Any) -> None:
        super().__init__(
            f"the provider's {call_name} answer holds text no database can store "
            f'({where}: "{shown}")'
        )
        self.call_name = call_name
        self.where = where
        self.shown = shown
        self.call = call


class ServiceError(ReconcilerError):
    """The service failed or could not be reached; ``status`` is its HTTP status, if any.

    Raised by ``reconciler.client``; the caller did nothing wrong and may retry later.
    """

    code = "service_unavailable"

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class StorageError(ReconcilerError):
    """The database failed us; the caller did nothing wrong and may retry."""

    code = "storage_error"


class StorageUnavailable(StorageError):
    """The database could not be reached or refused the write; callers should retry."""

    code = "storage_unavailable"


class WriteCycle(StorageUnavailable):
    """PostgreSQL failed the transaction to break a lock cycle (a deadlock) or a
    serialization conflict: nothing of it was written, and it may simply run again. Not
    an outage of the database."""


class StaleWrite(StorageError):
    """Another writer changed the record first (version or lease moved). Nothing was written."""

    code = "stale_write"


class DemoFailed(ReconcilerError):
    """The demo could not set itself up or talk to its own parts."""

    code = "demo_failed"


class Bug(ReconcilerError):
    """A defect in this program. Logged as an error with the operation id; never a 4xx."""

    code = "internal"


class IllegalTransition(Bug):
    """A state change that the transition table does not allow. Nothing was written."""

    code = "illegal_transition"


class InvalidObservation(Bug):
    """An observation with neither an HTTP status nor a transport error: a shell bug."""

    code = "invalid_observation"
