"""Provider specs: the typed model of a ``[providers.NAME]`` table, and the secrets it names.

Guarantee: a provider is declared, not coded; secrets are never in the file,
only the names of the environment variables that hold them, read here from an
injected mapping and wrapped as ``Secret``. Parsing and validating the files is
``providers.loader``'s job; its docstring lists every key.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from reconciler.config import Secret
from reconciler.core.backoff import BackoffPolicy
from reconciler.core.signatures import WebhookScheme
from reconciler.core.trust import (
    DEFAULT_DISTRUST_AFTER_MISSES,
    DEFAULT_GRACE_SECONDS,
    DEFAULT_TRUST_AFTER,
    TRUSTED_MAX_FACTOR,
    TrustMode,
    TrustPolicy,
)
from reconciler.errors import ConfigError
from reconciler.providers.pointer import MISSING, Pointer
from reconciler.providers.request_schema import RequestSchema
from reconciler.providers.state_table import Classification, StateRule, StateTable, classify

INLINE_SOURCE = "config inline providers"
HTTP_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
JOB_ID = "job_id"
IDEMPOTENCY_KEY = "idempotency_key"
RESULT_REF = "result_ref"
ERRORS_REF = "errors_ref"
STATUS_PREFIX = "status:"
HEADER_PREFIX = "header:"


class IdempotencyMode(StrEnum):
    """How the idempotency key reaches the provider (``none``: it does not)."""

    HEADER = "header"
    PATH = "path"
    BODY = "body"
    NONE = "none"


Scalar = str | int | float | bool


@dataclass(frozen=True)
class SetRule:
    """``[create.set]``: a JSON value written at ``pointer`` in the agent's request; strings
    (also nested ones) are templates over ``{idempotency_key}`` ``{operation_id}``
    ``{trace_id}`` ``{webhook_url}``."""

    pointer: Pointer
    value: Any


@dataclass(frozen=True)
class DuplicateRule:
    """A create answer meaning "this key already made a job": settled by the lookup."""

    status: tuple[int, ...]
    body_contains: str | None = None


@dataclass(frozen=True)
class LineTest:
    """A JSONL result line is failed when the value at ``pointer`` passes this test."""

    pointer: Pointer
    present: bool | None = None
    equals: Scalar | None = None
    in_: tuple[Scalar, ...] | None = None


class AuthType(StrEnum):
    BEARER = "bearer"
    HEADER = "header"
    NONE = "none"


@dataclass(frozen=True)
class AuthSpec:
    type: AuthType = AuthType.NONE
    token_env: str | None = None  # bearer
    header_name: str | None = None  # header
    value_env: str | None = None  # header

    @property
    def env_key(self) -> tuple[str, str] | None:
        """(file key, variable name) of the credential, if any."""
        if self.type is AuthType.BEARER and self.token_env:
            return ("token_env", self.token_env)
        if self.type is AuthType.HEADER and self.value_env:
            return ("value_env", self.value_env)
        return None


@dataclass(frozen=True)
class HttpSpec:
    max_connections: int = 20
    max_keepalive_connections: int = 10
    keepalive_expiry_seconds: float = 4.0
    max_response_bytes: int = 1_048_576
    request_id_header: str | None = None


@dataclass(frozen=True)
class CreateSpec:
    path: str
    job_id: Pointer
    method: str = "POST"
    idempotency_header: str | None = None
    state: Pointer | None = None
    timeout_seconds: float = 10.0
    create_deadline_seconds: float = 120.0
    idempotency: IdempotencyMode = IdempotencyMode.HEADER
    set: tuple[SetRule, ...] = ()
    duplicate: DuplicateRule | None = None


@dataclass(frozen=True)
class LookupSpec:
    path: str
    job_id: Pointer
    method: str = "GET"
    timeout_seconds: float = 10.0
    items: Pointer | None = None
    match: tuple[tuple[Pointer, str], ...] = ()
    pages: int = 1
    next: Pointer | None = None
    next_param: str | None = None
    has_more: Pointer | None = None


@dataclass(frozen=True)
class StatusSpec:
    path: str
    state: Pointer
    method: str = "GET"
    rules: tuple[StateRule, ...] = ()
    job_id: Pointer | None = None
    poll_after_seconds: Pointer | None = None
    next_check_at: Pointer | None = None
    expires_at: Pointer | None = None
    error: Pointer | None = None
    progress: Pointer | None = None
    result_ref: Pointer | None = None
    required: tuple[Pointer, ...] = ()
    not_found_grace_seconds: float = 30.0
    timeout_seconds: float = 10.0
    errors_ref: Pointer | None = None


@dataclass(frozen=True)
class CancelSpec:
    path: str
    method: str = "POST"
    timeout_seconds: float = 10.0
    cancel_deadline_seconds: float = 120.0


@dataclass(frozen=True)
class SourcedPointer:
    """A pointer into the result document, or (``status:`` prefix) into the final status body."""

    source: Literal["result", "status"]
    pointer: Pointer

    def resolve(self, result: Any, status_body: Any) -> Any:
        return self.pointer.resolve(status_body if self.source == "status" else result)

    def __str__(self) -> str:
        prefix = STATUS_PREFIX if self.source == "status" else ""
        return prefix + self.pointer.text


@dataclass(frozen=True)
class ResultSpec:
    path: str | None = None
    from_status: Pointer | None = None
    method: str = "GET"
    required: tuple[SourcedPointer, ...] = ()
    summary: tuple[tuple[str, SourcedPointer], ...] = ()
    failed_items: SourcedPointer | None = None
    content_type: str | None = None
    max_bytes: int = 16 * 1_048_576
    checksum: Pointer | None = None
    size: Pointer | None = None
    timeout_seconds: float = 30.0
    failed_lines: tuple[LineTest, ...] = ()
    errors_path: str | None = None


@dataclass(frozen=True)
class FieldSource:
    """Where a webhook delivery carries a value: a header (``header:NAME``) or a JSON pointer."""

    header: str | None = None
    pointer: Pointer | None = None

    def extract(self, headers: Mapping[str, str], body: Any) -> Any:
        """The value, or ``MISSING``; ``headers`` must be case-insensitive or lower-case keyed."""
        if self.header is not None:
            value = headers.get(self.header)
            return MISSING if value is None else value
        return MISSING if self.pointer is None else self.pointer.resolve(body)

    def __str__(self) -> str:
        return HEADER_PREFIX + self.header if self.header is not None else str(self.pointer)


@dataclass(frozen=True)
class WebhookSpec:
    scheme: WebhookScheme
    secrets_env: str
    job_id: FieldSource
    event_id: FieldSource
    tolerance_seconds: int = 300
    max_body_bytes: int = 262_144
    signature_header: str | None = None
    types: tuple[str, ...] = ()
    event_type: FieldSource | None = None


@dataclass(frozen=True)
class PollingSpec:
    base_delay_seconds: float = 5.0
    max_delay_seconds: float = 120.0
    jitter_floor: float = 0.5
    deadline_seconds: float = 2400.0
    max_status_requests: int = 12
    max_transport_failures: int = 3
    max_rate_limited: int = 3
    rate_limit_delay_seconds: float = 60.0
    # Webhook trust (SPEC "Webhook trust: polling as a fallback"); the loader makes the
    # mode "adaptive" by default for a provider with a [webhook] table.
    webhook_trust: TrustMode = TrustMode.OFF
    trust_after: int = DEFAULT_TRUST_AFTER
    trusted_max_delay_seconds: float | None = None  # None: TRUSTED_MAX_FACTOR x max_delay
    distrust_after_misses: int = DEFAULT_DISTRUST_AFTER_MISSES
    webhook_grace_seconds: float = DEFAULT_GRACE_SECONDS
    rate_limit_reset: str | None = None  # lower-case header name (epoch seconds)

    def backoff(self) -> BackoffPolicy:
        return BackoffPolicy(self.base_delay_seconds, self.max_delay_seconds, self.jitter_floor)

    def trust(self) -> TrustPolicy:
        cap = self.trusted_max_delay_seconds
        return TrustPolicy(
            mode=self.webhook_trust,
            trust_after=self.trust_after,
            distrust_after_misses=self.distrust_after_misses,
            trusted_max_delay_seconds=(
                cap if cap is not None else TRUSTED_MAX_FACTOR * self.max_delay_seconds
            ),
            webhook_grace_seconds=self.webhook_grace_seconds,
        )


@dataclass(frozen=True)
class ProviderSpec:
    name: str
    source: str  # the file (or INLINE_SOURCE) it came from, for messages
    base_url: str  # http(s), no trailing slash, no credentials
    create: CreateSpec
    status: StatusSpec
    states: StateTable
    auth: AuthSpec = AuthSpec()
    trace_header: str = "X-Trace-ID"
    adapter: str | None = None
    job_id_slashes: bool = False
    http: HttpSpec = HttpSpec()
    lookup: LookupSpec | None = None
    cancel: CancelSpec | None = None
    result: ResultSpec | None = None
    webhook: WebhookSpec | None = None
    polling: PollingSpec = PollingSpec()
    # What agents are told about the provider (GET /v1/providers, list_providers).
    description: str | None = None
    request_schema: RequestSchema | None = None
    preset: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    webhook_url: str | None = None  # server.public_url + /webhooks/NAME, when set

    def where(self, key: str) -> str:
        """Message prefix naming this provider's file and a dotted key."""
        return f"{self.source}: providers.{self.name}.{key}"

    def classify(self, body: Any) -> Classification:
        return classify(body, self.status.state, self.states, self.status.rules)


