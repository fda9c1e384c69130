"""The tables of a provider file below ``[providers.NAME]``: ``[auth]``, ``[http]``,
``[create]``, ``[lookup]``, ``[status]``, ``[cancel]``, ``[result]``, ``[webhook]``,
``[polling]``.

Guarantee: each table checks its own keys and the rules between them (the
idempotency mode against the header and the path, a list lookup fully declared,
the delays in order); rules that span tables live in ``ProviderSpec``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated, Any

from pydantic import Field, PlainValidator, ValidationInfo, model_validator
from pydantic_core import PydanticCustomError

from reconciler.core.backoff import BackoffPolicy
from reconciler.core.errors import ConfigError
from reconciler.core.signatures import WebhookScheme
from reconciler.core.trust import (
    DEFAULT_DISTRUST_AFTER_MISSES,
    DEFAULT_GRACE_SECONDS,
    DEFAULT_TRUST_AFTER,
    TRUSTED_MAX_FACTOR,
    TrustMode,
    TrustPolicy,
)
from reconciler.providers import fields as f
from reconciler.providers.base import FileTable
from reconciler.providers.fields import problem, template_fields
from reconciler.providers.pointer import Pointer
from reconciler.providers.rules import (
    AnswerRule,
    HeaderPairs,
    LineTests,
    Match,
    RefusalRule,
    SetRule,
    call_headers,
    member_pointer,
    set_rules,
)
from reconciler.providers.state_table import StateRule
from reconciler.providers.templates import (
    CALL_FIELDS,
    ERRORS_REF,
    JOB_ID,
    KEY_FIELDS,
    REQUEST_FIELDS,
    RESULT_REF,
)

INLINE_SOURCE = "config inline providers"
JSONL = "application/jsonl"
DEFAULT_CANCEL_DEADLINE = 120.0
_DEFAULT_EVENT_ID = {
    WebhookScheme.STANDARD_WEBHOOKS: "header:webhook-id",
    WebhookScheme.GITHUB: "header:x-github-delivery",
    WebhookScheme.STRIPE: "/id",
}
_DEFAULT_EVENT_TYPE = {
    WebhookScheme.STANDARD_WEBHOOKS: "/type",
    WebhookScheme.GITHUB: "header:x-github-event",
    WebhookScheme.STRIPE: "/type",
}


class AuthType(StrEnum):
    BEARER = "bearer"
    HEADER = "header"
    NONE = "none"
    AWS_SIGV4 = "aws_sigv4"
    GOOGLE = "google"
    OAUTH2 = "oauth2"


class IdempotencyMode(StrEnum):
    """How the idempotency key reaches the provider (``none``: it takes none)."""

    HEADER = "header"
    PATH = "path"
    BODY = "body"
    NONE = "none"


CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
# The keys each auth type takes (beyond ``type``); ``|`` separates alternatives, one of
# which is required.
_AUTH_KEYS: dict[AuthType, tuple[str, ...]] = {
    AuthType.BEARER: ("token_env|token_file",),
    AuthType.HEADER: ("name", "value_env|token_file"),
    AuthType.NONE: (),
    AuthType.AWS_SIGV4: ("service", "region"),
    AuthType.GOOGLE: ("scopes?",),
    AuthType.OAUTH2: ("token_url", "client_id_env", "client_secret_env", "scope?"),
}
_AUTH_WHAT = {
    "name": "the header that carries the credential",
    "service": 'the signing name of the AWS service, e.g. "transcribe"',
    "region": 'the AWS region the base_url is in, e.g. "us-east-1"',
    "token_url": "the OAuth2 token endpoint (https://...)",
}
_TYPES = ", ".join(t.value for t in AuthType)


def _token_file(value: Any) -> str:
    text = f.text_value(value)
    if not text.startswith("/") or any(not ch.isprintable() for ch in text):
        raise problem("expected an absolute path to a file that holds the credential")
    return text


def _scopes(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise problem(f'expected a non-empty list of scope URLs, e.g. ["{CLOUD_PLATFORM}"]')
    return tuple(value)


def _region(value: Any) -> str:
    text = f.text_value(value)
    if not re.fullmatch(r"[a-z]{2}(-[a-z]+)+-\d{1,2}", text):
        raise problem('expected an AWS region such as "us-east-1"')
    return text


def _service(value: Any) -> str:
    text = f.text_value(value)
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]{1,63}", text):
        raise problem('expected an AWS signing name such as "transcribe" or "states"')
    return text


class AuthSpec(FileTable):
    type: Annotated[AuthType, f.choice(AuthType, f"expected one of {_TYPES}")]
    token_env: f.EnvName | None = None  # bearer
    token_file: Annotated[str, PlainValidator(_token_file)] | None = None  # bearer, header
    header_name: f.HeaderName | None = Field(default=None, alias="name")  # header
    value_env: f.EnvName | None = None  # header
    service: Annotated[str, PlainValidator(_service)] | None = None  # aws_sigv4
    region: Annotated[str, PlainValidator(_region)] | None = None  # aws_sigv4
    scopes: Annotated[tuple[str, ...], PlainValidator(_scopes)] | None = None  # google
    token_url: f.BaseUrl | None = None  # oauth2
    client_id_env: f.EnvName | None = None  # oauth2
    client_secret_env: f.EnvName | None = None  # oauth2
    scope: f.Text | None = None  # oauth2: space-separated

    @model_validator(mode="after")
    def _keys_of_the_type(self) -> AuthSpec:
        keys = _AUTH_KEYS[self.type]
        given = {
            (field.alias or name): getattr(self, name)
            for name, field in type(self).model_fields.items()
            if name != "type" and getattr(self, name) is not None
        }
        allowed = {k.rstrip("?") for key in keys for k in key.split("|")}
        for key in given:
            if key not in allowed:
                known = ", ".join(("type", *sorted(allowed)))
                raise problem(
                    f'unknown key for type "{self.type.value}" (known here: {known})', key
                )
        for key in keys:
            if key.endswith("?"):
                continue
            choices = key.split("|")
            named = [k for k in choices if k in given]
            if len(named) > 1:
                raise problem(f"give one of {' or '.join(choices)}, not both", named[1])
            if not named:
                what = _AUTH_WHAT.get(choices[0], "the name of an environment variable")
                if len(choices) > 1:
                    what = "the name of an environment variable, or token_file: a file's path"
                raise problem(f"required ({what})", choices[0])
        return self

    @property
    def env_key(self) -> tuple[str, str] | None:
        """(file key, variable name) of a static credential read from the environment."""
        if self.type is AuthType.BEARER and self.token_env:
            return ("token_env", self.token_env)
        if self.type is AuthType.HEADER and self.value_env:
            return ("value_env", self.value_env)
        return None

    @property
    def google_scopes(self) -> tuple[str, ...]:
        return self.scopes or (CLOUD_PLATFORM,)


class HttpSpec(FileTable):
    max_connections: f.Count = 20
    max_keepalive_connections: f.CountOrZero = 10
    keepalive_expiry_seconds: f.SecondsOrZero = 4.0
    max_response_bytes: f.Count = 1_048_576
    request_id_header: f.HeaderName | None = None


_MODES = ", ".join(f'"{m.value}"' for m in IdempotencyMode)
# The statuses that mean "this key is taken" by themselves (409 Conflict).
DUPLICATE_ALONE = frozenset({409})


# A call's ``set`` and ``headers``: templates over what the call can fill.
RequestSet = Annotated[tuple[SetRule, ...], set_rules(REQUEST_FIELDS)]
RequestHeaders = Annotated[HeaderPairs, call_headers(REQUEST_FIELDS)]
JobSet = Annotated[tuple[SetRule, ...], set_rules(CALL_FIELDS)]
JobHeaders = Annotated[HeaderPairs, call_headers(CALL_FIELDS)]


class CallTable(FileTable):
    """What every call's table has: where it goes, and the body and headers it sends.

    ``set`` writes values into the body (for create: into the agent's request; for the
    other calls into an empty object, so a call with ``set`` sends a JSON body);
    ``headers`` are sent with this call only, over the provider's static ones.
    """

    method: f.Method
    timeout_seconds: f.Seconds
    set: tuple[SetRule, ...]
    headers: HeaderPairs

    def sends(self, placeholder: str, path: str | None) -> bool:
        """Whether the call carries ``{placeholder}``: in ``path``, its body or its headers."""
        return placeholder in self._fields(path)

    def sends_key(self, path: str | None) -> bool:
        """Whether the call carries the idempotency key (in either form, ``KEY_FIELDS``)."""
        return not KEY_FIELDS.isdisjoint(self._fields(path))

    def _fields(self, path: str | None) -> frozenset[str]:
        return template_fields(path or "").union(
            *(rule.fields for rule in self.set),
            *(template_fields(value) for _, value in self.headers),
        )

    def _names_the_job(self, path: str) -> None:
        if not self.sends(JOB_ID, path):
            raise problem(
                "must contain {job_id} (or send it in this call's set or headers)", "path"
            )


class CreateSpec(CallTable):
    method: f.Method = "POST"
    path: Annotated[str, f.path_template(*REQUEST_FIELDS)]
    idempotency_header: f.HeaderName | None = None
    idempotency: Annotated[IdempotencyMode, f.choice(IdempotencyMode, f"expected one of {_MODES}")]
    job_id: f.PointerText
    state: f.PointerText | None = None
    timeout_seconds: f.Seconds = 10.0
    create_deadline_seconds: f.Seconds = 120.0
    set: RequestSet = ()
    headers: RequestHeaders = ()
    duplicate: AnswerRule | None = None

    @classmethod
    def complete(cls, data: dict[str, Any], context: Mapping[str, Any]) -> dict[str, Any]:
        if "idempotency" not in data:
            path = data.get("path")
            if isinstance(data.get("idempotency_header"), str):
                data["idempotency"] = IdempotencyMode.HEADER.value
            elif isinstance(path, str) and not KEY_FIELDS.isdisjoint(_path_fields(path)):
                data["idempotency"] = IdempotencyMode.PATH.value
        return data

    @model_validator(mode="after")
    def _mode_matches_the_keys(self) -> CreateSpec:
        mode, key = self.idempotency, "idempotency"
        if self.idempotency_header is not None and mode is not IdempotencyMode.HEADER:
            raise problem('must be "header" (or leave it out) when idempotency_header is set', key)
        if mode is IdempotencyMode.HEADER and self.idempotency_header is None:
            raise problem('"header" needs idempotency_header (the header that carries it)', key)
        in_path = not KEY_FIELDS.isdisjoint(template_fields(self.path))
        if mode is IdempotencyMode.PATH and not in_path:
            raise problem('"path" needs {idempotency_key} in create.path', key)
        if mode is not IdempotencyMode.PATH and in_path:
            raise problem('must be "path" (or leave it out): create.path holds the key', key)
        if mode is IdempotencyMode.BODY and not any(self.uses(k) for k in KEY_FIELDS):
            raise problem('"body" needs a [create.set] value using {idempotency_key}', key)
        self._duplicate_is_not_a_refusal()
        return self

    def _duplicate_is_not_a_refusal(self) -> None:
        # A plain 400 or 422 is how a provider refuses a bad request: read as "this key made
        # a job", a refusal would be looked up for a job that was never made.
        rule = self.duplicate
        if rule is None or rule.body_contains is not None:
            return
        refusals = [c for c in rule.status if 400 <= c < 500 and c not in DUPLICATE_ALONE]
        if refusals:
            raise problem(
                f"HTTP {refusals[0]} is also how a provider refuses a bad request: add "
                "body_contains (the words that say the key already made a job)",
                "duplicate",
            )

    def uses(self, placeholder: str) -> bool:
        """Whether a ``set`` value uses ``{placeholder}``."""
        return any(placeholder in rule.fields for rule in self.set)


def _path_fields(path: str) -> frozenset[str]:
    """The placeholders of a path as written (one that does not parse has its own error)."""
    try:
        return template_fields(path)
    except ValueError:
        return frozenset()


def _query_param(text: str) -> str | None:
    if not text or not all(ch.isalnum() or ch in "_.-[]" for ch in text):
        return "expected a query parameter name such as after"
    return None


class PageIn(StrEnum):
    """Where a lookup sends the next page's cursor."""

    QUERY = "query"
    BODY = "body"


