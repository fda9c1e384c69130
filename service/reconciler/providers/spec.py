"""Provider specs: one set of typed models that is both the parsed ``[providers.NAME]``
table and the spec the engine runs on.

Guarantee: a provider is declared, not coded. Each model is strict, frozen and knows
its keys (an unknown key is refused, naming the known ones); each value type says
what is wrong with a bad value (``providers.fields``); checks across keys live in
the model that holds them. Secrets are never in the file, only the names of the
environment variables (or files) that hold them (``providers.credentials`` and
``providers.secrets`` read them). Reading files, presets and the message format are
``providers.loader``'s job.

Every key, its type, default and meaning is in docs/providers.md#every-key
(``tests/unit/test_provider_keys_page.py`` holds the page to these models).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import PlainValidator, ValidationInfo, model_validator

from reconciler.core.errors import ConfigError
from reconciler.core.trust import TrustMode
from reconciler.providers import fields as f
from reconciler.providers.base import FileTable
from reconciler.providers.fields import (
    HEADER_PREFIX,
    HTTP_METHODS,
    STATUS_PREFIX,
    FieldSource,
    SourcedPointer,
    problem,
    template_fields,
)
from reconciler.providers.pointer import Pointer
from reconciler.providers.request_schema import RequestSchema, SchemaProblem
from reconciler.providers.rules import (
    AnswerRule,
    LineTest,
    RefusalRule,
    SetRule,
    StaticHeaders,
    quoted,
)
from reconciler.providers.sections import (
    DEFAULT_CANCEL_DEADLINE,
    INLINE_SOURCE,
    JSONL,
    AuthSpec,
    AuthType,
    CallTable,
    CancelSpec,
    CreateSpec,
    HttpSpec,
    IdempotencyMode,
    LookupSpec,
    PageIn,
    PollingSpec,
    ResultSpec,
    StatusSpec,
    WebhookSpec,
    as_line,
    where_in_file,
)
from reconciler.providers.state_table import Classification, StateTable, classify
from reconciler.providers.templates import (
    ERRORS_REF,
    IDEMPOTENCY_KEY,
    JOB_ID,
    RESULT_REF,
    WEBHOOK_URL,
)

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
    "AnswerRule",
    "AuthSpec",
    "AuthType",
    "CallTable",
    "CancelSpec",
    "CreateSpec",
    "FieldSource",
    "HttpSpec",
    "IdempotencyMode",
    "LineTest",
    "LookupSpec",
    "PageIn",
    "Pointer",
    "PollingSpec",
    "ProviderSpec",
    "RefusalRule",
    "ResultSpec",
    "SetRule",
    "SourcedPointer",
    "StatusSpec",
    "WebhookSpec",
    "cancel_deadline_seconds",
    "template_fields",
]


def _states(value: Any, info: ValidationInfo) -> StateTable:
    if not isinstance(value, dict):
        raise problem("expected a table")
    try:
        return StateTable.from_mapping(value, where_in_file(info, "states"))
    except ConfigError as exc:
        raise as_line(exc) from None


def _request_schema(value: Any, info: ValidationInfo) -> RequestSchema:
    try:
        return RequestSchema.compile((info.context or {}).get("name", "?"), value)
    except SchemaProblem as exc:
        raise problem(str(exc)) from None


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
        if self.auth.header_name:
            own[self.auth.header_name.lower()] = "auth.name"
        for where, headers in (("", self.headers), *self._call_headers()):
            for name, _ in headers:
                if name.lower() in own:
                    key = f"{where}headers.{quoted(name)}"
                    raise problem(f"is sent by the service ({own[name.lower()]})", key)
        return self

    def calls(self) -> tuple[tuple[str, CallTable], ...]:
        """Each call table the file has, by its key."""
        tables: tuple[tuple[str, CallTable | None], ...] = (
            ("create", self.create),
            ("lookup", self.lookup),
            ("status", self.status),
            ("cancel", self.cancel),
            ("result", self.result),
        )
        return tuple((key, table) for key, table in tables if table is not None)

    def _call_headers(self) -> tuple[tuple[str, tuple[tuple[str, str], ...]], ...]:
        return tuple((f"{key}.", table.headers) for key, table in self.calls())

    def _check_lookup(self) -> None:
        lookup, create = self.lookup, self.create
        if create.duplicate is not None and lookup is None:
            raise problem(
                "needs a [lookup] table: a duplicate answer is settled by looking the job up",
                "create.duplicate",
            )
        if lookup is None or lookup.match or create.idempotency_header is not None:
            return
        if not lookup.sends_key(lookup.path):
            raise problem(
                "must contain {idempotency_key}: create has no idempotency_header "
                "(or send it in lookup.set or lookup.headers, or search a list with items "
                "and match)",
                "lookup.path",
            )

    def _check_webhook_url(self) -> None:
        uses: list[tuple[str, frozenset[str]]] = []
        for key, table in self.calls():
            uses += [(f"{key}.set.{quoted(r.pointer.text)}", r.fields) for r in table.set]
            uses += [(f"{key}.headers.{quoted(n)}", template_fields(v)) for n, v in table.headers]
            path = getattr(table, "path", None)
            if isinstance(path, str):
                uses.append((f"{key}.path", template_fields(path)))
        if self.lookup is not None:
            uses += [
                (f"lookup.match.{quoted(p.text)}", template_fields(t)) for p, t in self.lookup.match
            ]
        if self.result is not None and self.result.errors_path is not None:
            uses.append(("result.errors_path", template_fields(self.result.errors_path)))
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