def template_fields(template: str) -> frozenset[str]:
    return frozenset(n for _, n, _, _ in string.Formatter().parse(template) if n is not None)


def cancel_deadline_seconds(spec: ProviderSpec | None) -> float:
    """How long a cancel is watched for its confirmation (the provider file decides)."""
    if spec is None or spec.cancel is None:
        return CancelSpec.cancel_deadline_seconds
    return spec.cancel.cancel_deadline_seconds


def env_value(spec: ProviderSpec, key: str, variable: str, environ: Mapping[str, str]) -> Secret:
    """Read one variable; the error names the variable, never a value."""
    value = environ.get(variable)
    if value is None:
        raise ConfigError(f"{spec.where(key)}: environment variable {variable} is not set")
    if not value.strip():
        raise ConfigError(f"{spec.where(key)}: environment variable {variable} is empty")
    return Secret(value)


def auth_secret(spec: ProviderSpec, environ: Mapping[str, str]) -> Secret | None:
    """The credential the provider's ``auth`` names, or None for ``type = "none"``."""
    found = spec.auth.env_key
    if found is None:
        return None
    return env_value(spec, f"auth.{found[0]}", found[1], environ)


def webhook_secrets(spec: ProviderSpec, environ: Mapping[str, str]) -> tuple[Secret, ...]:
    """The current webhook secrets (comma-separated in the variable, for rotation)."""
    if spec.webhook is None:
        return ()
    variable = spec.webhook.secrets_env
    joined = env_value(spec, "webhook.secrets_env", variable, environ).reveal()
    return tuple(Secret(part.strip()) for part in joined.split(",") if part.strip())
