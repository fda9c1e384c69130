"""Loading provider files: every ``[providers.NAME]`` table parsed into a ``ProviderSpec``.

Every problem is one ``ConfigError`` line, ``<file>: providers.<name>.<key>: <problem>``,
raised at load time so a bad file stops the service before the first call. Unknown
keys are errors (a typo must not pass silently) and secrets written into a file are
refused: files name environment variables (``token_env``, ``value_env``,
``secrets_env``) and the values are read from an injected mapping.

Keys beyond the SPEC example (each has a default or is optional):

* top level: ``description`` (one paragraph for agents: what the provider does) and
  ``request_schema`` (a JSON Schema, as a table, that every operation's ``request``
  must match; checked at load, see ``providers.request_schema``);
  ``adapter = "pkg.module:Class"`` (a custom adapter instead of the declarative one);
  ``job_id_slashes = true`` keeps ``/`` in job IDs substituted into paths, for
  resource names such as ``operations/123`` (``.``/``..`` segments are still
  refused by the adapter).
* ``[http]``: ``max_connections`` (20), ``max_keepalive_connections`` (10),
  ``keepalive_expiry_seconds`` (4: below the 5 s idle timeout common to servers, so a
  pooled connection is not reused just as the server closes it), ``max_response_bytes``
  (1 MiB, cap on every non-result body), ``request_id_header`` (checked before the
  common ones).
* ``[create]``: ``state`` (pointer to the state word in the create response).
  ``idempotency_header`` has no default: a provider without one cannot take a
  safe create retry, and that should be visible in its file.
* ``[lookup]``, ``[status]``, ``[cancel]``, ``[result]``: ``method``, ``timeout_seconds``.
* ``[status]``: ``rules`` (see ``state_table``), ``job_id`` (pointer to the job
  ID echoed by the provider; a mismatch is a contradiction), ``required``
  (pointers that must be present in a success or partial status body).
* ``[cancel]``: ``cancel_deadline_seconds`` (120).
* ``[result]``: ``from_status`` (the result is embedded in the final status body
  at this pointer, e.g. a Google operation's ``/response``), ``failed_items``,
  ``content_type``, ``max_bytes`` (16 MiB), ``checksum`` and ``size`` (pointers
  into the status body). ``required``, ``summary`` and ``failed_items`` point into
  the result document; a ``status:`` prefix points into the final status body
  instead. ``path`` may use ``{result_ref}`` (e.g. an output file ID).
* ``[webhook]``: ``signature_header`` (hmac-sha256 only). ``event_id`` defaults
  per scheme; ``event_id`` and ``job_id`` take ``header:NAME`` or a pointer.
* ``[polling]``: ``max_rate_limited`` (3 consecutive 429s before escalating
  ``rate_limited``), ``rate_limit_delay_seconds`` (60, the wait after a 429 or 503
  without ``Retry-After``). Webhook trust (SPEC): ``webhook_trust`` ("adaptive" by
  default when the provider has a ``[webhook]`` table, else "off"; "adaptive" without
  a ``[webhook]`` table is an error), ``trust_after`` (20), ``trusted_max_delay_seconds``
  (10 x ``max_delay_seconds``; at least ``max_delay_seconds``),
  ``distrust_after_misses`` (1), ``webhook_grace_seconds`` (30; 0 allowed).
"""

from __future__ import annotations

