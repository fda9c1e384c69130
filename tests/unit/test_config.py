"""Settings: defaults, file, environment, and one-line errors naming file and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.config import HookSpec, Secret, Settings, load_settings
from reconciler.core.errors import ConfigError


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
    assert settings.hooks == (HookSpec("a.b:c"),)
    assert settings.callbacks.allow_hosts == ("127.0.0.1",)
    assert settings.providers_path() == tmp_path / "providers"


def test_config_env_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "r.toml"
    path.write_text("[server]\nport = 1234\n")
    assert load_settings(None, environ={"RECONCILER_CONFIG": str(path)}).server.port == 1234


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[server]\nport = "eighty"\n', "server.port: expected an integer, got 'eighty'"),
        ("[server]\nport = 0\n", "server.port: must be greater than 0"),
        ("[server]\nport = 70000\n", "server.port: must be at most 65535"),
        ("[server]\nprot = 1\n", "server.prot: unknown key"),
        ("colour = 1\n", "colour: unknown key"),
        ("server = 3\n", "server: expected a table"),
        ("[scheduler]\ntick_seconds = true\n", "scheduler.tick_seconds: expected a number"),
        ("hooks = 5\n", "hooks: expected a list"),
        ("hooks = [5]\n", "hooks[0]: expected 'pkg.module:function' or a table"),
        ('hooks = ["nocolon"]\n', "hooks[0]: 'nocolon' must look like 'pkg.module:function'"),
        ('hooks = [{ target = "a.b:c", once = true }]\n', "hooks[0].once: unknown key"),
        ("hooks = [{ transactional = true }]\n", "hooks[0]: target is missing"),
        ("hooks = [{ target = 3 }]\n", "hooks[0].target: expected a string"),
        ('hooks = [{ target = "a.b" }]\n', "hooks[0]: 'a.b' must look like"),
        (
            'hooks = [{ target = "a.b:c", transactional = "yes" }]\n',
            "hooks[0].transactional: expected true or false, got 'yes'",
        ),
        (
            "[callbacks]\nper_host_concurrency = 0\n",
            "callbacks.per_host_concurrency: must be greater than 0",
        ),
        ("[callbacks]\nhook_concurrency = 0\n", "callbacks.hook_concurrency: must be greater"),
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
    assert message.startswith(str(path))
    assert expected in message
    assert "\n" not in message


def test_hooks_plain_and_transactional(tmp_path: Path) -> None:
    path = tmp_path / "reconciler.toml"
    path.write_text(
        'hooks = ["a.b:c", { target = "d.e:f", transactional = true }, { target = "g:h" }]\n'
    )
    settings = load_settings(path, environ={})
    assert settings.hooks == (
        HookSpec("a.b:c"),
        HookSpec("d.e:f", transactional=True),
        HookSpec("g:h"),
    )
    from_env = load_settings(None, environ={"RECONCILER_HOOKS": "a.b:c, d:e"})
    assert from_env.hooks == (HookSpec("a.b:c"), HookSpec("d:e"))


def test_bad_environment_value_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="scheduler.batch_size: expected an integer"):
        load_settings(None, environ={"RECONCILER_SCHEDULER_BATCH_SIZE": "lots"})


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