class LookupSpec(CallTable):
    method: f.Method = "GET"
    path: Annotated[str, f.path_template(*REQUEST_FIELDS)]
    job_id: f.PointerText  # relative to the matched item when items is set
    timeout_seconds: f.Seconds = 10.0
    set: RequestSet = ()
    headers: RequestHeaders = ()
    items: f.DocumentPointer | None = None  # the array of candidates in the answer
    match: Match = ()
    pages: f.Count = 1
    next: f.PointerText | None = None
    next_in: Annotated[PageIn, f.choice(PageIn, 'expected "query" or "body"')] = PageIn.QUERY
    next_param: f.Text | None = None
    has_more: f.PointerText | None = None
    not_found: AnswerRule | None = None

    @model_validator(mode="after")
    def _a_list_is_searched_fully_declared(self) -> LookupSpec:
        if self.match and self.items is None:
            raise problem("required with match: the pointer to the array of candidates", "items")
        if self.items is not None and not self.match:
            raise problem("required with items: how this operation's job is recognised", "match")
        if (self.next is None) != (self.next_param is None):
            missing = "next" if self.next is None else "next_param"
            raise problem("next and next_param go together (cursor and where it is sent)", missing)
        if self.pages > 1 and self.next is None:
            raise problem("following pages needs next and next_param", "next")
        if self.has_more is not None and self.next is None:
            raise problem("has_more needs next and next_param", "has_more")
        if self.next_param is not None:
            self._page_param(self.next_param)
        return self

    def _page_param(self, text: str) -> None:
        if self.next_in is PageIn.QUERY:
            why = _query_param(text)
            if why is not None:
                raise problem(why, "next_param")
            return
        member_pointer(text, "next_param")

    @property
    def page_pointer(self) -> Pointer | None:
        """Where a body-paged lookup writes the cursor (``next_in = "body"``)."""
        if self.next_in is not PageIn.BODY or self.next_param is None:
            return None
        return Pointer.parse(self.next_param)


