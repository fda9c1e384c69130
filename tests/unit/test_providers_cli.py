"""``reconciler providers list|show``: one line per provider and preset; the merged table as
TOML, credentials only as the names of their variables."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from reconciler.cli import main
from reconciler.providers import loader

PRESET = """\
# Example Jobs API, https://api.example.com/docs: states, idempotency, results.
base_url = "https://api.example.com"
auth = { type = "bearer", token_env = "EXAMPLE_API_KEY" }

[create]
path = "/v1/jobs"
job_id = "/id"
idempotency = "none"

[status]
path = "/v1/jobs/{job_id}"
state = "/status"

[states]
pending = ["running"]
success = ["done"]

[polling]
deadline_seconds = 600
max_status_requests = 30
"""

FILES = """\
[providers.mine]
preset = "example"
description = "Nightly exports.\\nSecond line."
[providers.mine.auth]
token_env = "MINE_TOKEN"
[providers.mine.polling]
deadline_seconds = 7200

[providers.plain]
base_url = "http://127.0.0.1:9000"
auth = { type = "header", name = "X-Api-Key", value_env = "PLAIN_KEY" }
[providers.plain.create]
path = "/jobs"
job_id = "/id"
idempotency_header = "Idempotency-Key"
[providers.plain.status]
path = "/jobs/{job_id}"
state = "/state"
[providers.plain.states]
success = ["done"]
"""


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    presets = tmp_path / "presets"
    presets.mkdir()
    (presets / "example.toml").write_text(PRESET)
    monkeypatch.setattr(loader, "PRESETS_DIR", presets)
    providers = tmp_path / "providers"
    providers.mkdir()
    (providers / "mine.toml").write_text(FILES)
    file = tmp_path / "reconciler.toml"
    file.write_text('providers_dir = "providers"\n')
    # Listing and showing call no provider: no credential needs to be set.
    for name in ("MINE_TOKEN", "PLAIN_KEY", "EXAMPLE_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    return file


def test_list_names_what_each_provider_and_preset_is(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["providers", "list", "--config", str(config)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("\t") for line in lines] == [
        ["mine", "preset example", "https://api.example.com", "Nightly exports."],
        ["plain", "file", "http://127.0.0.1:9000", ""],
        [
            "example",
            "shipped preset",
            "https://api.example.com",
            "Example Jobs API, https://api.example.com/docs: states, idempotency, results.",
        ],
    ]


def test_show_prints_the_merged_table_as_toml(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["providers", "show", "mine", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == (
        f"# mine: from {config.parent / 'providers' / 'mine.toml'}, merged over preset example "
        f"({config.parent / 'presets' / 'example.toml'})"
    )
    table = tomllib.loads(out)["providers"]["mine"]
    assert table["preset"] == "example"
    assert table["auth"] == {"type": "bearer", "token_env": "MINE_TOKEN"}
    assert table["polling"] == {"deadline_seconds": 7200, "max_status_requests": 30}
    assert table["create"] == {"path": "/v1/jobs", "job_id": "/id", "idempotency": "none"}
    assert table["base_url"] == "https://api.example.com"


def test_show_of_a_preset_not_configured(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["providers", "show", "example", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# preset example (")
    assert tomllib.loads(out) == tomllib.loads(PRESET)


def test_show_of_an_unknown_name_says_what_exists(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["providers", "show", "nope", "--config", str(config)]) == 1
    assert capsys.readouterr().err == (
        "reconciler: no provider or preset named 'nope' (configured: mine, plain; "
        "presets: example)\n"
    )


def test_a_broken_file_is_one_line_and_nothing_is_shown(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    providers = config.parent / "providers" / "mine.toml"
    providers.write_text(
        FILES.replace("[providers.plain.auth]", "").replace(
            'auth = { type = "header", name = "X-Api-Key", value_env = "PLAIN_KEY" }',
            'auth = { type = "header", name = "X-Api-Key", value = "k-abc123" }',
        )
    )
    for command in (["list"], ["show", "plain"]):
        assert main(["providers", *command, "--config", str(config)]) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        assert captured.err == (
            f"reconciler: {providers}: providers.plain.auth.value: secrets may not be written in "
            "provider files; put the value in an environment variable and name it with "
            "value_env\n"
        )


def test_the_command_runs_as_a_program(tmp_path: Path) -> None:
    file = tmp_path / "reconciler.toml"
    file.write_text('providers_dir = "providers"\n')
    (tmp_path / "providers").mkdir()
    (tmp_path / "providers" / "plain.toml").write_text(
        textwrap.dedent(FILES[FILES.index("[providers.plain]") :])
    )
    done = subprocess.run(
        [sys.executable, "-m", "reconciler", "providers", "list", "--config", str(file)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "plain\tfile\thttp://127.0.0.1:9000\t"
