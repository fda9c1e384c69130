"""One exception root for the package, with families under it.

HTTP handlers map these to status codes in one place (``http_errors``); no
other module decides how a domain error looks on the wire.
"""

from __future__ import annotations


class ReconcilerError(Exception):
    """Root of every error the package raises on purpose."""

    code = "internal"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ConfigError(ReconcilerError):
    """A configuration or provider file is unusable; the message names file, key and problem."""

    code = "config_invalid"


class InvalidRequest(ReconcilerError):
    """The caller sent something we cannot act on; the message says what to fix."""

    code = "invalid_request"


class AuthenticationFailed(ReconcilerError):
    code = "unauthenticated"


class PermissionDenied(ReconcilerError):
    code = "forbidden"


class NotFound(ReconcilerError):
    code = "not_found"


class Conflict(ReconcilerError):
    """The request contradicts what is already recorded."""

    code = "conflict"


class IdempotencyConflict(Conflict):
    code = "idempotency_key_reused"


class DecisionNotAllowed(Conflict):
    code = "decision_not_allowed"


class IllegalTransition(ReconcilerError):
    """A state change that the transition table does not allow. Nothing was written."""

    code = "illegal_transition"


class StaleWrite(ReconcilerError):
    """Another writer changed the record first (version or lease moved). Nothing was written."""

    code = "stale_write"


class StorageUnavailable(ReconcilerError):
    """The database could not be reached or refused the write; callers should retry."""

    code = "storage_unavailable"


class PayloadTooLarge(InvalidRequest):
    code = "payload_too_large"


class SignatureInvalid(ReconcilerError):
    code = "signature_invalid"
