"""Provider files: a full example loads with every key; each kind of mistake is one clear line."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from reconciler.core.backoff import BackoffPolicy
from reconciler.core.clock import ManualClock
from reconciler.core.errors import ConfigError
from reconciler.core.signatures import WebhookScheme
from reconciler.core.trust import TrustMode
from reconciler.core.vocabulary import RemoteCategory
from reconciler.providers.credentials import build_credential
from reconciler.providers.loader import load_providers, parse_provider
from reconciler.providers.pointer import MISSING
from reconciler.providers.secrets import webhook_secrets
from reconciler.providers.spec import INLINE_SOURCE, AuthType, ProviderSpec
from tests.support.provider_tables import with_key

SPEC_EXAMPLE = """\
[providers.acme]
base_url = "http://127.0.0.1:9000"
auth = { type = "bearer", token_env = "ACME_TOKEN" }   # or "header", "none"
trace_header = "X-Trace-ID"

[providers.acme.create]
method = "POST"
path = "/v1/jobs"
idempotency_header = "Idempotency-Key"
job_id = "/job_id"                  # JSON pointer into the create response
timeout_seconds = 10
create_deadline_seconds = 120       # how long we try to establish the job ID

[providers.acme.lookup]             # reconciliation after an ambiguous create
path = "/v1/jobs?idempotency_key={idempotency_key}"
job_id = "/data/0/job_id"           # absent => not found

[providers.acme.status]
path = "/v1/jobs/{job_id}"
state = "/state"
poll_after_seconds = "/poll_after_seconds"   # optional provider hint
next_check_at = "/next_check_at"             # optional provider hint (RFC 3339)
expires_at = "/expires_at"                   # optional: running past it => escalate
error = "/error"
progress = "/progress"
result_ref = "/result/url"                   # required on success
not_found_grace_seconds = 30                 # 404 right after create may be eventual consistency

[providers.acme.states]
pending   = ["queued", "running", "processing"]
success   = ["succeeded"]
partial   = ["completed_with_errors"]
failure   = ["failed"]
cancelled = ["cancelled", "canceled"]
expired   = ["expired"]
# anything else is unknown => stop and escalate (unknown_state)

[providers.acme.cancel]
method = "POST"
path = "/v1/jobs/{job_id}/cancel"

[providers.acme.result]
path = "/v1/jobs/{job_id}/result"   # or fetch result_ref when it is a URL
required = ["/rows"]                # pointers that must exist
summary = { processed = "/summary/processed", failed = "/summary/failed" }

[providers.acme.webhook]
scheme = "standard-webhooks"        # | "stripe" | "github" | "hmac-sha256"
secrets_env = "ACME_WEBHOOK_SECRETS"  # comma-separated: rotation
tolerance_seconds = 300
event_id = "header:webhook-id"      # or a JSON pointer such as "/id"
job_id = "/data/job_id"
max_body_bytes = 262144

