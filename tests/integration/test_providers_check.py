"""``reconciler providers check``: a provider file tried against a live API over real HTTP.

Against the simulated provider (the sim's own file) and against ``fixtures/runs_api.py``,
whose every call needs a body: each call is printed with its answer and what the file
made of it, the first call the file cannot read ends the check with exit 1, and no
credential is ever printed.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fixtures.runs_api import TOKEN, RunsApi

from reconciler.cli import main
from reconciler.demo.sim import SimConfig, create_app
from reconciler.providers.toml_text import dumps
from tests.support.servers import serve_asgi, unused_port
from tests.support.stack import SIM_TOKEN, sim_provider_table

RUNS_TOML = Path(__file__).parents[2] / "fixtures" / "providers" / "runs.toml"


def _config(tmp_path: Path, name: str, table: dict[str, Any]) -> str:
    """A reconciler.toml with ``table`` inline as ``[providers.NAME]``."""
    files = tmp_path / "providers"
    files.mkdir(exist_ok=True)
    (files / f"{name}.toml").write_text(dumps({"providers": {name: table}}))
    path = tmp_path / "reconciler.toml"
    path.write_text(f'database_url = "sqlite:///{tmp_path}/unused.db"\nproviders_dir = "{files}"\n')
    return str(path)


def _check(
    capsys: pytest.CaptureFixture[str], config: str, *args: str
) -> tuple[int, list[str], str]:
    code = main(["providers", "check", *args, "--config", config])
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


@pytest.fixture
def runs() -> Iterator[tuple[RunsApi, str]]:
    api = RunsApi(finish_after_gets=2)
    with serve_asgi(api.app(), lifespan="off") as url:
        yield api, url


def runs_table(url: str, **cancel: Any) -> dict[str, Any]:
    with RUNS_TOML.open("rb") as fh:
        table: dict[str, Any] = tomllib.load(fh)["providers"]["runs"]
    table["base_url"] = url
    table["cancel"].update(cancel)
    return table


def test_a_real_job_through_every_call_of_a_body_shaped_api(
    tmp_path: Path,
    runs: tuple[RunsApi, str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    api, url = runs
    monkeypatch.setenv("RUNS_TOKEN", TOKEN)
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"task": "export"}))
    config = _config(tmp_path, "runs", runs_table(url))
    code, lines, _ = _check(capsys, config, "runs", "--request", str(request))
    assert code == 0, lines
    calls = [line.split()[0] for line in lines if not line.startswith((" ", "provider", "cred"))]
    assert calls == ["create", "lookup", "status", "status", "result", "verdict:"]
    assert lines[1] == (
        "credential: bearer token from environment variable RUNS_TOKEN (obtained; not shown)"
    )
    assert any(line.startswith("create  POST /api/2.0/runs/submit -> HTTP 200") for line in lines)
    assert "        state /run/state/type = 'RUNNING' -> pending" in lines
    assert "        state /run/state/type = 'SUCCEEDED' -> success" in lines
    assert "        ok: the lookup finds job r-000001 by its idempotency key" in lines
    assert lines[-1] == "verdict: runs: every call read as the file says"
    assert len(api.runs) == 1
    # The existing job, read again: its status and result.
    code, lines, _ = _check(capsys, config, "runs", "--job-id", "r-000001")
    assert code == 0 and "        summary processed = 2" in lines
    code, lines, _ = _check(capsys, config, "runs", "--job-id", "r-404")
    assert code == 0 and "        ok: no such job r-404" in lines[-2]
    assert TOKEN not in capsys.readouterr().out


def test_a_cancel_the_api_refuses_fails_the_check_naming_the_refusal(
    tmp_path: Path,
    runs: tuple[RunsApi, str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, url = runs
    monkeypatch.setenv("RUNS_TOKEN", TOKEN)
    request = tmp_path / "request.json"
    request.write_text("{}")
    # The file forgets the new state the API wants in the cancel's body.
    config = _config(tmp_path, "runs", runs_table(url, set={"/run_id": "{job_id}"}))
    code, lines, _ = _check(capsys, config, "runs", "--request", str(request), "--cancel")
    assert code == 1
    assert lines[-2] == (
        "        FAILED: the provider did not take the cancel (refused): HTTP 422, not an "
        "answer the file reads: state.type is required and must be CANCELLING"
    )
    assert lines[-1].startswith("verdict: runs: a call the file cannot read")


def test_a_refused_credential_stops_at_the_first_call_and_is_never_printed(
    tmp_path: Path,
    runs: tuple[RunsApi, str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, url = runs
    wrong = "sk-live-wrong-credential-0123456789"
    monkeypatch.setenv("RUNS_TOKEN", wrong)
    config = _config(tmp_path, "runs", runs_table(url))
    code, lines, err = _check(capsys, config, "runs", "--job-id", "r-000001")
    assert code == 1
    assert lines[-2].endswith("FAILED: HTTP 401, the provider refused this credential: bad token")
    assert wrong not in "\n".join(lines) + err


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["nope", "--job-id", "x"], "no provider named 'nope' here (configured: runs)"),
        (["runs", "--job-id", "x", "--cancel"], "--cancel needs --request"),
        (["runs", "--request", "/no/such/file"], "--request: cannot read /no/such/file"),
    ],
)
def test_bad_arguments_are_one_line_naming_what_to_fix(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    fragment: str,
) -> None:
    monkeypatch.setenv("RUNS_TOKEN", TOKEN)
    config = _config(tmp_path, "runs", runs_table("http://127.0.0.1:9"))
    code, lines, err = _check(capsys, config, *args)
    assert code == 1 and not lines
    assert err.startswith("reconciler: ") and fragment in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ('{"task": "a", "task": "b"}', "member name 'task' appears twice in one object"),
        ('{"client_token": "mine"}', "--request: 'request' may not hold /client_token"),
        ("x" * 2048, "is larger than 1024 bytes"),
    ],
)
def test_a_request_file_is_refused_as_intake_refuses_an_agents(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    body: str,
    fragment: str,
) -> None:
    monkeypatch.setenv("RUNS_TOKEN", TOKEN)
    request = tmp_path / "request.json"
    request.write_text(body)
    config = _config(tmp_path, "runs", runs_table("http://127.0.0.1:9"))
    with open(config, "a", encoding="utf-8") as fh:
        fh.write("\n[server]\nmax_body_bytes = 1024\n")
    code, lines, err = _check(capsys, config, "runs", "--request", str(request))
    assert code == 1 and not lines
    assert err.startswith("reconciler: ") and fragment in err and err.count("\n") == 1


def test_the_simulated_provider_checks_clean_with_its_own_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SIM_TOKEN", SIM_TOKEN)
    monkeypatch.setenv("SIM_WEBHOOK_SECRETS", "whsec_" + "A" * 32)
    with serve_asgi(create_app(SimConfig(token=SIM_TOKEN)), lifespan="off") as url:
        config = _config(tmp_path, "sim", sim_provider_table(url))
        request = tmp_path / "request.json"
        request.write_text(json.dumps({"scenario": "success", "duration": 0.3}))
        code, lines, _ = _check(capsys, config, "sim", "--request", str(request))
        assert code == 0, lines
        assert "        state /state = 'succeeded' -> success" in lines
        assert lines[-1] == "verdict: sim: every call read as the file says"
        assert SIM_TOKEN not in "\n".join(lines)


def test_a_credential_that_cannot_be_obtained_stops_before_any_call(
    tmp_path: Path,
    runs: tuple[RunsApi, str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    api, url = runs
    monkeypatch.setenv("RUNS_CLIENT_ID", "client")
    monkeypatch.setenv("RUNS_CLIENT_SECRET", "client-secret-never-printed")
    table = runs_table(url)
    table["auth"] = {
        "type": "oauth2",
        "token_url": f"http://127.0.0.1:{unused_port()}/token",
        "client_id_env": "RUNS_CLIENT_ID",
        "client_secret_env": "RUNS_CLIENT_SECRET",
    }
    code, lines, err = _check(capsys, _config(tmp_path, "runs", table), "runs", "--job-id", "r-1")
    assert code == 1 and sum(api.calls.values()) == 0
    assert lines[1].startswith("credential: OAuth2 client credentials from http://127.0.0.1:")
    assert "FAILED: the credential could not be obtained: the token endpoint" in lines[2]
    assert "gave no answer (ConnectError)" in lines[2]
    assert "client-secret-never-printed" not in "\n".join(lines) + err
