"""deploy/local-replicas.sh: a real PostgreSQL, the simulated provider and two replicas.

Starts the topology, checks both replicas are alive and ready and really share one
database (an operation made through one is finished and read through the other),
then stops it and checks that every process it started is gone.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path

import pytest

from tests.support import loopback

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "local-replicas.sh"
FALLBACK_PGBIN = Path("/usr/lib/postgresql/15/bin")
START_TIMEOUT = 75
STOP_TIMEOUT = 40


def _initdb() -> str | None:
    found = shutil.which("initdb")
    if found:
        return found
    candidate = FALLBACK_PGBIN / "initdb"
    return str(candidate) if candidate.exists() else None


def _postgres_user_missing() -> bool:
    if os.geteuid() != 0:
        return False
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return True
    return False


pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(START_TIMEOUT + STOP_TIMEOUT + 30),
    pytest.mark.skipif(_initdb() is None, reason="PostgreSQL binaries (initdb) not found"),
    pytest.mark.skipif(
        _postgres_user_missing(), reason="running as root needs a 'postgres' user for PostgreSQL"
    ),
]


def _alive(pid: int) -> bool:
    """Exists and is not a zombie (an orphan may stay unreaped under some init processes)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _read_state(path: Path) -> dict[str, str]:
    state: dict[str, str] = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep:
            state[key] = value
    return state


def _env(state_dir: Path) -> dict[str, str]:
    # The run makes its own settings; a developer's RECONCILER_* must not leak in.
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECONCILER_")}
    env.update(STATE_DIR=str(state_dir), READY_TIMEOUT="45", STOP_TIMEOUT="10")
    return env


def _run(args: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT, check=False
    )


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[tuple[dict[str, str], dict[str, str]]]:
    """Starts the topology; yields (state, environment) and always stops it."""
    state_dir = tmp_path / "state"
    env = _env(state_dir)
    try:
        started = _run([str(SCRIPT), "start"], env, START_TIMEOUT)
        assert started.returncode == 0, f"start failed:\n{started.stdout}\n{started.stderr}"
        yield _read_state(state_dir / "replicas.env"), env
    finally:
        with suppress(subprocess.TimeoutExpired):
            _run([str(SCRIPT), "stop"], env, STOP_TIMEOUT)


def _operator_token(state: dict[str, str], env: dict[str, str]) -> str:
    secrets = _read_state(Path(state["ENV_FILE"]))
    made = _run(
        [
            str(ROOT / ".venv" / "bin" / "reconciler")
            if (ROOT / ".venv" / "bin" / "reconciler").exists()
            else "reconciler",
            "tokens",
            "create",
            "--name",
            "replicas-test",
            "--scope",
            "operator",
            "--config",
            str(Path(state["RUN_DIR"]) / "reconciler.toml"),
        ],
        {**env, **secrets},
        30,
    )
    assert made.returncode == 0, made.stderr
    return made.stdout.strip()


def test_two_replicas_share_one_database_and_stop_cleanly(
    replicas: tuple[dict[str, str], dict[str, str]],
) -> None:
    state, env = replicas
    urls = [state["REPLICA_1_URL"], state["REPLICA_2_URL"]]
    assert len(set(urls)) == 2
    assert all(url.startswith("http://127.0.0.1:") for url in [*urls, state["SIM_URL"]])
    for url in urls:
        assert loopback.get(f"{url}/healthz", timeout=5).status_code == 200
        ready = loopback.get(f"{url}/readyz", timeout=5)
        assert ready.status_code == 200, ready.text

    # One database: what one replica writes, the other reads and finishes.
    headers = {"Authorization": f"Bearer {_operator_token(state, env)}"}
    created = loopback.post(
        f"{urls[0]}/v1/operations",
        json={"provider": "sim", "request": {"rows": 3}},
        headers=headers,
        timeout=10,
    )
    assert created.status_code == 202, created.text
    op_id = created.json()["id"]
    waited = loopback.get(
        f"{urls[1]}/v1/operations/{op_id}/wait",
        params={"timeout_seconds": 30},
        headers=headers,
        timeout=40,
    )
    assert waited.status_code == 200, waited.text
    assert waited.json()["state"] == "succeeded", waited.text

    pids = [int(state[key]) for key in ("PG_PID", "SIM_PID", "REPLICA_1_PID", "REPLICA_2_PID")]
    assert all(_alive(pid) for pid in pids)
    stopped = _run([str(SCRIPT), "stop"], env, STOP_TIMEOUT)
    assert stopped.returncode == 0, stopped.stderr
    assert [pid for pid in pids if _alive(pid)] == []
    assert not Path(state["RUN_DIR"]).exists()
    assert not Path(state["PG_ROOT"]).exists()
    assert not (Path(env["STATE_DIR"]) / "replicas.env").exists()