import math
import re
import string
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from reconciler.core.signatures import WebhookScheme
from reconciler.core.trust import TrustMode
from reconciler.errors import ConfigError, PointerSyntaxError
from reconciler.providers.pointer import Pointer
from reconciler.providers.request_schema import RequestSchema, SchemaProblem
from reconciler.providers.spec import (
    HEADER_PREFIX,
    HTTP_METHODS,
    IDEMPOTENCY_KEY,
    INLINE_SOURCE,
    JOB_ID,
    RESULT_REF,
    STATUS_PREFIX,
    AuthSpec,
    AuthType,
    CancelSpec,
    CreateSpec,
    DuplicateRule,
    FieldSource,
    HttpSpec,
    IdempotencyMode,
    LineTest,
    LookupSpec,
    PollingSpec,
    ProviderSpec,
    ResultSpec,
    SetRule,
    SourcedPointer,
    StatusSpec,
    WebhookSpec,
    auth_secret,
    template_fields,
    webhook_secrets,
)
from reconciler.providers.state_table import StateRule, StateTable

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
_ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]{0,127}")
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,100}")
_IMPORT_REF = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")
# Keys that would hold a secret value; the message points at the *_env key to use instead.
_SECRET_KEYS = {
    "token": "token_env",
    "value": "value_env",
    "secret": "secrets_env",
    "secrets": "secrets_env",
    "password": "an *_env key",
    "api_key": "an *_env key",
    "apikey": "an *_env key",
    "client_secret": "an *_env key",
}
_DEFAULT_EVENT_TYPE = {
    WebhookScheme.STANDARD_WEBHOOKS: "/type",
    WebhookScheme.GITHUB: "header:x-github-event",
    WebhookScheme.STRIPE: "/type",
}
_DEFAULT_EVENT_ID = {
    WebhookScheme.STANDARD_WEBHOOKS: "header:webhook-id",
    WebhookScheme.GITHUB: "header:x-github-delivery",
    WebhookScheme.STRIPE: "/id",
}


