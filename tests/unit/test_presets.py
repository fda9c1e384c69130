"""Presets: a provider table merged key by key over a shipped file, then validated like any
other; every shipped preset loads."""

from __future__ import annotations

import textwrap
import tomllib
from pathlib import Path
from typing import Any

import pytest

from reconciler.core.errors import ConfigError
from reconciler.providers.credentials import check_credential
from reconciler.providers.loader import (
    PRESETS_DIR,
    load_providers,
    merge,
    preset_file,
    preset_names,
)
from reconciler.providers.secrets import webhook_secrets
from reconciler.providers.spec import INLINE_SOURCE, ProviderSpec

PRESET = """\
# Example API reference: https://api.example.com/docs (what this preset decides).
base_url = "https://api.example.com"
auth = { type = "bearer", token_env = "EXAMPLE_API_KEY" }
headers = { "example-version" = "2024-01-01" }

[create]
path = "/v1/jobs"
job_id = "/id"
idempotency = "none"
[create.set]
"/metadata/key" = "{idempotency_key}"
"/mode" = "batch"

[lookup]
path = "/v1/jobs?limit=100"
items = "/data"
job_id = "/id"
match = { "/metadata/key" = "{idempotency_key}" }

[status]
path = "/v1/jobs/{job_id}"
state = "/status"

[states]
pending = ["queued", "running"]
success = ["completed"]
failure = ["failed"]

[polling]
deadline_seconds = 600
max_status_requests = 30
"""


@pytest.fixture
def presets(tmp_path: Path) -> Path:
    directory = tmp_path / "presets"
    directory.mkdir()
    (directory / "example.toml").write_text(PRESET)
    (directory / "other.toml").write_text(PRESET.replace("api.example.com", "other.example.com"))
    return directory


def _load(table: dict[str, Any], presets: Path, public_url: str = "") -> ProviderSpec:
    specs = load_providers(
        None, {"mine": table}, {}, check_secrets=False, presets_dir=presets, public_url=public_url
    )
    return specs["mine"]


def _error(table: dict[str, Any], presets: Path) -> str:
    with pytest.raises(ConfigError) as caught:
        _load(table, presets)
    assert "\n" not in caught.value.message
    return caught.value.message


def test_a_preset_alone_is_a_provider(presets: Path) -> None:
    spec = _load({"preset": "example"}, presets)
    assert spec.preset == "example" and spec.source == INLINE_SOURCE
    assert spec.base_url == "https://api.example.com"
    assert spec.headers == (("example-version", "2024-01-01"),)
    assert spec.lookup is not None and spec.lookup.items is not None
    assert spec.polling.deadline_seconds == 600.0


def test_the_users_keys_merge_over_the_preset_key_by_key(presets: Path) -> None:
    table = {
        "preset": "example",
        "base_url": "http://127.0.0.1:9000",
        "create": {"set": {"/mode": "online", "/extra": 1}},
        "states": {"failure": ["failed", "errored"]},
        "polling": {"deadline_seconds": 7200},
        "headers": {"example-beta": "on"},
    }
    spec = _load(table, presets)
    assert spec.base_url == "http://127.0.0.1:9000"
    assert [(r.pointer.text, r.value) for r in spec.create.set] == [
        ("/metadata/key", "{idempotency_key}"),
        ("/mode", "online"),
        ("/extra", 1),
    ]
    assert str(spec.create.job_id) == "/id"  # untouched keys of a merged table stay
    assert spec.states.words(spec.classify({"status": "errored"}).category) == ("failed", "errored")
    assert (spec.polling.deadline_seconds, spec.polling.max_status_requests) == (7200.0, 30)
    assert spec.headers == (("example-version", "2024-01-01"), ("example-beta", "on"))


def test_arrays_and_values_replace_and_a_new_auth_type_replaces_the_table(presets: Path) -> None:
    table = {
        "preset": "example",
        "states": {"pending": ["queued"]},
        "auth": {"type": "header", "name": "X-Example-Key", "value_env": "MINE_KEY"},
    }
    spec = _load(table, presets)
    assert spec.states.category_of("running").value == "unknown"
    assert (spec.auth.header_name, spec.auth.value_env, spec.auth.token_env) == (
        "X-Example-Key",
        "MINE_KEY",
        None,
    )
    same_type = _load({"preset": "example", "auth": {"token_env": "MINE_TOKEN"}}, presets)
    assert (same_type.auth.type.value, same_type.auth.token_env) == ("bearer", "MINE_TOKEN")


def test_merge_replaces_request_schema_whole() -> None:
    base = {"request_schema": {"type": "object", "required": ["a"]}, "x": {"y": 1, "z": 2}}
    over = {"request_schema": {"type": "object"}, "x": {"z": 3}}
    assert merge(base, over) == {"request_schema": {"type": "object"}, "x": {"y": 1, "z": 3}}