def where_in_file(info: ValidationInfo, key: str) -> str:
    context = info.context or {}
    return f"{context.get('source', INLINE_SOURCE)}: providers.{context.get('name', '?')}.{key}"


def as_line(exc: ConfigError) -> PydanticCustomError:
    return PydanticCustomError(f.LINE, "{line}", {"line": exc.message})


def _rules(value: Any, info: ValidationInfo) -> tuple[StateRule, ...]:
    if not isinstance(value, list):
        raise problem("expected a list of inline tables")
    where = where_in_file(info, "status.rules")
    try:
        return tuple(StateRule.from_table(v, f"{where}[{i}]") for i, v in enumerate(value))
    except ConfigError as exc:
        raise as_line(exc) from None


class StatusSpec(CallTable):
    method: f.Method = "GET"
    path: Annotated[str, f.path_template(*CALL_FIELDS)]
    set: JobSet = ()
    headers: JobHeaders = ()
    not_found: AnswerRule | None = None
    state: f.PointerText
    rules: Annotated[tuple[StateRule, ...], PlainValidator(_rules)] = ()
    job_id: f.PointerText | None = None
    poll_after_seconds: f.PointerText | None = None
    next_check_at: f.PointerText | None = None
    expires_at: f.PointerText | None = None
    error: f.PointerText | None = None
    progress: f.PointerText | None = None
    result_ref: f.PointerText | None = None
    errors_ref: f.PointerText | None = None
    required: f.PointerList = ()
    not_found_grace_seconds: f.SecondsOrZero = 30.0
    timeout_seconds: f.Seconds = 10.0

    @model_validator(mode="after")
    def _the_job_is_named(self) -> StatusSpec:
        self._names_the_job(self.path)
        return self