class _Table:
    """One TOML table being read: typed getters, and unknown-key detection at ``finish``."""

    def __init__(self, data: Mapping[str, Any], source: str, dotted: str) -> None:
        self.data, self.source, self.dotted = data, source, dotted
        self.used: set[str] = set()
        # Checked first: a pasted secret must be refused even when other keys are wrong too.
        for key in data:
            if key in _SECRET_KEYS:
                raise self.fail(
                    key,
                    "secrets may not be written in provider files; put the value in an "
                    f"environment variable and name it with {_SECRET_KEYS[key]}",
                )

    def fail(self, key: str | None, problem: str) -> ConfigError:
        path = f"{self.dotted}.{key}" if key else self.dotted
        return ConfigError(f"{self.source}: {path}: {problem}")

    def has(self, key: str) -> bool:
        return key in self.data

    def raw(self, key: str) -> Any:
        self.used.add(key)
        return self.data.get(key)

    def text(self, key: str, default: str | None = None) -> str | None:
        value = self.raw(key)
        if value is None:
            return default
        if not isinstance(value, str) or not value:
            raise self.fail(key, "expected a non-empty string")
        return value

    def required_text(self, key: str) -> str:
        value = self.text(key)
        if value is None:
            raise self.fail(key, "required")
        return value

    def seconds(self, key: str, default: float, *, zero_ok: bool = False) -> float:
        value = self.raw(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(key, "expected a number of seconds")
        if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
            bound = "0 or more" if zero_ok else "greater than 0"
            raise self.fail(key, f"must be {bound}")
        return float(value)

    def integer(self, key: str, default: int, *, minimum: int = 1) -> int:
        value = self.raw(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, "expected an integer")
        if value < minimum:
            raise self.fail(key, f"must be at least {minimum}")
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self.raw(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.fail(key, "expected true or false")
        return value

    def pointer(self, key: str) -> Pointer | None:
        text = self.text(key)
        return None if text is None else self.parse_pointer(text, key)

    def required_pointer(self, key: str) -> Pointer:
        return self.parse_pointer(self.required_text(key), key)

    def fraction(self, key: str, default: float) -> float:
        value = self.raw(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(key, "expected a number")
        if not 0 <= value <= 1:
            raise self.fail(key, "must be between 0 and 1")
        return float(value)

    def parse_pointer(self, text: str, key: str) -> Pointer:
        try:
            return Pointer.parse(text)
        except PointerSyntaxError as exc:
            raise self.fail(key, exc.message) from None

    def header(self, key: str, default: str | None = None) -> str | None:
        value = self.text(key, default)
        if value is not None and not _HEADER_NAME.fullmatch(value):
            raise self.fail(key, "is not a valid HTTP header name")
        return value

    def env_name(self, key: str) -> str:
        value = self.raw(key)
        if value is None:
            raise self.fail(key, "required (the name of an environment variable)")
        # The value is not echoed: someone may have pasted the secret itself here.
        if not isinstance(value, str) or not _ENV_NAME.fullmatch(value):
            raise self.fail(
                key,
                "must name an environment variable (A-Z, 0-9, _); "
                "do not write the secret itself in the file",
            )
        return value

    def method(self, default: str) -> str:
        value = (self.text("method", default) or default).upper()
        if value not in HTTP_METHODS:
            raise self.fail("method", f"expected one of {', '.join(HTTP_METHODS)}")
        return value

    def sub(self, key: str) -> _Table | None:
        value = self.raw(key)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise self.fail(key, "expected a table")
        return _Table(value, self.source, f"{self.dotted}.{key}")

    def required_sub(self, key: str) -> _Table:
        sub = self.sub(key)
        if sub is None:
            raise self.fail(key, "required")
        return sub

    def finish(self) -> None:
        for key in self.data:
            if key in self.used:
                continue
            known = ", ".join(sorted(self.used)) or "none"
            raise self.fail(key, f"unknown key (known here: {known})")


def _template(
    table: _Table, key: str, allowed: frozenset[str], needed: frozenset[str] = frozenset()
) -> str:
    text = table.required_text(key)
    if not text.startswith("/"):
        raise table.fail(key, "must start with '/'")
    if "#" in text or any(ch.isspace() or not ch.isprintable() for ch in text):
        raise table.fail(key, "must not contain '#', spaces or control characters")
    try:
        fields = [(n, s, c) for _, n, s, c in string.Formatter().parse(text) if n is not None]
    except ValueError as exc:
        raise table.fail(key, f"not a valid template: {exc}") from None
    names = {name for name, _, _ in fields}
    placeholders = ", ".join("{" + a + "}" for a in sorted(allowed))
    if not names <= allowed or any(spec or conversion for _, spec, conversion in fields):
        raise table.fail(key, f"only {placeholders} may appear in braces")
    missing = sorted(needed - names)
    if missing:
        raise table.fail(key, f"must contain {{{missing[0]}}}")
    return text


def _base_url(table: _Table) -> str:
    text = table.required_text("base_url")
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise table.fail("base_url", "must be an http:// or https:// URL with a host")
    if parts.username is not None or parts.password is not None:
        raise table.fail("base_url", "must not contain credentials; use auth")
    if parts.query or parts.fragment:
        raise table.fail("base_url", "must not have a query or fragment")
    return text.rstrip("/")


def _auth(table: _Table) -> AuthSpec:
    sub = table.sub("auth")
    if sub is None:
        return AuthSpec()
    try:
        auth_type = AuthType(sub.required_text("type"))
    except ValueError:
        raise sub.fail("type", "expected bearer, header or none") from None
    if auth_type is AuthType.BEARER:
        spec = AuthSpec(auth_type, token_env=sub.env_name("token_env"))
    elif auth_type is AuthType.HEADER:
        header_name = sub.header("name")
        if header_name is None:
            raise sub.fail("name", "required (the header that carries the credential)")
        spec = AuthSpec(auth_type, header_name=header_name, value_env=sub.env_name("value_env"))
    else:
        spec = AuthSpec()
    sub.finish()
    return spec


def _http(table: _Table) -> HttpSpec:
    sub = table.sub("http")
    if sub is None:
        return HttpSpec()
    d = HttpSpec()
    spec = HttpSpec(
        max_connections=sub.integer("max_connections", d.max_connections),
        max_keepalive_connections=sub.integer(
            "max_keepalive_connections", d.max_keepalive_connections, minimum=0
        ),
        keepalive_expiry_seconds=sub.seconds(
            "keepalive_expiry_seconds", d.keepalive_expiry_seconds, zero_ok=True
        ),
        max_response_bytes=sub.integer("max_response_bytes", d.max_response_bytes),
        request_id_header=sub.header("request_id_header"),
    )
    sub.finish()
    return spec


def _idempotency(sub: _Table, header: str | None, path: str) -> IdempotencyMode:
    text = sub.text("idempotency")
    if text is not None:
        try:
            return IdempotencyMode(text)
        except ValueError:
            raise sub.fail("idempotency", "expected header, path, body or none") from None
    if header is not None:
        return IdempotencyMode.HEADER
    if IDEMPOTENCY_KEY in template_fields(path):
        return IdempotencyMode.PATH
    return IdempotencyMode.NONE


def _set_rules(sub: _Table) -> tuple[SetRule, ...]:
    values = sub.raw("set")
    if values is None:
        return ()
    if not isinstance(values, dict):
        raise sub.fail("set", "expected a table of JSON pointer = value")
    return tuple(SetRule(sub.parse_pointer(k, f"set.{k}"), v) for k, v in values.items())


def _duplicate(sub: _Table) -> DuplicateRule | None:
    value = sub.raw("duplicate")
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("status"), list):
        raise sub.fail("duplicate", 'expected { status = [...], body_contains = "..." }')
    return DuplicateRule(tuple(value["status"]), value.get("body_contains"))


def _create(table: _Table) -> CreateSpec:
    sub = table.required_sub("create")
    d = CreateSpec("/", Pointer.parse(""))
    header = sub.header("idempotency_header")
    path = _template(sub, "path", frozenset({IDEMPOTENCY_KEY}))
    spec = CreateSpec(
        idempotency=_idempotency(sub, header, path),
        set=_set_rules(sub),
        duplicate=_duplicate(sub),
        method=sub.method(d.method),
        path=path,
        idempotency_header=header,
        job_id=sub.required_pointer("job_id"),
        state=sub.pointer("state"),
        timeout_seconds=sub.seconds("timeout_seconds", d.timeout_seconds),
        create_deadline_seconds=sub.seconds("create_deadline_seconds", d.create_deadline_seconds),
    )
    sub.finish()
    return spec


def _lookup(table: _Table, create: CreateSpec) -> LookupSpec | None:
    sub = table.sub("lookup")
    if sub is None:
        return None
    path = _template(sub, "path", frozenset({IDEMPOTENCY_KEY}))
    match = sub.raw("match") or {}
    if not isinstance(match, dict):
        raise sub.fail("match", "expected a table of JSON pointer = template")
    if (
        not match
        and create.idempotency_header is None
        and IDEMPOTENCY_KEY not in template_fields(path)
    ):
        raise sub.fail("path", "must contain {idempotency_key}: create has no idempotency_header")
    spec = LookupSpec(
        method=sub.method("GET"),
        path=path,
        job_id=sub.required_pointer("job_id"),
        timeout_seconds=sub.seconds("timeout_seconds", 10.0),
        items=sub.pointer("items"),
        match=tuple((sub.parse_pointer(k, f"match.{k}"), str(v)) for k, v in match.items()),
        pages=sub.integer("pages", 1),
        next=sub.pointer("next"),
        next_param=sub.text("next_param"),
        has_more=sub.pointer("has_more"),
    )
    sub.finish()
    return spec


def _pointer_list(sub: _Table, key: str) -> tuple[Pointer, ...]:
    values = sub.raw(key)
    if values is None:
        return ()
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise sub.fail(key, "expected a list of JSON pointers")
    return tuple(sub.parse_pointer(v, key) for v in values)


def _rules(sub: _Table) -> tuple[StateRule, ...]:
    values = sub.raw("rules")
    if values is None:
        return ()
    if not isinstance(values, list):
        raise sub.fail("rules", "expected a list of inline tables")
    prefix = f"{sub.source}: {sub.dotted}.rules"
    return tuple(StateRule.from_table(v, f"{prefix}[{i}]") for i, v in enumerate(values))


def _status(table: _Table) -> StatusSpec:
    sub = table.required_sub("status")
    spec = StatusSpec(
        method=sub.method("GET"),
        path=_template(sub, "path", frozenset({JOB_ID}), frozenset({JOB_ID})),
        state=sub.required_pointer("state"),
        rules=_rules(sub),
        job_id=sub.pointer("job_id"),
        poll_after_seconds=sub.pointer("poll_after_seconds"),
        next_check_at=sub.pointer("next_check_at"),
        expires_at=sub.pointer("expires_at"),
        error=sub.pointer("error"),
        progress=sub.pointer("progress"),
        result_ref=sub.pointer("result_ref"),
        required=_pointer_list(sub, "required"),
        not_found_grace_seconds=sub.seconds("not_found_grace_seconds", 30.0, zero_ok=True),
        timeout_seconds=sub.seconds("timeout_seconds", 10.0),
        errors_ref=sub.pointer("errors_ref"),
    )
    sub.finish()
    return spec


def _states(table: _Table) -> StateTable:
    sub = table.required_sub("states")
    return StateTable.from_mapping(sub.data, f"{sub.source}: {sub.dotted}")


def _cancel(table: _Table) -> CancelSpec | None:
    sub = table.sub("cancel")
    if sub is None:
        return None
    spec = CancelSpec(
        method=sub.method("POST"),
        path=_template(sub, "path", frozenset({JOB_ID}), frozenset({JOB_ID})),
        timeout_seconds=sub.seconds("timeout_seconds", 10.0),
        cancel_deadline_seconds=sub.seconds("cancel_deadline_seconds", 120.0),
    )
    sub.finish()
    return spec


def _sourced(sub: _Table, key: str, text: Any) -> SourcedPointer:
    if not isinstance(text, str):
        raise sub.fail(key, "expected a JSON pointer (optionally prefixed with 'status:')")
    if text.startswith(STATUS_PREFIX):
        return SourcedPointer("status", sub.parse_pointer(text[len(STATUS_PREFIX) :], key))
    return SourcedPointer("result", sub.parse_pointer(text, key))


def _summary(sub: _Table) -> tuple[tuple[str, SourcedPointer], ...]:
    values = sub.raw("summary")
    if values is None:
        return ()
    if not isinstance(values, dict):
        raise sub.fail("summary", "expected a table of name = pointer")
    return tuple((name, _sourced(sub, f"summary.{name}", v)) for name, v in values.items())


def _result(table: _Table, status: StatusSpec) -> ResultSpec | None:
    sub = table.sub("result")
    if sub is None:
        return None
    path = None
    if sub.has("path"):
        path = _template(sub, "path", frozenset({JOB_ID, RESULT_REF}))
    from_status = sub.pointer("from_status")
    if path is not None and from_status is not None:
        raise sub.fail("from_status", "give either path or from_status, not both")
    needs_ref = from_status is None and (path is None or RESULT_REF in template_fields(path))
    if needs_ref and status.result_ref is None:
        raise sub.fail("path", "fetching by result_ref needs status.result_ref")
    required = sub.raw("required")
    if required is not None and not isinstance(required, list):
        raise sub.fail("required", "expected a list of JSON pointers")
    failed = sub.raw("failed_items")
    lines = sub.raw("failed_lines") or []
    if not isinstance(lines, list) or not all(isinstance(t, dict) for t in lines):
        raise sub.fail("failed_lines", "expected a list of inline tables")
    d = ResultSpec()
    spec = ResultSpec(
        path=path,
        from_status=from_status,
        method=sub.method("GET"),
        required=tuple(_sourced(sub, "required", v) for v in required or ()),
        summary=_summary(sub),
        failed_items=None if failed is None else _sourced(sub, "failed_items", failed),
        content_type=sub.text("content_type"),
        max_bytes=sub.integer("max_bytes", d.max_bytes),
        checksum=sub.pointer("checksum"),
        size=sub.pointer("size"),
        timeout_seconds=sub.seconds("timeout_seconds", d.timeout_seconds),
        failed_lines=tuple(
            LineTest(
                sub.parse_pointer(str(t.get("pointer", "")), "failed_lines"),
                present=t.get("present"),
                equals=t.get("equals"),
                in_=None if t.get("in") is None else tuple(t["in"]),
            )
            for t in lines
        ),
        errors_path=sub.text("errors_path"),
    )
    sub.finish()
    return spec


def _field_source(sub: _Table, key: str, text: str) -> FieldSource:
    if text.startswith(HEADER_PREFIX):
        name = text[len(HEADER_PREFIX) :]
        if not _HEADER_NAME.fullmatch(name):
            raise sub.fail(key, "is not a valid header name after 'header:'")
        return FieldSource(header=name.lower())
    return FieldSource(pointer=sub.parse_pointer(text, key))


def _webhook(table: _Table) -> WebhookSpec | None:
    sub = table.sub("webhook")
    if sub is None:
        return None
    try:
        scheme = WebhookScheme(sub.required_text("scheme"))
    except ValueError:
        known = ", ".join(s.value for s in WebhookScheme)
        raise sub.fail("scheme", f"expected one of {known}") from None
    event_id = sub.text("event_id", _DEFAULT_EVENT_ID.get(scheme))
    if event_id is None:
        raise sub.fail("event_id", f"required for the {scheme.value} scheme")
    event_type = sub.text("event_type", _DEFAULT_EVENT_TYPE.get(scheme))
    types = sub.raw("types") or []
    if not isinstance(types, list) or not all(isinstance(t, str) and t for t in types):
        raise sub.fail("types", "expected a list of event type names")
    signature_header = sub.header("signature_header")
    if signature_header is not None and scheme is not WebhookScheme.HMAC_SHA256:
        raise sub.fail("signature_header", "applies only to the hmac-sha256 scheme")
    spec = WebhookSpec(
        scheme=scheme,
        secrets_env=sub.env_name("secrets_env"),
        job_id=_field_source(sub, "job_id", sub.required_text("job_id")),
        event_id=_field_source(sub, "event_id", event_id),
        tolerance_seconds=sub.integer("tolerance_seconds", 300),
        max_body_bytes=sub.integer("max_body_bytes", 262_144),
        signature_header=None if signature_header is None else signature_header.lower(),
        types=tuple(types),
        event_type=None if event_type is None else _field_source(sub, "event_type", event_type),
    )
    sub.finish()
    return spec


def _trust_mode(sub: _Table, has_webhook: bool) -> TrustMode:
    default = TrustMode.ADAPTIVE if has_webhook else TrustMode.OFF
    text = sub.text("webhook_trust")
    if text is None:
        return default
    try:
        mode = TrustMode(text)
    except ValueError:
        choices = " or ".join(f'"{m.value}"' for m in TrustMode)
        raise sub.fail("webhook_trust", f"expected {choices}") from None
    if mode is TrustMode.ADAPTIVE and not has_webhook:
        raise sub.fail(
            "webhook_trust",
            '"adaptive" needs a [webhook] table: trust is earned from verified webhooks',
        )
    return mode


def _polling(table: _Table, has_webhook: bool) -> PollingSpec:
    sub = table.sub("polling")
    if sub is None:
        return PollingSpec(
            webhook_trust=TrustMode.ADAPTIVE if has_webhook else TrustMode.OFF,
        )
    d = PollingSpec()
    cap = sub.raw("trusted_max_delay_seconds")
    spec = PollingSpec(
        base_delay_seconds=sub.seconds("base_delay_seconds", d.base_delay_seconds),
        max_delay_seconds=sub.seconds("max_delay_seconds", d.max_delay_seconds),
        jitter_floor=sub.fraction("jitter_floor", d.jitter_floor),
        deadline_seconds=sub.seconds("deadline_seconds", d.deadline_seconds),
        max_status_requests=sub.integer("max_status_requests", d.max_status_requests),
        max_transport_failures=sub.integer("max_transport_failures", d.max_transport_failures),
        max_rate_limited=sub.integer("max_rate_limited", d.max_rate_limited),
        rate_limit_delay_seconds=sub.seconds(
            "rate_limit_delay_seconds", d.rate_limit_delay_seconds
        ),
        webhook_trust=_trust_mode(sub, has_webhook),
        trust_after=sub.integer("trust_after", d.trust_after),
        trusted_max_delay_seconds=(
            None if cap is None else sub.seconds("trusted_max_delay_seconds", 1.0)
        ),
        distrust_after_misses=sub.integer("distrust_after_misses", d.distrust_after_misses),
        webhook_grace_seconds=sub.seconds(
            "webhook_grace_seconds", d.webhook_grace_seconds, zero_ok=True
        ),
        rate_limit_reset=_reset_header(sub),
    )
    if spec.max_delay_seconds < spec.base_delay_seconds:
        raise sub.fail("max_delay_seconds", "must be at least base_delay_seconds")
    stretched = spec.trusted_max_delay_seconds
    if stretched is not None and stretched < spec.max_delay_seconds:
        raise sub.fail(
            "trusted_max_delay_seconds",
            "must be at least max_delay_seconds: trust only ever lengthens the wait",
        )
    sub.finish()
    return spec


def _reset_header(sub: _Table) -> str | None:
    text = sub.text("rate_limit_reset")
    if text is None:
        return None
    name = text[len(HEADER_PREFIX) :] if text.startswith(HEADER_PREFIX) else ""
    if not _HEADER_NAME.fullmatch(name):
        raise sub.fail("rate_limit_reset", "expected 'header:NAME'")
    return name.lower()


def _static_headers(table: _Table) -> tuple[tuple[str, str], ...]:
    values = table.raw("headers")
    if values is None:
        return ()
    if not isinstance(values, dict) or not all(isinstance(v, str) for v in values.values()):
        raise table.fail("headers", 'expected a table of NAME = "value"')
    return tuple((str(k), v) for k, v in values.items())


def _adapter(table: _Table) -> str | None:
    ref = table.text("adapter")
    if ref is not None and not _IMPORT_REF.fullmatch(ref):
        raise table.fail("adapter", "expected 'package.module:ClassName'")
    return ref


MAX_DESCRIPTION = 2000


def _description(table: _Table) -> str | None:
    text = table.text("description")
    if text is not None and (not text.strip() or len(text) > MAX_DESCRIPTION):
        raise table.fail("description", f"expected 1 to {MAX_DESCRIPTION} characters of text")
    return text


def _request_schema(table: _Table, name: str) -> RequestSchema | None:
    if not table.has("request_schema"):
        return None
    try:
        return RequestSchema.compile(name, table.raw("request_schema"))
    except SchemaProblem as exc:
        raise table.fail("request_schema", str(exc)) from None


def parse_provider(name: str, data: Any, source: str, public_url: str = "") -> ProviderSpec:
    """Validate one ``[providers.NAME]`` table; raises ``ConfigError`` on the first problem."""
    dotted = f"providers.{name}"
    if not _NAME.fullmatch(name):
        raise ConfigError(f"{source}: {dotted}: names use letters, digits, '_', '.', '-'")
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: {dotted}: expected a table")
    table = _Table(data, source, dotted)
    base_url, auth = _base_url(table), _auth(table)
    trace_header = table.header("trace_header", "X-Trace-ID") or "X-Trace-ID"
    adapter, job_id_slashes = _adapter(table), table.flag("job_id_slashes", False)
    http = _http(table)
    create = _create(table)
    status = _status(table)
    webhook = _webhook(table)
    spec = ProviderSpec(
        name=name,
        source=source,
        base_url=base_url,
        auth=auth,
        trace_header=trace_header,
        adapter=adapter,
        job_id_slashes=job_id_slashes,
        http=http,
        create=create,
        lookup=_lookup(table, create),
        status=status,
        states=_states(table),
        cancel=_cancel(table),
        result=_result(table, status),
        webhook=webhook,
        polling=_polling(table, webhook is not None),
        description=_description(table),
        request_schema=_request_schema(table, name),
        headers=_static_headers(table),
        webhook_url=f"{public_url.rstrip('/')}/webhooks/{name}" if public_url else None,
    )
    table.finish()
    return spec


def _read_toml(file: Path) -> dict[str, Any]:
    try:
        with file.open("rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: not valid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read: {exc.strerror}") from None


def _file_tables(file: Path) -> Mapping[str, Any]:
    data = _read_toml(file)
    for key in data:
        if key != "providers":
            raise ConfigError(f"{file}: {key}: unknown key; a provider file holds [providers.NAME]")
    tables = data.get("providers")
    if not isinstance(tables, dict) or not tables:
        raise ConfigError(f"{file}: providers: no [providers.NAME] table in the file")
    return tables


def load_providers(
    directory: Path | None,
    inline: Mapping[str, Any],
    environ: Mapping[str, str],
    *,
    missing_ok: bool = False,
    check_secrets: bool = True,
    public_url: str = "",
) -> dict[str, ProviderSpec]:
    """Every ``*.toml`` in ``directory`` plus the inline tables, validated, by name.

    Credentials and webhook secrets must be present in ``environ`` (checked here, so a
    missing variable stops the start), unless ``check_secrets`` is false: a command
    that calls no provider (``reconciler decide``) reads the files for their limits.
    A missing ``directory`` is an error unless ``missing_ok`` (for the default
    directory that nobody created).
    """
    sources: list[tuple[str, Mapping[str, Any]]] = []
    if directory is not None:
        if directory.is_dir():
            sources.extend((str(f), _file_tables(f)) for f in sorted(directory.glob("*.toml")))
        elif not missing_ok:
            raise ConfigError(f"{directory}: providers directory not found")
    if inline:
        sources.append((INLINE_SOURCE, inline))
    specs: dict[str, ProviderSpec] = {}
    for source, tables in sources:
        for name, data in tables.items():
            if name in specs:
                raise ConfigError(
                    f"{source}: providers.{name}: already defined in {specs[name].source}"
                )
            spec = parse_provider(name, data, source, public_url)
            if check_secrets:
                auth_secret(spec, environ)
                webhook_secrets(spec, environ)
            specs[name] = spec
    return specs
