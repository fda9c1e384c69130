"""Service settings: typed, defaulted, loaded from TOML and the environment.

Precedence: defaults < ``reconciler.toml`` < ``RECONCILER_<KEY>`` variables
(``RECONCILER_DATABASE_URL``; section keys as ``RECONCILER_SERVER_PORT``).
Every problem is one ``ConfigError`` line naming the file, the key and what
is wrong, so a bad deployment fails at start rather than at the first request.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from reconciler.core.errors import ConfigError

ENV_PREFIX = "RECONCILER_"
CONFIG_ENV = "RECONCILER_CONFIG"
AUDIT_KEY_ENV = "RECONCILER_AUDIT_KEY"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
# Nobody has to create the default providers directory; a configured one must exist.
DEFAULT_PROVIDERS_DIR = "providers"


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


@dataclass(frozen=True)
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = 8080
    max_body_bytes: int = 1_048_576
    create_wait_seconds: float = 0.5  # how long POST /v1/operations waits for the job id
    wait_max_seconds: float = 60.0  # cap on /wait long-polls
    trust_proxy_headers: bool = False
    # The variable holding the bearer token /metrics asks for; empty: /metrics is open.
    metrics_token_env: str = ""
    # Where operators reach the service ("https://reconciler.example"); empty means
    # http://host:port. An https URL makes the console's session cookie Secure.
    public_url: str = ""
    # How long a request waits for the database to take its write before a 503.
    write_wait_seconds: float = 5.0
    # A provider's webhook delivery waits at most this long for its commit, then 503 with
    # Retry-After: below the providers' own client timeouts (5-10 s), so that they see a
    # refusal to retry, never a timeout they may count as a failed delivery.
    webhook_wait_seconds: float = 2.0
    # The front door (enforced by the server's protocol, before the app sees a request).
    max_connections: int = 4096  # open connections; the excess is refused on accept
    max_header_bytes: int = 65_536  # request line and headers together
    max_headers: int = 100
    header_timeout_seconds: float = 10.0  # to receive the request line and headers
    body_timeout_seconds: float = 30.0  # to receive the body once the headers are in
    keep_alive_seconds: float = 5.0  # an idle kept-alive connection is closed after this
    # /mcp requests one token may have open at once (a wait_job holds one for its wait):
    # one agent never reaches max_connections through /mcp.
    mcp_requests_per_agent: int = 16


@dataclass(frozen=True)
class SchedulerSettings:
    tick_seconds: float = 1.0
    lease_seconds: float = 30.0
    batch_size: int = 100
    provider_concurrency: int = 16  # status/create/cancel calls in flight per provider
    enabled: bool = True
    # Status reads overdue by more than this (a restart, a pause) are spread out, not burst.
    catch_up_after_seconds: float = 5.0
    # A step that fails in a way nothing foresaw is tried again after about
    # step_retry_base_seconds, doubling up to step_retry_max_seconds; its
    # step_retry_attempts-th failure in a row escalates internal_error.
    step_retry_base_seconds: float = 1.0
    step_retry_max_seconds: float = 60.0
    step_retry_attempts: int = 5


@dataclass(frozen=True)
class CallbackSettings:
    signing_secret_env: str = "RECONCILER_CALLBACK_SECRET"
    allow_hosts: tuple[str, ...] = ()
    max_attempts: int = 8
    timeout_seconds: float = 10.0
    base_delay_seconds: float = 2.0
    max_delay_seconds: float = 300.0
    max_response_bytes: int = 65_536
    concurrency: int = 32  # callback deliveries in flight, all receiver hosts together
    # Deliveries in flight to one receiver host (at most half of ``concurrency``): a host
    # that hangs holds only these.
    per_host_concurrency: int = 4
    hook_concurrency: int = 16  # hooks in flight, a share apart from the callbacks


@dataclass(frozen=True)
class LimitSettings:
    """Per-agent quotas; 0 switches a count limit off."""

    min_deadline_seconds: float = 1.0  # shorter deadlines would only escalate at once
    max_operations_in_flight: int = 10_000  # per agent: not yet in an end state
    max_creates_per_minute: int = 1_200  # per agent, over a sliding minute
    max_history_page: int = 1_000  # entries per /history page at most


@dataclass(frozen=True)
class ConsoleSettings:
    # The key that signs console sessions; set it to the same value on every replica.
    session_secret_env: str = "RECONCILER_CONSOLE_SECRET"
    session_hours: float = 12.0


@dataclass(frozen=True)
class TelemetrySettings:
    # Where OpenTelemetry traces go over OTLP/HTTP ("http://collector:4318"; spans are sent
    # to its /v1/traces). Empty: the standard OTEL_EXPORTER_OTLP_ENDPOINT, else no tracing.
    otlp_endpoint: str = ""
    service_name: str = "reconciler"
    # Finished spans are sent in batches this often (and the rest when the service stops).
    export_interval_seconds: float = 5.0


@dataclass(frozen=True)
class HookSpec:
    """One configured hook: ``"pkg.mod:fn"``, or ``{ target = "pkg.mod:fn", transactional =
    true }`` for a hook that writes its effects in the transaction recording its step."""

    target: str
    transactional: bool = False


_HOOK_KEYS = frozenset(f.name for f in dataclasses.fields(HookSpec))


def _hook_spec(value: Any, where: str) -> HookSpec:
    if isinstance(value, str):
        return HookSpec(value)
    if not isinstance(value, dict):
        raise ConfigError(
            f"{where}: expected 'pkg.module:function' or a table "
            f"{{ target = ..., transactional = ... }}, got {type(value).__name__}"
        )
    for key in value:
        if key not in _HOOK_KEYS:
            raise ConfigError(
                f"{where}.{key}: unknown key (known: {', '.join(sorted(_HOOK_KEYS))})"
            )
    if "target" not in value:
        raise ConfigError(f"{where}: target is missing; give 'pkg.module:function'")
    target = value["target"]
    if not isinstance(target, str):
        raise ConfigError(f"{where}.target: expected a string, got {type(target).__name__}")
    transactional = value.get("transactional", False)
    if not isinstance(transactional, bool):
        raise ConfigError(f"{where}.transactional: expected true or false, got {transactional!r}")
    return HookSpec(target, transactional)


def _hooks(value: Any, where: str) -> tuple[HookSpec, ...]:
    if isinstance(value, str):  # RECONCILER_HOOKS: comma-separated targets
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, list | tuple):
        raise ConfigError(f"{where}: expected a list, got {type(value).__name__}")
    specs = tuple(_hook_spec(v, f"{where}[{i}]") for i, v in enumerate(value))
    for i, spec in enumerate(specs):
        module, sep, attr = spec.target.partition(":")
        if not sep or not module or not attr:
            raise ConfigError(f"{where}[{i}]: {spec.target!r} must look like 'pkg.module:function'")
    return specs


@dataclass(frozen=True)
class Settings:
    database_url: str = "sqlite:///reconciler.db"
    providers_dir: str = DEFAULT_PROVIDERS_DIR
    hooks: tuple[str | HookSpec, ...] = ()  # read from a file: HookSpec only
    log_level: str = "INFO"
    server: ServerSettings = field(default_factory=ServerSettings)
    scheduler: SchedulerSettings = field(default_factory=SchedulerSettings)
    callbacks: CallbackSettings = field(default_factory=CallbackSettings)
    limits: LimitSettings = field(default_factory=LimitSettings)
    console: ConsoleSettings = field(default_factory=ConsoleSettings)
    telemetry: TelemetrySettings = field(default_factory=TelemetrySettings)
    # Inline [providers.NAME] tables, validated by reconciler.providers.loader.
    providers: Mapping[str, Any] = field(default_factory=dict)
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
            raise ConfigError(
                f"{self.source}: server.metrics_token_env: {variable} is not set; set it, or "
                "leave metrics_token_env empty for an open /metrics"
            )
        return Secret(value)


_SECTIONS = {
    "server": ServerSettings,
    "scheduler": SchedulerSettings,
    "callbacks": CallbackSettings,
    "limits": LimitSettings,
    "console": ConsoleSettings,
    "telemetry": TelemetrySettings,
}
_TOP_LEVEL = {"database_url", "providers_dir", "hooks", "log_level"}


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _as_bool(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
        return value.lower() in _TRUE
    raise ConfigError(f"{where}: expected true or false, got {value!r}")


def _as_number(value: Any, where: str, kind: type[int] | type[float]) -> Any:
    noun = "an integer" if kind is int else "a number"
    if isinstance(value, bool):
        raise ConfigError(f"{where}: expected {noun}, got a boolean")
    if isinstance(value, int) or (kind is float and isinstance(value, float)):
        return kind(value)
    if isinstance(value, str):
        try:
            return kind(value)
        except ValueError:
            pass
    raise ConfigError(f"{where}: expected {noun}, got {value!r}")


def _as_str(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    raise ConfigError(f"{where}: expected a string, got {type(value).__name__}")


def coerce(value: Any, tp: Any, where: str) -> Any:
    """Check or convert one value against a simple type; ``where`` names file and key."""
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return None if value is None else coerce(value, args[0], where)
    if origin is tuple:
        (item_type, _) = typing.get_args(tp)
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where}: expected a list, got {type(value).__name__}")
        return tuple(coerce(v, item_type, f"{where}[{i}]") for i, v in enumerate(value))
    if tp is bool:
        return _as_bool(value, where)
    if tp is int or tp is float:
        return _as_number(value, where, tp)
    if tp is str:
        return _as_str(value, where)
    raise ConfigError(f"{where}: unsupported setting type {_type_name(tp)}")


def _build(cls: type[Any], data: Mapping[str, Any], where: str) -> Any:
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    for key in data:
        if key not in known:
            raise ConfigError(f"{where}.{key}: unknown key (known: {', '.join(sorted(known))})")
    kwargs = {key: coerce(value, hints[key], f"{where}.{key}") for key, value in data.items()}
    return cls(**kwargs)


def _positive(settings: Settings) -> None:
    checks: list[tuple[str, float]] = [
        ("server.port", settings.server.port),
        ("server.max_body_bytes", settings.server.max_body_bytes),
        ("server.wait_max_seconds", settings.server.wait_max_seconds),
        ("server.write_wait_seconds", settings.server.write_wait_seconds),
        ("server.webhook_wait_seconds", settings.server.webhook_wait_seconds),
        ("server.max_connections", settings.server.max_connections),
        ("server.max_header_bytes", settings.server.max_header_bytes),
        ("server.max_headers", settings.server.max_headers),
        ("server.header_timeout_seconds", settings.server.header_timeout_seconds),
        ("server.body_timeout_seconds", settings.server.body_timeout_seconds),
        ("server.keep_alive_seconds", settings.server.keep_alive_seconds),
        ("server.mcp_requests_per_agent", settings.server.mcp_requests_per_agent),
        ("scheduler.tick_seconds", settings.scheduler.tick_seconds),
        ("scheduler.lease_seconds", settings.scheduler.lease_seconds),
        ("scheduler.batch_size", settings.scheduler.batch_size),
        ("scheduler.provider_concurrency", settings.scheduler.provider_concurrency),
        ("callbacks.max_attempts", settings.callbacks.max_attempts),
        ("callbacks.timeout_seconds", settings.callbacks.timeout_seconds),
        ("limits.min_deadline_seconds", settings.limits.min_deadline_seconds),
        ("limits.max_history_page", settings.limits.max_history_page),
        ("console.session_hours", settings.console.session_hours),
        ("callbacks.concurrency", settings.callbacks.concurrency),
        ("callbacks.per_host_concurrency", settings.callbacks.per_host_concurrency),
        ("callbacks.hook_concurrency", settings.callbacks.hook_concurrency),
        ("scheduler.catch_up_after_seconds", settings.scheduler.catch_up_after_seconds),
        ("scheduler.step_retry_base_seconds", settings.scheduler.step_retry_base_seconds),
        ("scheduler.step_retry_max_seconds", settings.scheduler.step_retry_max_seconds),
        ("scheduler.step_retry_attempts", settings.scheduler.step_retry_attempts),
        ("telemetry.export_interval_seconds", settings.telemetry.export_interval_seconds),
    ]
    for key, value in checks:
        if value <= 0:
            raise ConfigError(f"{settings.source}: {key}: must be greater than 0, got {value}")
    for key, count in (
        ("limits.max_operations_in_flight", settings.limits.max_operations_in_flight),
        ("limits.max_creates_per_minute", settings.limits.max_creates_per_minute),
    ):
        if count < 0:
            raise ConfigError(f"{settings.source}: {key}: must be 0 (no limit) or more")
    if settings.server.port > 65535:
        raise ConfigError(f"{settings.source}: server.port: must be at most 65535")
    if settings.log_level.upper() not in LOG_LEVELS:
        raise ConfigError(
            f"{settings.source}: log_level: must be one of {', '.join(LOG_LEVELS)}, "
            f"got {settings.log_level!r}"
        )
    public = urlsplit(settings.server.public_url)
    if settings.server.public_url and not (public.scheme in ("http", "https") and public.netloc):
        raise ConfigError(
            f"{settings.source}: server.public_url: must be an http:// or https:// URL, "
            f"got {settings.server.public_url!r}"
        )
    _check_endpoint(settings)
    if not settings.database_url.startswith(("sqlite", "postgresql")):
        raise ConfigError(
            f"{settings.source}: database_url: must start with sqlite:// or postgresql+psycopg://"
        )


def _check_endpoint(settings: Settings) -> None:
    endpoint = settings.telemetry.otlp_endpoint
    parts = urlsplit(endpoint)
    if endpoint and not (parts.scheme in ("http", "https") and parts.netloc):
        raise ConfigError(
            f"{settings.source}: telemetry.otlp_endpoint: must be an http:// or https:// URL "
            f"of an OTLP/HTTP receiver (like http://collector:4318), got {endpoint!r}"
        )
    if not settings.telemetry.service_name.strip():
        raise ConfigError(f"{settings.source}: telemetry.service_name: must not be empty")


def _env_layer(environ: Mapping[str, str]) -> dict[str, Any]:
    layer: dict[str, Any] = {}
    for key in _TOP_LEVEL:
        env = ENV_PREFIX + key.upper()
        if env in environ:
            layer[key] = environ[env]
    for section, cls in _SECTIONS.items():
        for f in dataclasses.fields(cls):
            env = f"{ENV_PREFIX}{section.upper()}_{f.name.upper()}"
            if env in environ:
                layer.setdefault(section, {})[f.name] = environ[env]
    return layer


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


def _merge_env(data: dict[str, Any], environ: Mapping[str, str]) -> None:
    for section, values in _env_layer(environ).items():
        if isinstance(values, dict):
            merged = dict(data.get(section) or {})
            merged.update(values)
            data[section] = merged
        else:
            data[section] = values


def _typed(data: Mapping[str, Any], where: str) -> dict[str, Any]:
    top: dict[str, Any] = {}
    hints = typing.get_type_hints(Settings)
    for key, value in data.items():
        if key in _SECTIONS:
            if not isinstance(value, dict):
                raise ConfigError(f"{where}: {key}: expected a table")
            top[key] = _build(_SECTIONS[key], value, f"{where}: {key}")
        elif key == "providers":
            if not isinstance(value, dict):
                raise ConfigError(f"{where}: providers: expected a table of provider tables")
            top[key] = value
        elif key == "hooks":
            top[key] = _hooks(value, f"{where}: hooks")
        elif key in _TOP_LEVEL:
            top[key] = coerce(value, hints[key], f"{where}: {key}")
        else:
            known = sorted(_TOP_LEVEL | set(_SECTIONS) | {"providers"})
            raise ConfigError(f"{where}: {key}: unknown key (known: {', '.join(known)})")
    return top


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
    _merge_env(data, env)
    settings = Settings(**_typed(data, source), source=source, base_dir=base_dir)
    _positive(settings)
    return settings
