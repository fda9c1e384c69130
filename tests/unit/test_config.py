"""Settings: defaults, file, environment, and one-line errors naming file or variable, and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.config import HookSpec, Secret, Settings, env_name, load_settings, setting_keys
from reconciler.core.errors import ConfigError
from reconciler.core.file_values import Bound, bound_of


def test_defaults_need_no_file() -> None:
    settings = load_settings(None, environ={})
    assert settings == Settings()
    assert settings.database_url == "sqlite:///reconciler.db"
    assert settings.scheduler.tick_seconds == 1.0
    assert settings.callbacks.max_attempts == 8


def test_file_then_environment(tmp_path: Path) -> None:
    path = tmp_path / "reconciler.toml"
    path.write_text(
        'database_url = "sqlite:///x.db"\nhooks = ["a.b:c"]\n'
        '[server]\nport = 9001\n[callbacks]\nallow_hosts = ["127.0.0.1"]\n'
    )
    settings = load_settings(
        path,
        environ={
            "RECONCILER_DATABASE_URL": "postgresql+psycopg://u@h/db",
            "RECONCILER_SERVER_HOST": "0.0.0.0",
            "RECONCILER_SCHEDULER_TICK_SECONDS": "0.25",
            "RECONCILER_CALLBACK_SECRET": "whsec_not_a_setting",
        },
    )
    assert settings.database_url == "postgresql+psycopg://u@h/db"
    assert settings.server.port == 9001
    assert settings.server.host == "0.0.0.0"
    assert settings.scheduler.tick_seconds == 0.25
    assert settings.hooks == (HookSpec(target="a.b:c"),)
    assert settings.callbacks.allow_hosts == ("127.0.0.1",)
    assert settings.providers_path() == tmp_path / "providers"


def test_config_env_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "r.toml"
    path.write_text("[server]\nport = 1234\n")
    assert load_settings(None, environ={"RECONCILER_CONFIG": str(path)}).server.port == 1234


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[server]\nport = "eighty"\n', "server.port: expected an integer"),
        ('[server]\nport = "8080"\n', "server.port: expected an integer"),
        ("[server]\nport = 0\n", "server.port: must be at least 1"),
        ("[server]\nport = 70000\n", "server.port: must be at most 65535"),
        ("[server]\nprot = 1\n", "server.prot: unknown key"),
        ("colour = 1\n", "colour: unknown key"),
        ('source = "elsewhere"\n', "source: unknown key"),
        ("server = 3\n", "server: expected a table"),
        ("[scheduler]\ntick_seconds = true\n", "scheduler.tick_seconds: expected a number"),
        ('[scheduler]\nenabled = "no"\n', "scheduler.enabled: expected true or false"),
        ("[callbacks]\nallow_hosts = [1]\n", "callbacks.allow_hosts: expected a list of host"),
        (
            "[callbacks]\nbase_delay_seconds = 10\nmax_delay_seconds = 5\n",
            "callbacks.max_delay_seconds: must be at least base_delay_seconds",
        ),
        ("hooks = 5\n", "hooks: expected a list"),
        ("hooks = [5]\n", "hooks[0]: expected 'pkg.module:function' or a table"),
        ('hooks = ["nocolon"]\n', "hooks[0].target: must look like 'pkg.module:function'"),
        ('hooks = [{ target = "a.b:c", once = true }]\n', "hooks[0].once: unknown key"),
        ("hooks = [{ transactional = true }]\n", "hooks[0].target: required"),
        ("hooks = [{ target = 3 }]\n", "hooks[0].target: expected a non-empty string"),
        ('hooks = [{ target = "a.b" }]\n', "hooks[0].target: must look like"),
        (
            'hooks = [{ target = "a.b:c", transactional = "yes" }]\n',
            "hooks[0].transactional: expected true or false",
        ),
        ('log_level = "loud"\n', "log_level: must be one of DEBUG"),
        ('[server]\npublic_url = "reconciler.example"\n', "server.public_url: must be an http"),
        ('[telemetry]\notlp_endpoint = "collector"\n', "telemetry.otlp_endpoint: must be an"),
        ('[telemetry]\nservice_name = " "\n', "telemetry.service_name: must not be blank"),
        ("providers = 3\n", "providers: expected a table of provider tables"),
        ('database_url = "mysql://x"\n', "database_url: must start with sqlite://"),
        ("[server\n", "not valid TOML"),
    ],
)
def test_bad_values_fail_with_file_and_key(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_settings(path, environ={})
    message = info.value.message
    assert message.startswith(f"{path}: ")
    assert expected in message
    assert "\n" not in message


def test_hooks_plain_and_transactional(tmp_path: Path) -> None:
    path = tmp_path / "reconciler.toml"
    path.write_text(
        'hooks = ["a.b:c", { target = "d.e:f", transactional = true }, { target = "g:h" }]\n'
    )
    settings = load_settings(path, environ={})
    assert settings.hooks == (
        HookSpec(target="a.b:c"),
        HookSpec(target="d.e:f", transactional=True),
        HookSpec(target="g:h"),
    )
    from_env = load_settings(None, environ={"RECONCILER_HOOKS": "a.b:c, d:e"})
    assert from_env.hooks == (HookSpec(target="a.b:c"), HookSpec(target="d:e"))


def test_bad_environment_value_is_named_by_its_variable(tmp_path: Path) -> None:
    path = tmp_path / "reconciler.toml"
    path.write_text("[scheduler]\ntick_seconds = 2\n")
    with pytest.raises(ConfigError) as info:
        load_settings(path, environ={"RECONCILER_SCHEDULER_BATCH_SIZE": "lots"})
    assert info.value.message == (
        "env RECONCILER_SCHEDULER_BATCH_SIZE: scheduler.batch_size: expected an integer"
    )
    with pytest.raises(ConfigError, match="^env RECONCILER_HOOKS: hooks\\[1\\].target: must"):
        load_settings(None, environ={"RECONCILER_HOOKS": "a.b:c, nocolon"})


def test_environment_text_becomes_the_settings_type() -> None:
    settings = load_settings(
        None,
        environ={
            "RECONCILER_SERVER_PORT": "9002",
            "RECONCILER_SERVER_WAIT_MAX_SECONDS": "1e2",
            "RECONCILER_SCHEDULER_ENABLED": "off",
            "RECONCILER_SERVER_TRUST_PROXY_HEADERS": "Yes",
            "RECONCILER_CALLBACKS_ALLOW_HOSTS": "10.0.0.0/8, hooks.example",
            "RECONCILER_LOG_LEVEL": "debug",
        },
    )
    assert settings.server.port == 9002
    assert settings.server.wait_max_seconds == 100.0
    assert settings.scheduler.enabled is False
    assert settings.server.trust_proxy_headers is True
    assert settings.callbacks.allow_hosts == ("10.0.0.0/8", "hooks.example")
    assert settings.log_level == "DEBUG"


@pytest.mark.parametrize("text", ["maybe", "2"])
def test_a_flag_from_the_environment_is_a_yes_or_a_no(text: str) -> None:
    with pytest.raises(ConfigError, match="scheduler.enabled: expected true or false"):
        load_settings(None, environ={"RECONCILER_SCHEDULER_ENABLED": text})


def test_code_gives_a_hook_by_its_target_alone() -> None:
    assert Settings(hooks=("a.b:c",)).hooks == (HookSpec(target="a.b:c"),)


# --- every number has its bound ----------------------------------------------------------


def _numeric() -> list[tuple[str, Bound]]:
    found = []
    for key, field in setting_keys():
        if field.annotation in (int, float):
            bound = bound_of(field.metadata)
            assert bound is not None, f"{'.'.join(key)} is a number without a bound"
            found.append((".".join(key), bound))
    return found


NUMERIC = _numeric()


def test_every_numeric_setting_is_found() -> None:
    # An empty or partial scan would let the tests below pass without checking anything.
    keys = {key for key, _ in NUMERIC}
    assert len(keys) >= 32
    assert {"server.port", "callbacks.max_response_bytes", "limits.max_creates_per_minute"} <= keys


def _refusal(key: str, value: str, in_file: bool, tmp_path: Path) -> str:
    section, _, name = key.rpartition(".")
    environ: dict[str, str] = {}
    path = None
    if in_file:
        path = tmp_path / "reconciler.toml"
        path.write_text(f"[{section}]\n{name} = {value}\n" if section else f"{name} = {value}\n")
    else:
        environ[env_name(tuple(key.split(".")))] = value
    with pytest.raises(ConfigError) as info:
        load_settings(path, environ=environ)
    return info.value.message


@pytest.mark.parametrize("in_file", [True, False], ids=["file", "env"])
@pytest.mark.parametrize(("key", "bound"), NUMERIC, ids=[key for key, _ in NUMERIC])
def test_a_negative_number_is_refused_naming_its_key(
    key: str, bound: Bound, in_file: bool, tmp_path: Path
) -> None:
    variable = env_name(tuple(key.split(".")))
    source = str(tmp_path / "reconciler.toml") if in_file else f"env {variable}"
    message = _refusal(key, "-1", in_file, tmp_path)
    assert message.startswith(f"{source}: {key}: must be ")
    assert "\n" not in message


@pytest.mark.parametrize("in_file", [True, False], ids=["file", "env"])
@pytest.mark.parametrize(("key", "bound"), NUMERIC, ids=[key for key, _ in NUMERIC])
def test_zero_is_refused_where_it_means_nothing(
    key: str, bound: Bound, in_file: bool, tmp_path: Path
) -> None:
    if bound.problem(0, whole=True) is None:  # 0 switches it off: a value like any other
        section, _, name = key.rpartition(".")
        variable = env_name(tuple(key.split(".")))
        settings = load_settings(None, environ={variable: "0"})
        assert getattr(getattr(settings, section) if section else settings, name) == 0
        return
    message = _refusal(key, "0", in_file, tmp_path)
    assert f": {key}: must be " in message
    assert message.startswith(f"env {env_name(tuple(key.split('.')))}: ") != in_file


def test_the_settings_where_zero_switches_off() -> None:
    zero_ok = {key for key, bound in NUMERIC if bound.problem(0, whole=True) is None}
    assert zero_ok == {
        "server.create_wait_seconds",
        "callbacks.max_response_bytes",
        "limits.max_operations_in_flight",
        "limits.max_creates_per_minute",
        "retention.operations_days",
        "retention.events_days",
        "retention.tombstones_days",
    }


def test_missing_file() -> None:
    with pytest.raises(ConfigError, match="nope.toml: file not found"):
        load_settings("nope.toml", environ={})


def test_secret_never_shows_itself() -> None:
    secret = Secret("whsec_supersecret")
    assert "supersecret" not in repr(secret)
    assert "supersecret" not in str(secret)
    assert "supersecret" not in f"{secret}"
    assert secret.reveal() == "whsec_supersecret"


def test_bad_log_level_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="log_level: must be one of DEBUG"):
        load_settings(None, environ={"RECONCILER_LOG_LEVEL": "bogus"})
