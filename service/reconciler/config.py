"""Service settings: strict typed models, loaded from TOML and the environment.

Precedence: defaults < ``reconciler.toml`` < ``RECONCILER_<KEY>`` variables
(``RECONCILER_DATABASE_URL``; section keys as ``RECONCILER_SERVER_PORT``).
The models are checked the way provider files are (``core.file_values``): every
number has its bound, an unknown key is refused naming the known ones, and every
problem is one ``ConfigError`` line naming the file, or the variable when the value
came from the environment, then the key and what is wrong, so a bad deployment
fails at start rather than at the first request. A file's values are strict (a
string where a number belongs is an error); a variable's text is converted once,
in ``_from_env``, before the same models check it.

A section is a ``SettingsTable`` and one field of ``Settings``: its variables, its
messages and its place on the configuration page follow from that.
"""

from __future__ import annotations

import os
import tomllib
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar
from urllib.parse import urlsplit

from pydantic import BeforeValidator, PlainValidator, ValidationError, model_validator

from reconciler.core.errors import ConfigError
from reconciler.core.file_values import (
    POSITIVE,
    AnyText,
    Bound,
    Count,
    CountOrZero,
    Flag,
    Seconds,
    SecondsOrZero,
    StrictTable,
    Text,
    any_text,
    config_line,
    first_problem,
    integer,
    number,
    problem,
    text_value,
)

ENV_PREFIX = "RECONCILER_"
CONFIG_ENV = "RECONCILER_CONFIG"
AUDIT_KEY_ENV = "RECONCILER_AUDIT_KEY"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
# Nobody has to create the default providers directory; a configured one must exist.
DEFAULT_PROVIDERS_DIR = "providers"
_PORTS = Bound(1, high=65535)
_MISSING = {"target": "required: give 'pkg.module:function'"}


