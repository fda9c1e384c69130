"""Provider specs: one set of typed models that is both the parsed ``[providers.NAME]``
table and the spec the engine runs on.

Guarantee: a provider is declared, not coded. Each model is strict, frozen and knows
its keys (an unknown key is refused, naming the known ones); each value type says
what is wrong with a bad value (``providers.fields``); checks across keys live in
the model that holds them. Secrets are never in the file, only the names of the
environment variables that hold them (``providers.secrets`` reads them). Reading
files, presets and the message format are ``providers.loader``'s job.

Keys beyond the SPEC example (each has a default or is optional):

* top level: ``description``, ``request_schema`` (checked at load, see
  ``providers.request_schema``), ``adapter = "pkg.module:Class"``,
  ``job_id_slashes`` (keep ``/`` in job IDs placed in paths), ``preset`` (see the
  loader), ``headers`` (static, never credentials).
* ``[http]``: ``max_connections`` (20), ``max_keepalive_connections`` (10),
  ``keepalive_expiry_seconds`` (4: below the 5 s idle timeout common to servers),
  ``max_response_bytes`` (1 MiB), ``request_id_header``.
* ``[create]``: ``state``; ``idempotency`` (``header`` when ``idempotency_header`` is
  set, ``path`` when the path holds ``{idempotency_key}``, otherwise the file says
  ``body`` or ``none``: no silent default); ``set`` (pointer = value written into the
  request); ``duplicate = { status = [...], body_contains = "..." }`` (needs
  ``[lookup]``).
* ``[lookup]``: ``items``, ``match``, ``pages``, ``next``, ``next_param``, ``has_more``
  (a lookup over a list); ``method``, ``timeout_seconds`` everywhere.
* ``[status]``: ``rules`` (see ``state_table``), ``job_id``, ``required``,
  ``errors_ref``.
* ``[cancel]``: ``cancel_deadline_seconds`` (120).
* ``[result]``: ``from_status``, ``failed_items``, ``content_type``
  (``application/jsonl``: line-delimited), ``failed_lines``, ``errors_path``,
  ``max_bytes`` (16 MiB), ``checksum``, ``size``; ``status:`` points into the status.
* ``[webhook]``: ``signature_header`` (hmac-sha256), ``event_id`` and
  ``event_type`` (defaults per scheme), ``types`` (the event types that are hints).
* ``[polling]``: ``max_rate_limited`` (3), ``rate_limit_delay_seconds`` (60),
  ``rate_limit_reset = "header:NAME"``, webhook trust (``webhook_trust`` "adaptive"
  by default with a ``[webhook]`` table, ``trust_after`` 20,
  ``trusted_max_delay_seconds`` 10 x max, ``distrust_after_misses`` 1,
  ``webhook_grace_seconds`` 30).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated, Any

from pydantic import Field, PlainValidator, ValidationInfo, model_validator
from pydantic_core import PydanticCustomError

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
from reconciler.providers import fields as f
from reconciler.providers.fields import (
    HEADER_PREFIX,
    HTTP_METHODS,
    STATUS_PREFIX,
    FieldSource,
    FileTable,
    SourcedPointer,
    problem,
    template_fields,
)
from reconciler.providers.pointer import Pointer
from reconciler.providers.request_schema import RequestSchema, SchemaProblem
from reconciler.providers.rules import (
    IDEMPOTENCY_KEY,
    WEBHOOK_URL,
    DuplicateRule,
    LineTest,
    LineTests,
    Match,
    SetRule,
    SetRules,
    StaticHeaders,
    quoted,
)
from reconciler.providers.secrets import auth_secret, env_value, webhook_secrets
from reconciler.providers.state_table import Classification, StateRule, StateTable, classify

__all__ = [
    "DEFAULT_CANCEL_DEADLINE",
    "ERRORS_REF",
    "HEADER_PREFIX",
    "HTTP_METHODS",
    "IDEMPOTENCY_KEY",
    "INLINE_SOURCE",
    "JOB_ID",
    "JSONL",
    "RESULT_REF",
    "STATUS_PREFIX",
    "AuthSpec",
    "AuthType",
    "CancelSpec",
    "CreateSpec",
    "DuplicateRule",
    "FieldSource",
    "HttpSpec",
    "IdempotencyMode",
    "LineTest",
    "LookupSpec",
    "Pointer",
    "PollingSpec",
    "ProviderSpec",
    "ResultSpec",
    "SetRule",
    "SourcedPointer",
    "StatusSpec",
    "WebhookSpec",
    "auth_secret",
    "cancel_deadline_seconds",
    "env_value",
    "template_fields",
    "webhook_secrets",
]

INLINE_SOURCE = "config inline providers"
JOB_ID = "job_id"
RESULT_REF = "result_ref"
ERRORS_REF = "errors_ref"
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


class IdempotencyMode(StrEnum):
    """How the idempotency key reaches the provider (``none``: it takes none)."""

    HEADER = "header"
    PATH = "path"
    BODY = "body"
    NONE = "none"


class AuthSpec(FileTable):
    type: Annotated[AuthType, f.choice(AuthType, "expected bearer, header or none")]
    token_env: f.EnvName | None = None  # bearer
    header_name: f.HeaderName | None = Field(default=None, alias="name")  # header
    value_env: f.EnvName | None = None  # header

    @model_validator(mode="after")
    def _keys_of_the_type(self) -> AuthSpec:
        needed = {AuthType.BEARER: ("token_env",), AuthType.HEADER: ("name", "value_env")}
        keys = needed.get(self.type, ())
        values = {"token_env": self.token_env, "name": self.header_name}
        values["value_env"] = self.value_env
        for key in keys:
            if values[key] is None:
                what = "the header that carries the credential"
                if key != "name":
                    what = "the name of an environment variable"
                raise problem(f"required ({what})", key)
        for key, value in values.items():
            if value is not None and key not in keys:
                raise problem(f"unknown key (known here: {', '.join(('type', *keys))})", key)
        return self

    @property
    def env_key(self) -> tuple[str, str] | None:
        """(file key, variable name) of the credential, if any."""
        if self.type is AuthType.BEARER and self.token_env:
            return ("token_env", self.token_env)
        if self.type is AuthType.HEADER and self.value_env:
            return ("value_env", self.value_env)
        return None


class HttpSpec(FileTable):
    max_connections: f.Count = 20
    max_keepalive_connections: f.CountOrZero = 10
    keepalive_expiry_seconds: f.SecondsOrZero = 4.0
    max_response_bytes: f.Count = 1_048_576
    request_id_header: f.HeaderName | None = None


_MODES = ", ".join(f'"{m.value}"' for m in IdempotencyMode)


class CreateSpec(FileTable):
    method: f.Method = "POST"
    path: Annotated[str, f.path_template(IDEMPOTENCY_KEY)]
    idempotency_header: f.HeaderName | None = None
    idempotency: Annotated[IdempotencyMode, f.choice(IdempotencyMode, f"expected one of {_MODES}")]
    job_id: f.PointerText
    state: f.PointerText | None = None
    timeout_seconds: f.Seconds = 10.0
    create_deadline_seconds: f.Seconds = 120.0
    set: SetRules = ()
    duplicate: DuplicateRule | None = None

    @classmethod
    def complete(cls, data: dict[str, Any], context: Mapping[str, Any]) -> dict[str, Any]:
        if "idempotency" not in data:
            path = data.get("path")
            if isinstance(data.get("idempotency_header"), str):
                data["idempotency"] = IdempotencyMode.HEADER.value
            elif isinstance(path, str) and "{" + IDEMPOTENCY_KEY + "}" in path:
                data["idempotency"] = IdempotencyMode.PATH.value
        return data

    @model_validator(mode="after")
    def _mode_matches_the_keys(self) -> CreateSpec:
        mode, key = self.idempotency, "idempotency"
        if self.idempotency_header is not None and mode is not IdempotencyMode.HEADER:
            raise problem('must be "header" (or leave it out) when idempotency_header is set', key)
        if mode is IdempotencyMode.HEADER and self.idempotency_header is None:
            raise problem('"header" needs idempotency_header (the header that carries it)', key)
        in_path = IDEMPOTENCY_KEY in template_fields(self.path)
        if mode is IdempotencyMode.PATH and not in_path:
            raise problem('"path" needs {idempotency_key} in create.path', key)
        if mode is not IdempotencyMode.PATH and in_path:
            raise problem('must be "path" (or leave it out): create.path holds the key', key)
        if mode is IdempotencyMode.BODY and not self.uses(IDEMPOTENCY_KEY):
            raise problem('"body" needs a [create.set] value using {idempotency_key}', key)
        return self

    def uses(self, placeholder: str) -> bool:
        """Whether a ``set`` value uses ``{placeholder}``."""
        return any(placeholder in rule.fields for rule in self.set)


def _query_param(value: Any) -> str:
    text = f.text_value(value)
    if not all(ch.isalnum() or ch in "_.-[]" for ch in text):
        raise problem("expected a query parameter name such as after")
    return str(text)


class LookupSpec(FileTable):
    method: f.Method = "GET"
    path: Annotated[str, f.path_template(IDEMPOTENCY_KEY)]
    job_id: f.PointerText  # relative to the matched item when items is set
    timeout_seconds: f.Seconds = 10.0
    items: f.DocumentPointer | None = None  # the array of candidates in the answer
    match: Match = ()
    pages: f.Count = 1
    next: f.PointerText | None = None
    next_param: Annotated[str, PlainValidator(_query_param)] | None = None
    has_more: f.PointerText | None = None

    @model_validator(mode="after")
    def _a_list_is_searched_fully_declared(self) -> LookupSpec:
        if self.match and self.items is None:
            raise problem("required with match: the pointer to the array of candidates", "items")
        if self.items is not None and not self.match:
            raise problem("required with items: how this operation's job is recognised", "match")
        if (self.next is None) != (self.next_param is None):
            missing = "next" if self.next is None else "next_param"
            raise problem("next and next_param go together (cursor and query parameter)", missing)
        if self.pages > 1 and self.next is None:
            raise problem("following pages needs next and next_param", "next")
        if self.has_more is not None and self.next is None:
            raise problem("has_more needs next and next_param", "has_more")
        return self


def _where(info: ValidationInfo, key: str) -> str:
    context = info.context or {}
    return f"{context.get('source', INLINE_SOURCE)}: providers.{context.get('name', '?')}.{key}"


def _as_line(exc: ConfigError) -> PydanticCustomError:
    return PydanticCustomError(f.LINE, "{line}", {"line": exc.message})


def _rules(value: Any, info: ValidationInfo) -> tuple[StateRule, ...]:
    if not isinstance(value, list):
        raise problem("expected a list of inline tables")
    where = _where(info, "status.rules")
    try:
        return tuple(StateRule.from_table(v, f"{where}[{i}]") for i, v in enumerate(value))
    except ConfigError as exc:
        raise _as_line(exc) from None


def _states(value: Any, info: ValidationInfo) -> StateTable:
    if not isinstance(value, dict):
        raise problem("expected a table")
    try:
        return StateTable.from_mapping(value, _where(info, "states"))
    except ConfigError as exc:
        raise _as_line(exc) from None


def _request_schema(value: Any, info: ValidationInfo) -> RequestSchema:
    try:
        return RequestSchema.compile((info.context or {}).get("name", "?"), value)
    except SchemaProblem as exc:
        raise problem(str(exc)) from None


class StatusSpec(FileTable):
    method: f.Method = "GET"
    path: Annotated[str, f.path_template(JOB_ID, needed=JOB_ID)]
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


class CancelSpec(FileTable):
    method: f.Method = "POST"
    path: Annotated[str, f.path_template(JOB_ID, needed=JOB_ID)]
    timeout_seconds: f.Seconds = 10.0
    cancel_deadline_seconds: f.Seconds = DEFAULT_CANCEL_DEADLINE


class ResultSpec(FileTable):
    path: Annotated[str, f.path_template(JOB_ID, RESULT_REF)] | None = None
    from_status: f.PointerText | None = None
    method: f.Method = "GET"
    required: f.SourcedList = ()
    summary: f.Summary = ()
    failed_items: f.Sourced | None = None
    content_type: f.Text | None = None
    failed_lines: LineTests = ()
    errors_path: Annotated[str, f.path_template(JOB_ID, ERRORS_REF, RESULT_REF)] | None = None
    max_bytes: f.Count = 16 * 1_048_576
    checksum: f.PointerText | None = None
    size: f.PointerText | None = None
    timeout_seconds: f.Seconds = 30.0

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
    # Webhook trust (SPEC "Webhook trust: polling as a fallback"); "adaptive" by
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


class ProviderSpec(FileTable):
    name: str
    source: str  # the file (or INLINE_SOURCE) it came from, for messages
    preset: f.Text | None = None  # the preset this provider's table is merged over
    base_url: f.BaseUrl  # http(s), no trailing slash, no credentials
    auth: AuthSpec = AuthSpec(type=AuthType.NONE)
    trace_header: f.HeaderName = "X-Trace-ID"
    adapter: f.ImportRef | None = None
    job_id_slashes: f.Flag = False
    headers: StaticHeaders = ()  # sent on every call; never credentials
    http: HttpSpec = HttpSpec()
    create: CreateSpec
    status: StatusSpec
    webhook: WebhookSpec | None = None
    lookup: LookupSpec | None = None
    states: Annotated[StateTable, PlainValidator(_states)]
    cancel: CancelSpec | None = None
    result: ResultSpec | None = None
    polling: PollingSpec = PollingSpec()
    # What agents are told about the provider (GET /v1/providers, list_providers).
    description: f.Description | None = None
    request_schema: Annotated[RequestSchema, PlainValidator(_request_schema)] | None = None
    # server.public_url + /webhooks/NAME when public_url is set: {webhook_url}.
    webhook_url: str | None = None

    @classmethod
    def complete(cls, data: dict[str, Any], context: Mapping[str, Any]) -> dict[str, Any]:
        if context:
            public = str(context.get("public_url") or "").rstrip("/")
            data["name"], data["source"] = context["name"], context["source"]
            data["webhook_url"] = f"{public}/webhooks/{context['name']}" if public else None
        polling = data.get("polling", {})
        if "webhook" in data and isinstance(polling, dict) and "webhook_trust" not in polling:
            data["polling"] = {**polling, "webhook_trust": TrustMode.ADAPTIVE.value}
        return data

    @model_validator(mode="after")
    def _keys_agree(self) -> ProviderSpec:
        self._check_lookup()
        self._check_webhook_url()
        self._check_result()
        if self.polling.webhook_trust is TrustMode.ADAPTIVE and self.webhook is None:
            raise problem(
                '"adaptive" needs a [webhook] table: trust is earned from verified webhooks',
                "polling.webhook_trust",
            )
        own = {self.trace_header.lower(): "trace_header"}
        if self.create.idempotency_header:
            own[self.create.idempotency_header.lower()] = "create.idempotency_header"
        for name, _ in self.headers:
            if name.lower() in own:
                raise problem(f"is sent by the service ({own[name.lower()]})", f"headers.{name}")
        return self

    def _check_lookup(self) -> None:
        lookup, create = self.lookup, self.create
        if create.duplicate is not None and lookup is None:
            raise problem(
                "needs a [lookup] table: a duplicate answer is settled by looking the job up",
                "create.duplicate",
            )
        if lookup is None or lookup.match or create.idempotency_header is not None:
            return
        if IDEMPOTENCY_KEY not in template_fields(lookup.path):
            raise problem(
                "must contain {idempotency_key}: create has no idempotency_header "
                "(or search a list with items and match)",
                "lookup.path",
            )

    def _check_webhook_url(self) -> None:
        uses = [(f"create.set.{quoted(r.pointer.text)}", r.fields) for r in self.create.set]
        if self.lookup is not None:
            uses += [
                (f"lookup.match.{quoted(p.text)}", template_fields(t)) for p, t in self.lookup.match
            ]
        for key, names in uses:
            if WEBHOOK_URL not in names:
                continue
            if self.webhook_url is None:
                raise problem(
                    "{webhook_url} needs server.public_url in reconciler.toml: the address "
                    "the provider reaches this service at",
                    key,
                )
            if self.webhook is None:
                raise problem(
                    "{webhook_url} names /webhooks/" + self.name + ", which needs a [webhook] "
                    "table to verify what arrives there",
                    key,
                )

    def _check_result(self) -> None:
        result = self.result
        if result is None:
            return
        needs_ref = result.from_status is None and (
            result.path is None or RESULT_REF in template_fields(result.path)
        )
        if needs_ref and self.status.result_ref is None:
            raise problem("fetching by result_ref needs status.result_ref", "result.path")
        names = template_fields(result.errors_path or "")
        if ERRORS_REF in names and self.status.errors_ref is None:
            raise problem("{errors_ref} needs status.errors_ref", "result.errors_path")
        if RESULT_REF in names and self.status.result_ref is None:
            raise problem("{result_ref} needs status.result_ref", "result.errors_path")

    def where(self, key: str) -> str:
        """Message prefix naming this provider's file and a dotted key."""
        return f"{self.source}: providers.{self.name}.{key}"

    def classify(self, body: Any) -> Classification:
        return classify(body, self.status.state, self.states, self.status.rules)


def cancel_deadline_seconds(spec: ProviderSpec | None) -> float:
    """How long a cancel is watched for its confirmation (the provider file decides)."""
    if spec is None or spec.cancel is None:
        return DEFAULT_CANCEL_DEADLINE
    return spec.cancel.cancel_deadline_seconds
