"""What one request to a provider came to, and what a fetched result's check found.

Values the adapters (``providers``) produce and the pure decisions (``core.collect``,
``core.poll``) read, so they live here and the decisions need nothing of the adapters.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, BinaryIO

from reconciler.core.vocabulary import TransportError


@dataclass(frozen=True)
class CallResult:
    """One request to a provider and what came back. Holds no credentials.

    Exactly one of these holds: ``http_status`` is set (the provider answered),
    ``transport_error`` is set (no HTTP answer), or ``refused`` is set (the adapter
    sent nothing because the input was unusable, e.g. a job ID with ``..``).
    ``maybe_delivered`` is False only when the provider certainly did not get the
    request (DNS, refused or failed connection, TLS handshake, a refusal): a create
    that failed that way is safe to repeat and is not ambiguous.
    """

    method: str
    target: str  # path (or, for a foreign result URL, the URL) the request went to
    sent_at: datetime
    elapsed_ms: float
    http_status: int | None = None
    transport_error: TransportError | None = None
    transport_detail: str | None = None
    refused: str | None = None
    maybe_delivered: bool = True
    retry_after: str | None = None
    location: str | None = None
    content_type: str | None = None
    content_length: int | None = None
    provider_request_id: str | None = None
    body: Any = None
    body_bytes: bytes | None = field(default=None, repr=False)
    # A result too large to hold in memory: an open, unnamed file the collect step reads
    # off the event loop and closes (``body_bytes`` is None then).
    body_file: BinaryIO | None = field(default=None, repr=False, compare=False)
    parse_error: str | None = None
    too_large: bool = False
    rate_limited: bool = False  # a 429, or a 403 that says the rate limit is spent

    @property
    def ok(self) -> bool:
        return self.http_status is not None and 200 <= self.http_status < 300

    @property
    def answered(self) -> bool:
        return self.http_status is not None


@dataclass(frozen=True)
class ResultCheck:
    """Validation of a fetched result; ``problems`` empty means it may be consumed."""

    document: Any
    problems: tuple[str, ...]
    summary: dict[str, Any] = field(default_factory=dict)
    failed_items: tuple[Any, ...] = ()
    sha256: str | None = None
    size: int | None = None
    failed_total: int | None = None  # all failed items; ``failed_items`` may hold the first

    @property
    def ok(self) -> bool:
        return not self.problems