class Secret:
    """A string that never shows itself in a repr, a log line or a traceback."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('**********')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


def _web_url(what: str) -> PlainValidator:
    """An http(s) URL with a host, or empty for none."""

    def check(value: Any) -> str:
        text = any_text(value)
        parts = urlsplit(text)
        if text and not (parts.scheme in ("http", "https") and parts.netloc):
            raise problem(f"must be an http:// or https:// URL{what}")
        return text

    return PlainValidator(check)


def _log_level(value: Any) -> str:
    if not isinstance(value, str) or value.upper() not in LOG_LEVELS:
        raise problem(f"must be one of {', '.join(LOG_LEVELS)}")
    return value.upper()


def _name(value: Any) -> str:
    if not text_value(value).strip():
        raise problem("must not be blank")
    return str(value)


def _database_url(value: Any) -> str:
    if not text_value(value).startswith(("sqlite", "postgresql")):
        raise problem("must start with sqlite:// or postgresql+psycopg://")
    return str(value)


def _hook_list(value: Any) -> Any:
    """A hook written as its target alone is a table with that target."""
    if not isinstance(value, list | tuple):
        raise problem("expected a list")
    return tuple({"target": v} if isinstance(v, str) else v for v in value)


def _tables(value: Any) -> Mapping[str, Any]:
    # Validated by reconciler.providers.loader, which knows what a provider table holds.
    if not isinstance(value, Mapping):
        raise problem("expected a table of provider tables")
    return value


def _hosts(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise problem("expected a list of host names or CIDRs")
    return tuple(value)


Port = Annotated[int, PlainValidator(integer(_PORTS)), _PORTS]
Hours = Annotated[float, PlainValidator(number(POSITIVE, "hours")), POSITIVE]
_DAYS = Bound(0, high=36_600)
Days = Annotated[float, PlainValidator(number(_DAYS, "days")), _DAYS]
Url = Annotated[str, _web_url("")]
OtlpUrl = Annotated[str, _web_url(" of an OTLP/HTTP receiver (like http://collector:4318)")]
Hosts = Annotated[tuple[str, ...], PlainValidator(_hosts)]
Name = Annotated[str, PlainValidator(_name)]
LogLevel = Annotated[str, PlainValidator(_log_level)]
DatabaseUrl = Annotated[str, PlainValidator(_database_url)]


class SettingsTable(StrictTable):
    """A table of ``reconciler.toml``; every field is a key, and a ``RECONCILER_*`` variable."""


class ServerSettings(SettingsTable):
    host: Text = "127.0.0.1"
    port: Port = 8080
    max_body_bytes: Count = 1_048_576
    create_wait_seconds: SecondsOrZero = 0.5  # how long POST /v1/operations waits for the job id
    wait_max_seconds: Seconds = 60.0  # cap on /wait long-polls
    trust_proxy_headers: Flag = False
    # The variable holding the bearer token /metrics asks for; empty: /metrics is open.
    metrics_token_env: AnyText = ""
    # Where operators reach the service ("https://reconciler.example"); empty means
    # http://host:port. An https URL makes the console's session cookie Secure.
    public_url: Url = ""
    # How long a request waits for the database to take its write before a 503.
    write_wait_seconds: Seconds = 5.0
    # A provider's webhook delivery waits at most this long for its commit, then 503 with
    # Retry-After: below the providers' own client timeouts (5-10 s), so that they see a
    # refusal to retry, never a timeout they may count as a failed delivery.
    webhook_wait_seconds: Seconds = 2.0
    # The front door (enforced by the server's protocol, before the app sees a request).
    max_connections: Count = 4096  # open connections; the excess is refused on accept
    max_header_bytes: Count = 65_536  # request line and headers together
    max_headers: Count = 100
    header_timeout_seconds: Seconds = 10.0  # to receive the request line and headers
    body_timeout_seconds: Seconds = 30.0  # to receive the body once the headers are in
    keep_alive_seconds: Seconds = 5.0  # an idle kept-alive connection is closed after this
    # /mcp requests one token may have open at once (a wait_job holds one for its wait):
    # one agent never reaches max_connections through /mcp.
    mcp_requests_per_agent: Count = 16


class SchedulerSettings(SettingsTable):
    tick_seconds: Seconds = 1.0
    lease_seconds: Seconds = 30.0
    batch_size: Count = 100
    provider_concurrency: Count = 16  # status/create/cancel calls in flight per provider
    enabled: Flag = True
    # Status reads overdue by more than this (a restart, a pause) are spread out, not burst.
    catch_up_after_seconds: Seconds = 5.0
    # A step that fails in a way nothing foresaw is tried again after about
    # step_retry_base_seconds, doubling up to step_retry_max_seconds; its
    # step_retry_attempts-th failure in a row escalates internal_error.
    step_retry_base_seconds: Seconds = 1.0
    step_retry_max_seconds: Seconds = 60.0
    step_retry_attempts: Count = 5

    @model_validator(mode="after")
    def _retry_delays_in_order(self) -> SchedulerSettings:
        if self.step_retry_max_seconds < self.step_retry_base_seconds:
            raise problem("must be at least step_retry_base_seconds", "step_retry_max_seconds")
        return self


class CallbackSettings(SettingsTable):
    signing_secret_env: Text = "RECONCILER_CALLBACK_SECRET"
    allow_hosts: Hosts = ()
    max_attempts: Count = 8
    timeout_seconds: Seconds = 10.0
    base_delay_seconds: Seconds = 2.0
    max_delay_seconds: Seconds = 300.0
    max_response_bytes: CountOrZero = 65_536  # 0: the receiver's answer is not read
    concurrency: Count = 32  # callback deliveries in flight, all receiver hosts together
    # Deliveries in flight to one receiver host (at most half of ``concurrency``): a host
    # that hangs holds only these. Eight, not four: with four, a task that ran the hooks
    # rarely found a slot to start the callback in, and each callback waited for a claim
    # (docs/design.md#shares).
    per_host_concurrency: Count = 8
    hook_concurrency: Count = 16  # hooks in flight, a share apart from the callbacks

    @model_validator(mode="after")
    def _delays_in_order(self) -> CallbackSettings:
        if self.max_delay_seconds < self.base_delay_seconds:
            raise problem("must be at least base_delay_seconds", "max_delay_seconds")
        return self


class LimitSettings(SettingsTable):
    """Per-agent quotas; 0 switches a count limit off."""

    min_deadline_seconds: Seconds = 1.0  # shorter deadlines would only escalate at once
    max_operations_in_flight: CountOrZero = 10_000  # per agent: not yet in an end state
    max_creates_per_minute: CountOrZero = 1_200  # per agent, over a sliding minute
    max_history_page: Count = 1_000  # entries per /history page at most


class ConsoleSettings(SettingsTable):
    # The key that signs console sessions; set it to the same value on every replica.
    session_secret_env: Text = "RECONCILER_CONSOLE_SECRET"
    session_hours: Hours = 12.0


class TelemetrySettings(SettingsTable):
    # Where OpenTelemetry traces go over OTLP/HTTP ("http://collector:4318"; spans are sent
    # to its /v1/traces). Empty: the standard OTEL_EXPORTER_OTLP_ENDPOINT, else no tracing.
    otlp_endpoint: OtlpUrl = ""
    service_name: Name = "reconciler"
    # Finished spans are sent in batches this often (and the rest when the service stops).
    export_interval_seconds: Seconds = 5.0


class RetentionSettings(SettingsTable):
    """How long rows are kept, in days (fractions allowed); 0 keeps forever."""

    # Finished operations (an end state, no decision pending, completion work all settled),
    # with their history, payloads and events.
    operations_days: Days = 30.0
    events_days: Days = 7.0  # webhook events no operation keeps: orphans and ignored types
    # A pruned operation's tombstone, which answers its id and its key's retry with 410.
    tombstones_days: Days = 90.0
    sweep_seconds: Seconds = 60.0  # how often a replica looks for what to prune
    batch_size: Count = 25  # operations (or events) per transaction


class HookSpec(SettingsTable):
    """One configured hook: ``"pkg.mod:fn"``, or ``{ target = "pkg.mod:fn", transactional =
    true }`` for a hook that writes its effects in the transaction recording its step."""

    NOT_A_TABLE: ClassVar[str] = (
        "expected 'pkg.module:function' or a table { target = ..., transactional = ... }"
    )

    target: Text
    transactional: Flag = False

    @model_validator(mode="after")
    def _importable(self) -> HookSpec:
        module, sep, attr = self.target.partition(":")
        if not sep or not module or not attr:
            raise problem("must look like 'pkg.module:function'", "target")
        return self


class Settings(SettingsTable):
    NOT_IN_FILE: ClassVar[frozenset[str]] = frozenset({"source", "base_dir"})

    database_url: DatabaseUrl = "sqlite:///reconciler.db"
    providers_dir: Text = DEFAULT_PROVIDERS_DIR
    # "pkg.mod:fn" or a table; code may give the target alone, as a file may.
    hooks: Annotated[tuple[HookSpec, ...], BeforeValidator(_hook_list)] = ()
    log_level: LogLevel = "INFO"
    server: ServerSettings = ServerSettings()
    scheduler: SchedulerSettings = SchedulerSettings()
    callbacks: CallbackSettings = CallbackSettings()
    limits: LimitSettings = LimitSettings()
    console: ConsoleSettings = ConsoleSettings()
    telemetry: TelemetrySettings = TelemetrySettings()
    retention: RetentionSettings = RetentionSettings()
    # Inline [providers.NAME] tables, validated by reconciler.providers.loader.
    providers: Annotated[Mapping[str, Any], PlainValidator(_tables)] = {}
    # Where the settings came from, for messages and for relative paths.
    source: str = "<defaults>"
    base_dir: str = "."

    def providers_path(self) -> Path:
        path = Path(self.providers_dir)
        return path if path.is_absolute() else Path(self.base_dir) / path

    def public_url(self) -> str:
        """The base URL operators use, without a trailing slash."""
        if self.server.public_url:
            return self.server.public_url.rstrip("/")
        return f"http://{self.server.host}:{self.server.port}"

    def audit_key(self, environ: Mapping[str, str] | None = None) -> Secret | None:
        value = (os.environ if environ is None else environ).get(AUDIT_KEY_ENV)
        return Secret(value) if value else None

    def callback_secret(self, environ: Mapping[str, str] | None = None) -> Secret | None:
        """The service's callback signing key (``whsec_``), from which agents' are derived."""
        value = (os.environ if environ is None else environ).get(self.callbacks.signing_secret_env)
        return Secret(value) if value else None

    def metrics_token(self, environ: Mapping[str, str] | None = None) -> Secret | None:
        """The bearer token /metrics asks for, when ``server.metrics_token_env`` names one."""
        variable = self.server.metrics_token_env
        if not variable:
            return None
        value = (os.environ if environ is None else environ).get(variable)
        if not value:
            raise config_line(
                self.source,
                "server.metrics_token_env",
                f"{variable} is not set; set it, or leave metrics_token_env empty for an open "
                "/metrics",
            )
        return Secret(value)


# --- the settings as keys and variables ----------------------------------------------------


def sections() -> dict[str, type[SettingsTable]]:
    """The ``[section]`` tables of ``reconciler.toml``, by name."""
    found = {}
    for name, field in Settings.model_fields.items():
        kind = field.annotation
        if isinstance(kind, type) and issubclass(kind, SettingsTable):
            found[name] = kind
    return found


def setting_keys() -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every setting a file or a variable may give: its key path and its field."""
    tables = sections()
    for name in Settings.file_keys():
        if name in tables:
            for key in tables[name].file_keys():
                yield (name, key), tables[name].model_fields[key]
        elif name != "providers":  # provider tables have their own files and no variables
            yield (name,), Settings.model_fields[name]