[providers.acme.polling]
base_delay_seconds = 5
max_delay_seconds = 120
jitter_floor = 0.5                  # actual delay in [floor*raw, raw]
deadline_seconds = 2400
max_status_requests = 12
max_transport_failures = 3
"""

ENV = {"ACME_TOKEN": "tok-secret-123", "ACME_WEBHOOK_SECRETS": "whsec_b2xk, whsec_bmV3"}

MINIMAL: dict[str, Any] = {
    "base_url": "https://api.example.com/v2/",
    "create": {"path": "/jobs", "job_id": "/id", "idempotency": "none"},
    "status": {"path": "/jobs/{job_id}", "state": "/state"},
    "states": {"pending": ["running"], "success": ["done"]},
}


def _write(directory: Path, name: str, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(textwrap.dedent(text))
    return path


def _load_one(tmp_path: Path, text: str, environ: dict[str, str] | None = None) -> ProviderSpec:
    directory = tmp_path / "providers"
    _write(directory, "acme.toml", text)
    specs = load_providers(directory, {}, ENV if environ is None else environ)
    assert list(specs) == ["acme"]
    return specs["acme"]


def _error(tmp_path: Path, text: str, environ: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as caught:
        _load_one(tmp_path, text, environ)
    message = caught.value.message
    assert "\n" not in message
    return message


def _inline_error(data: dict[str, Any], environ: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as caught:
        load_providers(None, {"acme": data}, environ or {})
    message = caught.value.message
    assert "\n" not in message
    return message


def _with(path: str, value: Any) -> dict[str, Any]:
    """MINIMAL with one dotted key set (or removed when value is MISSING)."""
    return with_key(MINIMAL, path, value)


def test_spec_example_loads_with_every_key(tmp_path: Path) -> None:
    spec = _load_one(tmp_path, SPEC_EXAMPLE)
    assert spec.name == "acme"
    assert spec.source == str(tmp_path / "providers" / "acme.toml")
    assert spec.base_url == "http://127.0.0.1:9000"
    assert spec.auth.type is AuthType.BEARER and spec.auth.token_env == "ACME_TOKEN"
    assert spec.trace_header == "X-Trace-ID"
    assert (spec.create.method, spec.create.path) == ("POST", "/v1/jobs")
    assert spec.create.idempotency_header == "Idempotency-Key"
    assert str(spec.create.job_id) == "/job_id"
    assert (spec.create.timeout_seconds, spec.create.create_deadline_seconds) == (10.0, 120.0)
    assert spec.lookup is not None
    assert spec.lookup.path == "/v1/jobs?idempotency_key={idempotency_key}"
    assert spec.lookup.job_id.resolve({"data": [{"job_id": "j1"}]}) == "j1"
    status = spec.status
    assert status.path == "/v1/jobs/{job_id}"
    pointers = [
        status.state,
        status.poll_after_seconds,
        status.next_check_at,
        status.expires_at,
        status.error,
        status.progress,
        status.result_ref,
    ]
    assert [str(p) for p in pointers] == [
        "/state",
        "/poll_after_seconds",
        "/next_check_at",
        "/expires_at",
        "/error",
        "/progress",
        "/result/url",
    ]
    assert status.not_found_grace_seconds == 30.0
    assert spec.states.category_of("processing") is RemoteCategory.PENDING
    assert spec.states.category_of("canceled") is RemoteCategory.CANCELLED
    assert spec.states.category_of("paused") is RemoteCategory.UNKNOWN
    assert spec.cancel is not None and spec.cancel.path == "/v1/jobs/{job_id}/cancel"
    assert spec.result is not None and spec.result.path == "/v1/jobs/{job_id}/result"
    assert [str(p) for p in spec.result.required] == ["/rows"]
    assert [(n, str(p)) for n, p in spec.result.summary] == [
        ("processed", "/summary/processed"),
        ("failed", "/summary/failed"),
    ]
    webhook = spec.webhook
    assert webhook is not None
    assert webhook.scheme is WebhookScheme.STANDARD_WEBHOOKS
    assert webhook.secrets_env == "ACME_WEBHOOK_SECRETS"
    assert (webhook.tolerance_seconds, webhook.max_body_bytes) == (300, 262144)
    assert webhook.event_id.extract({"webhook-id": "msg_1"}, {}) == "msg_1"
    assert webhook.job_id.extract({}, {"data": {"job_id": "j1"}}) == "j1"
    polling = spec.polling
    assert (polling.base_delay_seconds, polling.max_delay_seconds) == (5.0, 120.0)
    assert (polling.jitter_floor, polling.deadline_seconds) == (0.5, 2400.0)
    assert (polling.max_status_requests, polling.max_transport_failures) == (12, 3)
    assert polling.backoff() == BackoffPolicy(5.0, 120.0, 0.5)


def test_defaults_where_the_spec_implies_them() -> None:
    spec = parse_provider("acme", MINIMAL, INLINE_SOURCE)
    assert spec.base_url == "https://api.example.com/v2"  # trailing slash dropped
    assert spec.auth.type is AuthType.NONE
    assert spec.trace_header == "X-Trace-ID"
    assert spec.create.method == "POST" and spec.create.idempotency_header is None
    assert (spec.create.timeout_seconds, spec.create.create_deadline_seconds) == (10.0, 120.0)
    assert spec.status.method == "GET" and spec.status.not_found_grace_seconds == 30.0
    assert spec.lookup is None and spec.cancel is None and spec.result is None
    assert spec.webhook is None and spec.adapter is None and not spec.job_id_slashes
    p = spec.polling
    assert (p.base_delay_seconds, p.max_delay_seconds, p.jitter_floor) == (5.0, 120.0, 0.5)
    assert (p.deadline_seconds, p.max_status_requests, p.max_transport_failures) == (2400.0, 12, 3)
    assert (p.max_rate_limited, p.rate_limit_delay_seconds) == (3, 60.0)
    assert spec.http.max_response_bytes == 1_048_576


def test_section_defaults_for_optional_tables() -> None:
    data = _with("cancel", {"path": "/jobs/{job_id}/cancel"})
    data["result"] = {"path": "/jobs/{job_id}/out"}
    data["webhook"] = {"scheme": "standard-webhooks", "secrets_env": "W", "job_id": "/job"}
    spec = parse_provider("acme", data, INLINE_SOURCE)
    assert spec.cancel is not None
    assert (spec.cancel.method, spec.cancel.cancel_deadline_seconds) == ("POST", 120.0)
    assert spec.result is not None and spec.result.max_bytes == 16 * 1_048_576
    assert spec.webhook is not None
    assert (spec.webhook.tolerance_seconds, spec.webhook.max_body_bytes) == (300, 262144)
    assert str(spec.webhook.event_id) == "header:webhook-id"


def test_extra_keys_of_this_design(tmp_path: Path) -> None:
    text = """\
    [providers.acme]
    base_url = "https://ops.example.com"
    adapter = "tests.unit.test_provider_files:Nothing"
    job_id_slashes = true
    auth = { type = "header", name = "X-Api-Key", value_env = "ACME_KEY" }

    [providers.acme.http]
    max_connections = 4
    request_id_header = "X-Ops-Request"

    [providers.acme.create]
    path = "/jobs"
    job_id = "/name"
    state = "/state"
    idempotency = "none"

    [providers.acme.status]
    path = "/{job_id}"
    state = "/done"
    job_id = "/name"
    required = ["/response"]
    rules = [{ pointer = "/done", present = false, category = "pending" }]

    [providers.acme.states]
    pending = ["false"]
    success = ["true"]

    [providers.acme.cancel]
    path = "/{job_id}:cancel"
    cancel_deadline_seconds = 30

    [providers.acme.result]
    from_status = "/response"
    required = ["/rows", "status:/metadata/total"]
    failed_items = "/errors"
    content_type = "application/json"
    max_bytes = 4096
    checksum = "/result/sha256"
    size = "/result/size"
    summary = { total = "status:/metadata/total" }

    [providers.acme.webhook]
    scheme = "hmac-sha256"
    secrets_env = "ACME_HOOK"
    signature_header = "X-Ops-Signature"
    event_id = "/event/id"
    job_id = "header:X-Ops-Job"

    [providers.acme.polling]
    max_rate_limited = 5
    rate_limit_delay_seconds = 90
    """
    spec = _load_one(tmp_path, text, {"ACME_KEY": "k", "ACME_HOOK": "s"})
    assert spec.adapter == "tests.unit.test_provider_files:Nothing"
    assert spec.job_id_slashes
    assert spec.auth.header_name == "X-Api-Key" and spec.auth.value_env == "ACME_KEY"
    assert (spec.http.max_connections, spec.http.request_id_header) == (4, "X-Ops-Request")
    assert spec.classify({"name": "x"}).category is RemoteCategory.PENDING
    assert spec.classify({"done": True}).category is RemoteCategory.SUCCESS
    result = spec.result
    assert result is not None
    assert [str(r) for r in result.required] == ["/rows", "status:/metadata/total"]
    assert result.required[1].resolve({"rows": []}, {"metadata": {"total": 3}}) == 3
    assert (result.content_type, result.max_bytes) == ("application/json", 4096)
    assert (str(result.checksum), str(result.size)) == ("/result/sha256", "/result/size")
    assert spec.cancel is not None and spec.cancel.cancel_deadline_seconds == 30.0
    webhook = spec.webhook
    assert webhook is not None and webhook.signature_header == "x-ops-signature"
    assert webhook.job_id.extract({"x-ops-job": "j9"}, None) == "j9"
    assert (spec.polling.max_rate_limited, spec.polling.rate_limit_delay_seconds) == (5, 90.0)


def test_inline_providers_and_files_load_together(tmp_path: Path) -> None:
    directory = tmp_path / "providers"
    _write(directory, "acme.toml", SPEC_EXAMPLE)
    _write(directory, "notes.txt", "not a provider file")
    specs = load_providers(directory, {"beta": MINIMAL}, ENV)
    assert sorted(specs) == ["acme", "beta"]
    assert specs["beta"].source == INLINE_SOURCE


def test_one_file_may_hold_several_providers(tmp_path: Path) -> None:
    directory = tmp_path / "providers"
    text = SPEC_EXAMPLE + SPEC_EXAMPLE.replace("providers.acme", "providers.acme2")
    _write(directory, "both.toml", text)
    assert sorted(load_providers(directory, {}, ENV)) == ["acme", "acme2"]


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="providers directory not found"):
        load_providers(tmp_path / "absent", {}, {})
    assert load_providers(tmp_path / "absent", {}, {}, missing_ok=True) == {}
    assert load_providers(None, {}, {}) == {}


# --- every kind of validation error, each naming file and dotted key -----------------------


def test_required_key_missing(tmp_path: Path) -> None:
    text = SPEC_EXAMPLE.replace('path = "/v1/jobs/{job_id}"\nstate', "state")
    message = _error(tmp_path, text)
    assert (
        message == f"{tmp_path / 'providers' / 'acme.toml'}: providers.acme.status.path: required"
    )


def test_jitter_floor_out_of_range(tmp_path: Path) -> None:
    message = _error(tmp_path, SPEC_EXAMPLE.replace("jitter_floor = 0.5", "jitter_floor = 1.5"))
    assert message.endswith(
        "acme.toml: providers.acme.polling.jitter_floor: must be between 0 and 1"
    )


@pytest.mark.parametrize(
    ("old", "new", "key"),
    [
        ('trace_header = "X-Trace-ID"', 'trace_heder = "X-Trace-ID"', "providers.acme.trace_heder"),
        ("max_status_requests = 12", "max_status_request = 12", "polling.max_status_request"),
        ('state = "/state"', 'state = "/state"\nstates = "/x"', "status.states"),
        ("[providers.acme.cancel]", "[providers.acme.cancle]", "providers.acme.cancle"),
    ],
)
def test_unknown_keys_are_errors(tmp_path: Path, old: str, new: str, key: str) -> None:
    message = _error(tmp_path, SPEC_EXAMPLE.replace(old, new, 1))
    assert f": {key}: unknown key" in message or f".{key}: unknown key" in message


def test_unknown_top_level_key_in_a_file(tmp_path: Path) -> None:
    message = _error(tmp_path, 'name = "acme"\n' + SPEC_EXAMPLE)
    assert message.endswith("acme.toml: name: unknown key; a provider file holds [providers.NAME]")


def test_file_without_providers(tmp_path: Path) -> None:
    directory = tmp_path / "providers"
    _write(directory, "empty.toml", "# nothing yet\n")
    with pytest.raises(ConfigError, match=r"empty\.toml: providers: no \[providers.NAME\] table"):
        load_providers(directory, {}, {})


def test_invalid_toml_names_the_file(tmp_path: Path) -> None:
    message = _error(tmp_path, "[providers.acme\n")
    assert message.startswith(f"{tmp_path / 'providers' / 'acme.toml'}: not valid TOML")


ONLY_JOB_FIELDS = (
    "status.path: only {idempotency_key}, {idempotency_key_alnum}, {job_id}, {operation_id}, "
    "{trace_id}, {webhook_url} may appear in braces"
)


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        (
            "status.path",
            "/jobs/{id}",
            ONLY_JOB_FIELDS,
        ),
        (
            "status.path",
            "/jobs/{job_id!r}",
            ONLY_JOB_FIELDS,
        ),
        (
            "status.path",
            "/jobs/{job_id:>10}",
            ONLY_JOB_FIELDS,
        ),
        ("status.path", "/jobs", "status.path: must contain {job_id}"),
        ("status.path", "jobs/{job_id}", "status.path: must start with '/'"),
        ("status.path", "/jobs/{job_id", "status.path: not a valid template"),
        ("status.path", "/jobs/{job_id}#x", "status.path: must not contain '#'"),
        (
            "create.path",
            "/jobs/{job_id}",
            "create.path: only {idempotency_key}, {idempotency_key_alnum}, {operation_id}",
        ),
        ("status.path", "/jobs/{result_ref}/{job_id}", "status.path: only {idempotency_key}"),
    ],
)
def test_path_templates(key: str, value: str, fragment: str) -> None:
    message = _inline_error(_with(key, value))
    assert message.startswith(f"{INLINE_SOURCE}: providers.acme.")
    assert fragment in message


def test_result_path_may_use_result_ref() -> None:
    data = _with("status.result_ref", "/output_file_id")
    data["result"] = {"path": "/files/{result_ref}/content"}
    assert parse_provider("acme", data, INLINE_SOURCE).result is not None
    data["status"].pop("result_ref")
    message = _inline_error(data)
    assert "result.path: fetching by result_ref needs status.result_ref" in message


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("ftp://files.example.com", "must be an http:// or https:// URL"),
        ("api.example.com", "must be an http:// or https:// URL"),
        ("http://user:pw@api.example.com", "must not contain credentials"),
        ("https://api.example.com/?k=1", "must not have a query"),
        (42, "expected a non-empty string"),
    ],
)
def test_base_url_must_be_http(value: Any, fragment: str) -> None:
    message = _inline_error(_with("base_url", value))
    assert message.startswith(f"{INLINE_SOURCE}: providers.acme.base_url: ")
    assert fragment in message
    assert "pw" not in message


def test_duplicate_names_across_files(tmp_path: Path) -> None:
    directory = tmp_path / "providers"
    _write(directory, "a.toml", SPEC_EXAMPLE)
    _write(directory, "b.toml", SPEC_EXAMPLE)
    with pytest.raises(ConfigError) as caught:
        load_providers(directory, {}, ENV)
    assert caught.value.message == (
        f"{directory / 'b.toml'}: providers.acme: already defined in {directory / 'a.toml'}"
    )


def test_duplicate_name_between_file_and_inline(tmp_path: Path) -> None:
    directory = tmp_path / "providers"
    _write(directory, "a.toml", SPEC_EXAMPLE)
    with pytest.raises(ConfigError, match=f"^{INLINE_SOURCE}: providers.acme: already defined"):
        load_providers(directory, {"acme": MINIMAL}, ENV)


@pytest.mark.parametrize(
    ("auth", "key", "hint"),
    [
        ({"type": "bearer", "token": "sk-live-abc123"}, "auth.token", "token_env"),
        ({"type": "header", "name": "X-Api-Key", "value": "abc123"}, "auth.value", "value_env"),
        ({"type": "bearer", "api_key": "abc123"}, "auth.api_key", "an *_env key"),
    ],
)
def test_inline_secrets_are_refused(auth: dict[str, str], key: str, hint: str) -> None:
    message = _inline_error(_with("auth", auth))
    assert f"providers.acme.{key}: secrets may not be written in provider files" in message
    assert f"environment variable and name it with {hint}" in message
    assert "abc123" not in message


def test_inline_webhook_secret_is_refused() -> None:
    data = _with(
        "webhook", {"scheme": "standard-webhooks", "secrets": "whsec_abc123", "job_id": "/j"}
    )
    message = _inline_error(data)
    assert "providers.acme.webhook.secrets: secrets may not be written" in message
    assert "secrets_env" in message and "abc123" not in message


@pytest.mark.parametrize("value", ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "sk-live-abc123", ""])
def test_a_secret_pasted_into_an_env_key_is_refused_without_echo(value: str) -> None:
    message = _inline_error(_with("auth", {"type": "bearer", "token_env": value}))
    assert "providers.acme.auth.token_env: must name an environment variable" in message
    assert value not in message or not value


@pytest.mark.parametrize(
    ("auth", "fragment"),
    [
        (
            {"type": "basic"},
            "auth.type: expected one of bearer, header, none, aws_sigv4, google, oauth2",
        ),
        ({"token_env": "T"}, "auth.type: required"),
        ({"type": "bearer"}, "auth.token_env: required"),
        ({"type": "header", "value_env": "K"}, "auth.name: required"),
        ({"type": "header", "name": "X Key", "value_env": "K"}, "auth.name: is not a valid"),
        ({"type": "none", "token_env": "T"}, "auth.token_env: unknown key"),
    ],
)
def test_auth_table_errors(auth: dict[str, str], fragment: str) -> None:
    assert fragment in _inline_error(_with("auth", auth))


def test_missing_environment_variable_names_the_variable(tmp_path: Path) -> None:
    message = _error(tmp_path, SPEC_EXAMPLE, {"ACME_WEBHOOK_SECRETS": "whsec_b2xk"})
    assert message.endswith(
        "acme.toml: providers.acme.auth.token_env: environment variable ACME_TOKEN is not set"
    )
    message = _error(tmp_path, SPEC_EXAMPLE, {"ACME_TOKEN": "tok-secret-123"})
    assert message.endswith(
        "providers.acme.webhook.secrets_env: environment variable ACME_WEBHOOK_SECRETS is not set"
    )


def test_empty_environment_variable_is_an_error_without_the_value(tmp_path: Path) -> None:
    message = _error(tmp_path, SPEC_EXAMPLE, {**ENV, "ACME_TOKEN": "  "})
    assert message.endswith(
        "providers.acme.auth.token_env: environment variable ACME_TOKEN is empty"
    )


def test_secrets_come_from_the_injected_environment(tmp_path: Path) -> None:
    spec = _load_one(tmp_path, SPEC_EXAMPLE)
    credential = build_credential(spec.auth, spec.where, ENV, ManualClock())
    assert credential is not None
    assert credential.static_header() == ("Authorization", "Bearer tok-secret-123")
    assert "tok-secret-123" not in repr(credential) and "tok-secret-123" not in repr(spec)
    assert credential.source == "bearer token from environment variable ACME_TOKEN"
    secrets = webhook_secrets(spec.webhook, spec.where, ENV)
    assert [s.reveal() for s in secrets] == ["whsec_b2xk", "whsec_bmV3"]
    assert "whsec" not in repr(secrets)
    none = parse_provider("n", MINIMAL, INLINE_SOURCE)
    assert build_credential(none.auth, none.where, {}, ManualClock()) is None


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("polling.base_delay_seconds", 0, "must be greater than 0"),
        ("polling.deadline_seconds", -5, "must be greater than 0"),
        ("polling.deadline_seconds", float("inf"), "must be greater than 0"),
        ("polling.max_status_requests", 0, "must be at least 1"),
        ("polling.max_status_requests", 2.5, "expected an integer"),
        ("polling.max_transport_failures", True, "expected an integer"),
        ("polling.jitter_floor", -0.1, "must be between 0 and 1"),
        ("polling.max_delay_seconds", 1, "must be at least base_delay_seconds"),
        ("polling.base_delay_seconds", "5", "expected a number of seconds"),
        ("create.timeout_seconds", 0, "create.timeout_seconds: must be greater than 0"),
        ("status.not_found_grace_seconds", -1, "must be 0 or more"),
        ("create.method", "FETCH", "create.method: expected one of GET, POST"),
        ("create.job_id", "job_id", "create.job_id: 'job_id': a JSON pointer"),
        ("create.job_id", MISSING, "create.job_id: required"),
        ("status.state", "/a~2", "status.state: '/a~2': '~' must be followed by 0 or 1"),
        ("status.required", "/rows", "status.required: expected a list of JSON pointers"),
        ("status.rules", {"pointer": "/x"}, "status.rules: expected a list"),
        ("trace_header", "X Trace", "trace_header: is not a valid HTTP header name"),
        ("create.idempotency_header", "", "expected a non-empty string"),
        ("states", MISSING, "providers.acme.states: required"),
        ("status", "GET /x", "providers.acme.status: expected a table"),
        ("adapter", "module.without.class", "adapter: expected 'package.module:ClassName'"),
        ("job_id_slashes", "yes", "job_id_slashes: expected true or false"),
        ("http.max_connections", 0, "http.max_connections: must be at least 1"),
    ],
)
def test_value_errors(key: str, value: Any, fragment: str) -> None:
    message = _inline_error(_with(key, value))
    assert message.startswith(f"{INLINE_SOURCE}: providers.acme")
    assert fragment in message


def test_provider_name_is_checked() -> None:
    with pytest.raises(ConfigError, match=r"providers\.a b: names use letters"):
        load_providers(None, {"a b": MINIMAL}, {})


def test_lookup_needs_a_way_to_carry_the_key() -> None:
    data = _with("lookup", {"path": "/jobs", "job_id": "/data/0/id"})
    message = _inline_error(data)
    assert (
        "lookup.path: must contain {idempotency_key}: create has no idempotency_header" in message
    )
    data["create"]["idempotency_header"] = "Idempotency-Key"
    data["create"].pop("idempotency")  # "header" follows from idempotency_header
    assert parse_provider("acme", data, INLINE_SOURCE).lookup is not None


@pytest.mark.parametrize(
    ("webhook", "fragment"),
    [
        ({"scheme": "svix", "secrets_env": "W", "job_id": "/j"}, "webhook.scheme: expected one of"),
        ({"scheme": "github", "job_id": "/j"}, "webhook.secrets_env: required"),
        ({"scheme": "github", "secrets_env": "W"}, "webhook.job_id: required"),
        (
            {"scheme": "hmac-sha256", "secrets_env": "W", "job_id": "/j"},
            "webhook.event_id: required",
        ),
        (
            {"scheme": "stripe", "secrets_env": "W", "job_id": "/j", "signature_header": "X-S"},
            "webhook.signature_header: applies only to the hmac-sha256 scheme",
        ),
        (
            {"scheme": "github", "secrets_env": "W", "job_id": "header:bad header"},
            "webhook.job_id: is not a valid header name",
        ),
        (
            {"scheme": "github", "secrets_env": "W", "job_id": "/j", "tolerance_seconds": 1.5},
            "webhook.tolerance_seconds: expected an integer",
        ),
    ],
)
def test_webhook_errors(webhook: dict[str, Any], fragment: str) -> None:
    assert fragment in _inline_error(_with("webhook", webhook), {"W": "s"})


def test_webhook_event_id_defaults_by_scheme() -> None:
    for scheme, expected in [
        ("standard-webhooks", "header:webhook-id"),
        ("github", "header:x-github-delivery"),
        ("stripe", "/id"),
    ]:
        data = _with("webhook", {"scheme": scheme, "secrets_env": "W", "job_id": "/j"})
        webhook = parse_provider("acme", data, INLINE_SOURCE).webhook
        assert webhook is not None and str(webhook.event_id) == expected


@pytest.mark.parametrize(
    ("result", "fragment"),
    [
        (
            {"path": "/jobs/{job_id}/r", "from_status": "/response"},
            "result.from_status: give either path or from_status, not both",
        ),
        ({}, "result.path: fetching by result_ref needs status.result_ref"),
        ({"path": "/r/{job_id}", "required": "/rows"}, "result.required: expected a list"),
        ({"path": "/r/{job_id}", "summary": ["/a"]}, "result.summary: expected a table"),
        ({"path": "/r/{job_id}", "summary": {"n": 1}}, "result.summary.n: expected a JSON pointer"),
        ({"path": "/r/{job_id}", "max_bytes": 0}, "result.max_bytes: must be at least 1"),
        ({"path": "/r/{job_id}", "checksum": "sha256"}, "result.checksum: 'sha256': a JSON"),
        ({"path": "/r/{job_id}", "required": ["status:x"]}, "result.required: 'x': a JSON"),
    ],
)
def test_result_errors(result: dict[str, Any], fragment: str) -> None:
    assert fragment in _inline_error(_with("result", result))


WEBHOOK = {
    "scheme": "standard-webhooks",
    "secrets_env": "ACME_WEBHOOK_SECRETS",
    "job_id": "/data/job_id",
}


def test_webhook_trust_defaults_follow_the_webhook_table() -> None:
    without = parse_provider("acme", MINIMAL, INLINE_SOURCE).polling.trust()
    assert without.mode is TrustMode.OFF
    spec = parse_provider("acme", {**MINIMAL, "webhook": WEBHOOK}, INLINE_SOURCE)
    trust = spec.polling.trust()
    assert trust.mode is TrustMode.ADAPTIVE
    assert (trust.trust_after, trust.distrust_after_misses) == (20, 1)
    assert trust.trusted_max_delay_seconds == 10 * spec.polling.max_delay_seconds
    assert trust.webhook_grace_seconds == 30.0


def test_webhook_trust_keys_are_read() -> None:
    polling = {
        "max_delay_seconds": 60,
        "webhook_trust": "off",
        "trust_after": 5,
        "trusted_max_delay_seconds": 900,
        "distrust_after_misses": 2,
        "webhook_grace_seconds": 0,
    }
    data = {**MINIMAL, "webhook": WEBHOOK, "polling": polling}
    trust = parse_provider("acme", data, INLINE_SOURCE).polling.trust()
    assert (trust.mode, trust.trust_after, trust.distrust_after_misses) == (TrustMode.OFF, 5, 2)
    assert (trust.trusted_max_delay_seconds, trust.webhook_grace_seconds) == (900.0, 0.0)


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("webhook_trust", "always", 'webhook_trust: expected "adaptive" or "off"'),
        ("webhook_trust", 1, "webhook_trust: expected a non-empty string"),
        ("trust_after", 0, "trust_after: must be at least 1"),
        ("distrust_after_misses", 1.5, "distrust_after_misses: expected an integer"),
        ("trusted_max_delay_seconds", 60, "must be at least max_delay_seconds"),
        ("trusted_max_delay_seconds", "long", "expected a number of seconds"),
        ("webhook_grace_seconds", -1, "webhook_grace_seconds: must be 0 or more"),
    ],
)
def test_webhook_trust_value_errors(key: str, value: Any, fragment: str) -> None:
    data = {**MINIMAL, "webhook": WEBHOOK, "polling": {key: value}}
    message = _inline_error(data)
    assert message.startswith(f"{INLINE_SOURCE}: providers.acme.polling.{key}: ")
    assert "\n" not in message
    assert fragment in message


def test_adaptive_trust_needs_a_webhook_table() -> None:
    message = _inline_error({**MINIMAL, "polling": {"webhook_trust": "adaptive"}})
    assert 'polling.webhook_trust: "adaptive" needs a [webhook] table' in message