class CancelSpec(CallTable):
    method: f.Method = "POST"
    path: Annotated[str, f.path_template(*CALL_FIELDS)]
    timeout_seconds: f.Seconds = 10.0
    set: JobSet = ()
    headers: JobHeaders = ()
    refused: RefusalRule | None = None
    cancel_deadline_seconds: f.Seconds = DEFAULT_CANCEL_DEADLINE

    @model_validator(mode="after")
    def _the_job_is_named(self) -> CancelSpec:
        self._names_the_job(self.path)
        return self


_HOST = re.compile(r"(\*\.)?[a-z0-9_:]([a-z0-9_.:-]*[a-z0-9_])?")


def _hosts(value: Any) -> tuple[str, ...]:
    """``[result] hosts``: where result URLs may point besides the provider's origin."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise problem('expected a list of host names, e.g. ["files.example.com", "*.s3.example"]')
    hosts = tuple(v.strip().lower().rstrip(".") for v in value)
    for host in hosts:
        if not _HOST.fullmatch(host) or "*" in host[2:] or host in ("*.", "*"):
            raise problem(
                f"{host[:80]!r} is not a host name; write a name (files.example.com), "
                "*.domain for every name under it, or an IP address, without scheme or port"
            )
    return hosts


class ResultSpec(CallTable):
    path: Annotated[str, f.path_template(*CALL_FIELDS, RESULT_REF)] | None = None
    from_status: f.PointerText | None = None
    method: f.Method = "GET"
    set: JobSet = ()
    headers: JobHeaders = ()
    required: f.SourcedList = ()
    summary: f.Summary = ()
    failed_items: f.Sourced | None = None
    content_type: f.Text | None = None
    failed_lines: LineTests = ()
    errors_path: Annotated[str, f.path_template(*CALL_FIELDS, ERRORS_REF, RESULT_REF)] | None = None
    max_bytes: f.Count = 16 * 1_048_576
    checksum: f.PointerText | None = None
    size: f.PointerText | None = None
    timeout_seconds: f.Seconds = 30.0
    hosts: Annotated[tuple[str, ...], PlainValidator(_hosts)] = ()

    @model_validator(mode="after")
    def _one_source(self) -> ResultSpec:
        if self.path is not None and self.from_status is not None:
            raise problem("give either path or from_status, not both", "from_status")
        for key in ("failed_lines", "errors_path"):
            if getattr(self, key) and self.content_type != JSONL:
                raise problem(f'applies to content_type = "{JSONL}"', key)
        return self

    @property
    def jsonl(self) -> bool:
        return self.content_type == JSONL


_SCHEMES = ", ".join(s.value for s in WebhookScheme)


class WebhookSpec(FileTable):
    scheme: Annotated[WebhookScheme, f.choice(WebhookScheme, f"expected one of {_SCHEMES}")]
    secrets_env: f.EnvName
    job_id: f.FieldSourceText
    event_id: f.FieldSourceText
    tolerance_seconds: f.Count = 300
    max_body_bytes: f.Count = 262_144
    signature_header: f.LowerHeaderName | None = None
    types: Annotated[tuple[f.Text, ...], f.as_tuple("event types")] = ()
    event_type: f.FieldSourceText | None = None

    @classmethod
    def complete(cls, data: dict[str, Any], context: Mapping[str, Any]) -> dict[str, Any]:
        try:
            scheme = WebhookScheme(str(data.get("scheme")))
        except ValueError:
            return data  # the scheme's own check says what is wrong
        if "event_id" not in data:
            if scheme not in _DEFAULT_EVENT_ID:
                raise problem(f"required for the {scheme.value} scheme", "event_id")
            data["event_id"] = _DEFAULT_EVENT_ID[scheme]
        if "event_type" not in data and scheme in _DEFAULT_EVENT_TYPE:
            data["event_type"] = _DEFAULT_EVENT_TYPE[scheme]
        return data

    @model_validator(mode="after")
    def _scheme_keys(self) -> WebhookSpec:
        if self.signature_header is not None and self.scheme is not WebhookScheme.HMAC_SHA256:
            raise problem("applies only to the hmac-sha256 scheme", "signature_header")
        if self.types and self.event_type is None:
            raise problem(
                "types need event_type: where a delivery carries its type "
                "(a JSON pointer or header:NAME)",
                "event_type",
            )
        if len(set(self.types)) != len(self.types):
            raise problem("lists an event type twice", "types")
        return self


_TRUST_MODES = " or ".join(f'"{m.value}"' for m in TrustMode)


class PollingSpec(FileTable):
    base_delay_seconds: f.Seconds = 5.0
    max_delay_seconds: f.Seconds = 120.0
    jitter_floor: f.Fraction = 0.5
    deadline_seconds: f.Seconds = 2400.0
    max_status_requests: f.Count = 12
    max_transport_failures: f.Count = 3
    max_rate_limited: f.Count = 3
    rate_limit_delay_seconds: f.Seconds = 60.0
    rate_limit_reset: f.HeaderSource | None = None  # lower-case header name (epoch seconds)
    # Webhook trust (docs/design.md#webhook-trust); "adaptive" by
    # default for a provider with a [webhook] table (ProviderSpec fills it in).
    webhook_trust: Annotated[TrustMode, f.choice(TrustMode, f"expected {_TRUST_MODES}")] = (
        TrustMode.OFF
    )
    trust_after: f.Count = DEFAULT_TRUST_AFTER
    trusted_max_delay_seconds: f.Seconds | None = None  # None: TRUSTED_MAX_FACTOR x max_delay
    distrust_after_misses: f.Count = DEFAULT_DISTRUST_AFTER_MISSES
    webhook_grace_seconds: f.SecondsOrZero = DEFAULT_GRACE_SECONDS

    @model_validator(mode="after")
    def _delays_in_order(self) -> PollingSpec:
        if self.max_delay_seconds < self.base_delay_seconds:
            raise problem("must be at least base_delay_seconds", "max_delay_seconds")
        cap = self.trusted_max_delay_seconds
        if cap is not None and cap < self.max_delay_seconds:
            raise problem(
                "must be at least max_delay_seconds: trust only ever lengthens the wait",
                "trusted_max_delay_seconds",
            )
        return self

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