def env_name(key: tuple[str, ...]) -> str:
    return ENV_PREFIX + "_".join(key).upper()


_ENV_WORDS = {"1": True, "true": True, "yes": True, "on": True}
_ENV_WORDS |= {"0": False, "false": False, "no": False, "off": False}


def _from_env(text: str, kind: Any) -> Any:
    """A variable's text as the value its setting holds; text that is not one stays text
    (and the setting's own check then says what it expected)."""
    if kind is bool:
        return _ENV_WORDS.get(text.strip().lower(), text)
    if kind is int or kind is float:
        try:
            return kind(text)
        except ValueError:
            return text
    if typing.get_origin(kind) is tuple:  # comma-separated: allow_hosts, hooks
        return [item.strip() for item in text.split(",") if item.strip()]
    return text


def _read_file(file: Path) -> dict[str, Any]:
    try:
        with file.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{file}: file not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: not valid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read: {exc.strerror}") from None


def _apply_env(data: dict[str, Any], environ: Mapping[str, str]) -> dict[str, str]:
    """Lay the variables over ``data``; the variable each key now comes from."""
    from_env: dict[str, str] = {}
    for key, field in setting_keys():
        variable = env_name(key)
        if variable not in environ:
            continue
        value = _from_env(environ[variable], field.annotation)
        if len(key) == 1:
            data[key[0]] = value
        else:
            table = data.get(key[0])
            data[key[0]] = {**(table if isinstance(table, dict) else {}), key[1]: value}
        from_env[".".join(key)] = variable
    return from_env


def load_settings(
    path: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None
) -> Settings:
    """Read settings from ``path`` (or ``$RECONCILER_CONFIG``), then apply the environment."""
    env = os.environ if environ is None else environ
    chosen = path if path is not None else env.get(CONFIG_ENV)
    data: dict[str, Any] = {}
    source, base_dir = "<defaults>", "."
    if chosen is not None:
        file = Path(chosen)
        source, base_dir = str(file), str(file.parent)
        data = _read_file(file)
    from_env = _apply_env(data, env)
    try:
        settings = Settings.model_validate(data, context={"source": source})
    except ValidationError as exc:
        found = first_problem(exc, _MISSING)
        parts = [p for p in found.parts if isinstance(p, str)]
        variable = from_env.get(".".join(parts[:2])) or from_env.get(".".join(parts[:1]))
        raise found.error(f"env {variable}" if variable else source) from None
    return settings.model_copy(update={"source": source, "base_dir": base_dir})