def test_unknown_preset_names_the_known_ones(presets: Path) -> None:
    message = _error({"preset": "exampel"}, presets)
    assert message == (
        f"{INLINE_SOURCE}: providers.mine.preset: unknown preset 'exampel' (known: example, other)"
    )
    for name in ("../presets/example", "Example", "example.toml"):
        assert "providers.mine.preset: unknown preset" in _error({"preset": name}, presets)
    assert "providers.mine.preset: expected the name of a preset (known: example, other)" in (
        _error({"preset": 3}, presets)
    )


def test_a_key_not_in_the_schema_names_file_key_and_preset(tmp_path: Path, presets: Path) -> None:
    directory = tmp_path / "providers"
    directory.mkdir()
    file = directory / "mine.toml"
    file.write_text(
        textwrap.dedent(
            """\
            [providers.mine]
            preset = "example"
            [providers.mine.polling]
            deadline_secs = 7200
            """
        )
    )
    with pytest.raises(ConfigError) as caught:
        load_providers(directory, {}, {}, check_secrets=False, presets_dir=presets)
    message = caught.value.message
    assert message.startswith(f"{file}: providers.mine.polling.deadline_secs: unknown key (known")
    assert message.endswith("; preset 'example' has no such key either")


def test_a_bad_value_from_the_preset_says_so(tmp_path: Path) -> None:
    directory = tmp_path / "presets"
    directory.mkdir()
    (directory / "broken.toml").write_text(PRESET.replace('job_id = "/id"', 'job_id = "id"', 1))
    message = _error({"preset": "broken"}, directory)
    assert message == (
        f"{INLINE_SOURCE}: providers.mine.create.job_id: 'id': a JSON pointer is empty or starts "
        "with '/' (the value comes from preset 'broken')"
    )


def test_a_preset_cannot_name_a_preset(tmp_path: Path) -> None:
    directory = tmp_path / "presets"
    directory.mkdir()
    (directory / "chain.toml").write_text('preset = "example"\n' + PRESET)
    message = _error({"preset": "chain"}, directory)
    assert message == f"{directory / 'chain.toml'}: preset: a preset cannot name another preset"


def test_an_unreadable_preset_names_its_file(tmp_path: Path) -> None:
    directory = tmp_path / "presets"
    directory.mkdir()
    (directory / "bad.toml").write_text("[create\n")
    assert _error({"preset": "bad"}, directory).startswith(
        f"{directory / 'bad.toml'}: not valid TOML"
    )


def test_a_preset_using_webhook_url_needs_public_url(tmp_path: Path) -> None:
    directory = tmp_path / "presets"
    directory.mkdir()
    hooked = PRESET.replace('"/mode" = "batch"', '"/webhook" = "{webhook_url}"') + textwrap.dedent(
        """\
        [webhook]
        scheme = "standard-webhooks"
        secrets_env = "EXAMPLE_WEBHOOK_SECRETS"
        job_id = "/data/id"
        """
    )
    (directory / "hooked.toml").write_text(hooked)
    message = _error({"preset": "hooked"}, directory)
    assert 'providers.mine.create.set."/webhook": {webhook_url} needs server.public_url' in message
    assert message.endswith("(the value comes from preset 'hooked')")
    spec = _load({"preset": "hooked"}, directory, public_url="https://svc.example.com")
    assert spec.webhook_url == "https://svc.example.com/webhooks/mine"


# --- the presets the package ships ---------------------------------------------------------

SHIPPED = preset_names()
PUBLIC_URL = "https://reconciler.example.com"


def test_presets_live_in_the_package() -> None:
    assert Path(__file__).parents[2] / "service/reconciler/providers/presets" == PRESETS_DIR
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert (
        "providers/presets/*.toml" in pyproject["tool"]["setuptools"]["package-data"]["reconciler"]
    )


@pytest.mark.parametrize(
    "name",
    SHIPPED or [pytest.param("-", marks=pytest.mark.skip(reason="no preset shipped yet"))],
)
def test_every_shipped_preset_loads(name: str) -> None:
    file = preset_file(name)
    text = file.read_text(encoding="utf-8")
    assert text.startswith("#"), f"{file}: opens with a comment naming the API reference it follows"
    data = tomllib.loads(text)
    assert "providers" not in data, f"{file}: a preset holds one provider table at top level"
    table: dict[str, Any] = {"preset": name}
    if "base_url" not in data:
        table["base_url"] = "http://127.0.0.1:8265"
    specs = load_providers(None, {name: table}, {}, check_secrets=False, public_url=PUBLIC_URL)
    spec = specs[name]
    assert spec.preset == name
    # The variables it names are read from the environment, as any provider's are.
    environ = {"_": "x"}
    if spec.auth.env_key is not None:
        environ[spec.auth.env_key[1]] = "credential"
    if spec.webhook is not None:
        environ[spec.webhook.secrets_env] = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    check_credential(spec.auth, spec.where, environ)  # every variable it names is set
    assert len(webhook_secrets(spec.webhook, spec.where, environ)) == (spec.webhook is not None)
