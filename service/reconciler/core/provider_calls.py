"""What one request to a provider came to, and what a fetched result's check found.

Values the adapters (``providers``) produce and the pure decisions (``core.collect``,
``core.poll``) read, so they live here and the decisions need nothing of the adapters.

``unstorable_in`` is the intake check of every answer a step receives
(docs/design.md#provider-text): a string no database can store (a NUL, a lone
surrogate) anywhere in what the answer says (its JSON body, JSON Lines, the headers the
service records, the values an adapter read out of it) makes the whole answer a
contract violation, found the same way whatever the backend.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, BinaryIO

from reconciler.core.clock import isoformat
from reconciler.core.errors import InvalidRequest
from reconciler.core.strict_json import escaped, first_unstorable, is_storable, parse_json
from reconciler.core.vocabulary import TransportError

# In JSON text a NUL or a surrogate can only be written as an escape (a raw NUL is no
# valid JSON, and no valid UTF-8 encodes a surrogate): a body without a NUL escape or a
# lone surrogate escape is clean, which spares walking (and parsing on the loop) a large
# result. Escapes are read left to right so that an escaped backslash cannot fake one,
# and a valid pair (an emoji written as ASCII) is no suspect; a hit is looked at exactly.
_ESCAPES = re.compile(
    rb"\\\\"  # an escaped backslash
    rb"|\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}"  # a surrogate pair
    rb"|\\u(?:0000|[dD][89a-fA-F][0-9a-fA-F]{2})"  # a NUL, or a lone surrogate
)


def _suspect(data: bytes) -> bool:
    # Only the last alternative matches six bytes.
    return any(len(m[0]) == 6 for m in _ESCAPES.finditer(data))


# What a call keeps of the answer's head (the rest of CallResult is ours).
_RECORDED_HEADERS = ("retry_after", "location", "content_type", "provider_request_id")


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
    # The provider's credential could not be obtained and its source refused: nothing was
    # sent (``refused`` says why); the operation escalates ``authorization_denied``.
    credential_refused: bool = False
    # An answer refused the credential, a fresh one was obtained and the call sent again:
    # this is the second answer.
    credential_renewed: bool = False
    # An answer refused the credential and a fresh one could not be obtained: why.
    credential_problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.http_status is not None and 200 <= self.http_status < 300

    @property
    def answered(self) -> bool:
        return self.http_status is not None

    @property
    def denied(self) -> bool:
        """This service's credential was refused: by the provider (401/403, not a spent rate
        limit), or by its own source (``credential_refused``)."""
        if self.credential_refused:
            return True
        return self.http_status in (401, 403) and not self.rate_limited


def answer_words(call: CallResult) -> str:
    """What a call came to, in a few words: ``HTTP 422``, ``no answer (timeout)``, or
    ``not sent (why)``."""
    if call.http_status is not None:
        return f"HTTP {call.http_status}"
    if call.transport_error is not None:
        return f"no answer ({call.transport_error.value})"
    return f"not sent ({call.refused})"


def call_detail(call: CallResult) -> dict[str, Any]:
    """What a history entry keeps of a provider call: metadata, never credentials."""
    detail: dict[str, Any] = {"method": call.method, "target": call.target}
    if call.http_status is not None:
        detail["http_status"] = call.http_status
    if call.transport_error is not None:
        detail["transport_error"] = call.transport_error.value
    if call.refused:
        detail["refused"] = call.refused
    if call.provider_request_id:
        detail["provider_request_id"] = call.provider_request_id
    if call.retry_after:
        detail["retry_after"] = call.retry_after
    if call.credential_renewed:
        detail["credential_renewed"] = True
    if call.credential_problem:
        detail["credential_problem"] = call.credential_problem
    # When we sent it, apart from when the answer was written: what the deadline and the
    # budget are judged against, however long the provider or the network took.
    detail["sent_at"] = isoformat(call.sent_at)
    detail["elapsed_ms"] = round(call.elapsed_ms, 1)
    return detail


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


@dataclass(frozen=True)
class Unstorable:
    """Where an answer holds text no database can store, and that text, escaped."""

    where: str
    shown: str

    def describe(self) -> str:
        return f'{self.where}: "{self.shown}"'


def unstorable_in(answer: Any) -> Unstorable | None:
    """The first value of a provider's answer no database can store, or None.

    ``answer`` is what an adapter returned: a ``CallResult``, or an outcome (a dataclass)
    holding one as ``call`` beside the values read from it.
    """
    if isinstance(answer, CallResult):
        return _in_call(answer)
    if not dataclasses.is_dataclass(answer) or isinstance(answer, type):
        return None
    for item in dataclasses.fields(answer):
        found = _in_field(item.name, getattr(answer, item.name))
        if found is not None:
            return found
    return None


def _in_field(name: str, value: Any) -> Unstorable | None:
    if isinstance(value, CallResult):
        return _in_call(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        inner = unstorable_in(value)
        return None if inner is None else Unstorable(f"{name}.{inner.where}", inner.shown)
    if isinstance(value, tuple):
        value = list(value)  # what an outcome holds as a tuple is walked like a list
    if not isinstance(value, str | dict | list):
        return None
    hit = first_unstorable(value)
    if hit is None:
        return None
    pointer, shown = hit
    return Unstorable(name if pointer == "/" else f"{name} at {pointer}", shown)


def _in_call(call: CallResult) -> Unstorable | None:
    for name in _RECORDED_HEADERS:
        value = getattr(call, name)
        if isinstance(value, str) and not is_storable(value):
            return Unstorable(f"the {name.replace('_', '-')} header", escaped(value))
    data = call.body_bytes
    if data is not None and not _suspect(data):
        return None  # the body (or its lines) was parsed from these bytes: nothing to find
    if call.body is not None:
        hit = first_unstorable(call.body)
        return Unstorable(f"the body at {hit[0]}", hit[1]) if hit is not None else None
    if data is not None:
        # A result's bytes are scanned apart from the call (``providers.result_scan``): one
        # JSON document (pretty-printed or not), else JSON Lines.
        try:
            whole = parse_json(data, "the body")
        except InvalidRequest:
            return _in_lines(data)
        hit = first_unstorable(whole)
        return Unstorable(f"the body at {hit[0]}", hit[1]) if hit is not None else None
    return None


def _in_lines(data: bytes) -> Unstorable | None:
    """A body read as JSON Lines (a result file): the first line holding such text."""
    for number, raw in enumerate(data.splitlines(), start=1):
        if not _suspect(raw):
            continue
        try:
            value = parse_json(raw, f"line {number}")
        except InvalidRequest:
            continue  # not JSON: the result's own check reports it, nothing is kept of it
        hit = first_unstorable(value)
        if hit is not None:
            return Unstorable(f"line {number} at {hit[0]}", hit[1])
    return None
